"""Class labels in the networks (MLP, LocalMLP, UNet) and in ``NetworkScore`` (issue 36).

* ``num_classes=0`` leaves a network as it was before labels existed: the parameter paths,
  shapes and dtypes, the initial values for a seed and the forward pass are those of revision
  d2ddd80 (recorded in ``BEFORE`` with that revision's code; the UNet's structure only), so
  unconditional runs and checkpoints load and behave as before.
* The null label ``K`` is the zero embedding: the output equals ``labels=None`` and equals the
  unconditional network holding the same weights.
* Labels are per example: ``NetworkScore`` with a scalar time (its per-example ``vmap`` path)
  equals a ``[batch]`` time (the batched path), each example alone, and no example depends on
  another's label.
"""

from __future__ import annotations

import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.nets import MLP, LocalMLP, UNet
from scorelib.processes import VP
from scorelib.scores import Labels
from scorelib.scores.network import NetworkScore

K = 3
LABELS = np.array([0, 1, 2, K, 0, 2, 1])  # the null label among them
C_NOISE = np.array([-1.0, 0.5, 1.2, -0.3, 0.1, 0.9, -0.7])  # both sides of LocalMLP's c_local
# network name -> (constructor of the class given, data shape); tiny sizes, seed 3 unless
# other rngs are given
NETS = {
    "MLP": (
        lambda cls, rngs=None, **kw: cls(
            (3,), width=8, depth=2, emb_dim=4, norm="layer", skip="affine",
            rngs=rngs or nnx.Rngs(3), **kw,
        ),
        (3,),
    ),
    "LocalMLP": (
        lambda cls, rngs=None, **kw: cls(
            (4, 4, 1), width=8, depth=1, emb_dim=4, local_width=8, local_depth=1,
            rngs=rngs or nnx.Rngs(3), **kw,
        ),
        (4, 4, 1),
    ),
    "UNet": (
        lambda cls, rngs=None, **kw: cls(
            (4, 4, 1), channels=4, channel_mult=(1,), num_res_blocks=1, attn_resolutions=(),
            num_groups=1, emb_dim=8, dropout=0.0, rngs=rngs or nnx.Rngs(3), **kw,
        ),
        (4, 4, 1),
    ),
}  # fmt: skip
CLASSES = {"MLP": MLP, "LocalMLP": LocalMLP, "UNet": UNet}
# the UNet's compiled forward passes take over 5 s on 2 idle cores: `make test` only
SLOW_UNET = ["MLP", "LocalMLP", pytest.param("UNet", marks=pytest.mark.slow)]

# Recorded with the networks of revision d2ddd80 (before labels), by these helpers run on
# that revision's scorelib/nets/{mlp,local,unet}.py: structure = sha256 of the parameters'
# "path:shape:dtype" lines; values = fingerprint(); forward = forward_checksum().
BEFORE = {
    "MLP": dict(
        structure="78681f6557f6ef9bae552de7a21e19c957a015d00cbefc2e631f6422b40d09c5",
        values=(-35.59854156640358, 50.12497755808185, 347),
        forward=(-2.5898509845137596, 0.13191471017452894),
    ),
    "LocalMLP": dict(
        structure="e550f0bb421bd921486d17d365612274f04fdc018dd4d837758e92c48981c01e",
        values=(-63.65164785232628, -54.09640411299081, 725),
        forward=(5.002500394824892, 0.06584902849183938),
    ),
    "UNet": dict(
        structure="38315bc8a14828f37948da368565eb0004910052e37378f14ee4c79f7c913ff2",
        # values=(57.408277650991295, 3.226423954733214, 2613) and
        # forward=(5.619600430130959, -0.3784824918248705) too, not tested: initialising
        # the UNet costs 4 s of compilation, and it creates its label map exactly as the MLP
        # (label_embedding, no draw for num_classes = 0)
    ),
}


def build(name, abstract=False, **kw):
    """The network ``name`` of :data:`NETS`; with ``abstract``, its shapes only where
    ``nnx.eval_shape`` can build it (the UNet: initialising it costs seconds; LocalMLP reads a
    concrete threshold at construction)."""
    make = NETS[name][0]
    if abstract and name == "UNet":
        return nnx.eval_shape(lambda: make(CLASSES[name], **kw))
    return make(CLASSES[name], **kw)


def param_leaves(model) -> list[tuple[str, object]]:
    """``(path, leaf)`` of the model's parameters, in pytree order."""
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    return [(jax.tree_util.keystr(p), v) for p, v in flat]


def structure(model) -> str:
    """sha256 of the parameters' ``path:shape:dtype`` lines (works on ``nnx.eval_shape``)."""
    lines = [f"{p}:{tuple(v.shape)}:{np.dtype(v.dtype)}" for p, v in param_leaves(model)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _weighted(v: np.ndarray) -> tuple[float, float]:
    """``(sum v, sum_i v_i cos i)``: the second changes if values move between leaves."""
    v = np.asarray(v, np.float64).ravel()
    return float(v.sum()), float(np.sum(v * np.cos(np.arange(v.size))))


def fingerprint(model) -> tuple[float, float, int]:
    """Checksums of all parameter values in path order, and their count."""
    v = np.concatenate([np.asarray(x, np.float64).ravel() for _, x in param_leaves(model)])
    return (*_weighted(v), int(v.size))


def perturbed(model, seed=0):
    """``(graphdef, params)`` with every parameter moved by ``0.1 N(0, 1)`` (the output layer
    is zero at initialisation, so an untouched network answers 0)."""
    graphdef, params = nnx.split(model, nnx.Param)
    rng = np.random.default_rng(seed)
    return graphdef, jax.tree.map(
        lambda v: v + jnp.asarray(0.1 * rng.normal(size=v.shape), v.dtype), params
    )


def inputs(data_shape, b=7, seed=1):
    x = np.random.default_rng(seed).normal(size=(b, *data_shape))
    return jnp.asarray(x, jnp.float32), jnp.asarray(C_NOISE[:b], jnp.float32)


def forward_checksum(model, data_shape) -> tuple[float, float]:
    """Checksums of the forward pass of the perturbed network at fixed inputs."""
    graphdef, params = perturbed(model)
    x, c = inputs(data_shape)
    return _weighted(jax.jit(lambda p: nnx.merge(graphdef, p)(x, c))(params))


@functools.cache
def conditional(name):
    """``(graphdef, perturbed params)`` of the network ``name`` with ``K`` classes (built once).
    The UNet is built abstractly and its parameters drawn by numpy (``N(0, 0.3^2)``, norm
    scales ``1 + N(0, 0.1^2)``): initialising it costs seconds of compilation, and these
    tests need weights of the right shapes, not trained or initialised ones."""
    if name != "UNet":
        return perturbed(build(name, num_classes=K))
    graphdef, abstract = nnx.split(build(name, abstract=True, num_classes=K), nnx.Param)
    rng = np.random.default_rng(5)

    def draw(path, v):
        z = rng.normal(size=v.shape)
        is_scale = "scale" in jax.tree_util.keystr(path)
        return jnp.asarray(1.0 + 0.1 * z if is_scale else 0.3 * z, v.dtype)

    return graphdef, jax.tree_util.tree_map_with_path(draw, abstract)


def unconditional_twin(name, params):
    """``(graphdef, state)`` of the unconditional network holding the conditional one's
    weights (all but its label maps), read from ``params`` by path."""
    graphdef, abstract = nnx.split(build(name, abstract=True), nnx.Param)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    have = {jax.tree_util.keystr(p): v for p, v in flat}
    state = jax.tree_util.tree_map_with_path(lambda p, v: have[jax.tree_util.keystr(p)], abstract)
    return graphdef, state


# ----------------------------------------------------------------------------- before labels
@pytest.mark.parametrize("name", NETS)
def test_unconditional_structure_is_that_before_labels(name):
    """Parameter paths, shapes and dtypes (built abstractly where possible)."""
    before = BEFORE[name]["structure"]
    assert structure(build(name, abstract=True)) == before
    assert structure(build(name, abstract=True, num_classes=0)) == before


@pytest.mark.parametrize("name", ["MLP", "LocalMLP"])
def test_unconditional_values_are_those_before_labels(name):
    """Initial values for seed 3 and the forward pass of the perturbed network."""
    before = BEFORE[name]
    model = build(name)
    got = fingerprint(model)
    assert got[2] == before["values"][2]
    np.testing.assert_allclose(got[:2], before["values"][:2], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        forward_checksum(model, NETS[name][1]), before["forward"], rtol=1e-5, atol=1e-5
    )


# ----------------------------------------------------------------------------- labels
@pytest.mark.parametrize("name", SLOW_UNET)
def test_null_label_is_the_unconditional_network(name):
    """``labels=None`` and the null label give the same output, which is the unconditional
    network's with the same weights; class labels change it (one example's label changing
    only its own output: ``test_network_score_labels_per_example``)."""
    graphdef, params = conditional(name)
    assert nnx.merge(graphdef, params).num_classes == K
    twin_graphdef, twin_params = unconditional_twin(name, params)
    x, c = inputs(NETS[name][1])

    @jax.jit
    def run(params, twin_params):
        net = nnx.merge(graphdef, params)
        return dict(
            none=net(x, c),
            null=net(x, c, jnp.full((7,), K, jnp.int32)),
            labels=net(x, c, jnp.asarray(LABELS)),
            twin=nnx.merge(twin_graphdef, twin_params)(x, c),
        )

    o = jax.tree.map(np.asarray, run(params, twin_params))
    np.testing.assert_array_equal(o["none"], o["null"])
    np.testing.assert_allclose(o["null"], o["twin"], rtol=1e-6, atol=1e-6)
    moved = np.abs(o["labels"] - o["null"]).reshape(7, -1).max(1)
    assert np.all((moved > 1e-4) == (LABELS != K)), moved


def test_labels_refused_where_they_cannot_be_used():
    make, data_shape = NETS["MLP"]
    x, c = inputs(data_shape, b=2)
    plain = make(MLP)
    with pytest.raises(ValueError, match="labels"):
        plain(x, c, jnp.asarray([0, 1]))
    cond = make(MLP, num_classes=K)
    with pytest.raises(ValueError, match="labels"):
        cond(x, c, jnp.asarray([0, 1, 2]))  # not one per example
    for bad in (-1, 1.5, "3"):
        with pytest.raises(ValueError, match="model.num_classes"):
            make(MLP, num_classes=bad)
    graphdef, params = nnx.split(plain, nnx.Param)
    src = NetworkScore(process=VP(), graphdef=graphdef, params=params)
    assert src.num_classes == 0
    with pytest.raises(ValueError, match="labels"):
        src.with_labels(jnp.asarray([0, 1])).denoiser(x, 0.5)
    with pytest.raises(ValueError, match="sampler.labels"):
        src.conditioned(0)
    graphdef, params = nnx.split(cond, nnx.Param)
    src = NetworkScore(process=VP(), graphdef=graphdef, params=params)
    with pytest.raises(ValueError, match="sampler.labels"):
        src.conditioned(K + 1)


@pytest.mark.parametrize("name", SLOW_UNET)
def test_network_score_labels_per_example(name):
    """``NetworkScore.denoiser_given`` with a scalar time (the network mapped over the
    examples: each example alone, a batch of 1 inside the map) equals a ``[batch]`` time (one
    batched call of 7) and a batched call of the first example alone; in the batched call,
    changing one example's label changes that example's output only; labels bound by
    ``conditioned(...).for_examples`` are the same labels (MLP)."""
    graphdef, params = conditional(name)
    src = NetworkScore(process=VP(), graphdef=graphdef, params=params)
    assert src.num_classes == K
    x, _ = inputs(NETS[name][1])
    t, tb = jnp.float32(0.3), jnp.full((7,), 0.3, jnp.float32)
    labels = jnp.asarray(LABELS, jnp.int32)
    other = labels.at[5].set(0)
    bound = src.conditioned(Labels.given(LABELS, K)).for_examples(jax.random.key(0), 7, 0)

    @jax.jit
    def run(src, bound):
        out = dict(
            scalar=src.denoiser_given(x, t, labels),
            batch=src.denoiser_given(x, tb, labels),
            other=src.denoiser_given(x, tb, other),
        )
        if name != "UNet":  # (the UNet's scalar-time path is its batch of 1)
            out["first"] = src.denoiser_given(x[:1], tb[:1], labels[:1])
        if name == "MLP":
            out["bound"] = bound.denoiser(x, t)
        return out

    o = jax.tree.map(np.asarray, run(src, bound))
    scale = np.abs(o["scalar"]).max()
    np.testing.assert_allclose(o["batch"], o["scalar"], rtol=1e-5, atol=1e-6 * scale)
    if "first" in o:
        np.testing.assert_allclose(o["first"], o["batch"][:1], rtol=1e-5, atol=1e-6 * scale)
    if name == "MLP":
        np.testing.assert_array_equal(o["bound"], o["scalar"])
    changed = np.abs(o["other"] - o["batch"]).reshape(7, -1).max(1)
    assert changed[5] > 1e-4
    np.testing.assert_array_equal(np.delete(changed, 5), 0.0)
