"""Training with class labels and label dropout (issue 36, item 3; scorelib/training/step.py).

* label dropout: its frequency against the binomial standard error, each example's draw
  independent of the batch size (a batch's draws are a prefix of a larger batch's) and of
  the sharding (several devices, in a subprocess);
* the step binds exactly the (dropped) labels to the source the objective sees, and its loss
  is the objective's on that source;
* bad input is refused before anything is compiled, naming the field;
* a bare-array ``batch_fn`` runs the step of before labels existed, bit for bit (the step of
  commit 69c121e, loaded from git, against this one);
* a short conditional run on two clusters learns class-dependent outputs.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.keys import LABEL_DROPOUT_SALT
from scorelib.nets.mlp import MLP
from scorelib.objectives import EDMLoss
from scorelib.processes import EDM
from scorelib.training import (
    EMA,
    init_state,
    make_optimizer,
    make_train_step,
    network_source,
    train_seeds,
)
from scorelib.training.step import drop_labels

REPO = Path(__file__).resolve().parents[2]
BATCH = 32
K = 2
CENTRES = np.array([[1.0, 0.5], [-1.0, -0.5]], np.float32)  # class c's cluster centre
OPT = make_optimizer(lr=1e-2, warmup_steps=5, grad_clip=1.0)


def labelled_batch_fn(batch=BATCH, std=0.1):
    """Two clusters: example b of step i draws its class and noise from its own key."""

    def batch_fn(i):
        keys = jax.random.split(jax.random.fold_in(jax.random.key(1234), i), batch)

        def one(k):
            kc, kn = jax.random.split(k)
            c = jax.random.bernoulli(kc).astype(jnp.int32)
            return jnp.asarray(CENTRES)[c] + std * jax.random.normal(kn, (2,)), c

        return jax.vmap(one)(keys)

    return batch_fn


def bare_batch_fn(i):
    return labelled_batch_fn()(i)[0]


def model_state(num_classes=K, seed=0, width=16):
    model = MLP((2,), width=width, depth=2, num_classes=num_classes, rngs=nnx.Rngs(seed))
    return init_state(model, OPT, seed=7 + seed)


def step_keys(state):
    """``(k_loss, k_drop)`` of the step at ``state.step`` (scorelib/training/step.py)."""
    return jax.random.split(jax.random.fold_in(state.rng, state.step))


# --------------------------------------------------------------------------- dropout draws


def test_label_dropout_frequency_and_per_example_draws():
    """Frequency within 4 binomial standard errors; unchanged labels where not dropped;
    a batch's draws are the first examples of a larger batch's; another key draws anew;
    p = 0 draws nothing."""
    n, p, null = 20_000, 0.3, 5
    labels = jnp.asarray(np.random.default_rng(0).integers(0, null, n), jnp.int32)
    key = jax.random.key(3)
    fn = jax.jit(drop_labels, static_argnums=(2, 3))
    out = np.asarray(fn(labels, key, p, null))
    dropped = out == null
    se = np.sqrt(p * (1 - p) / n)
    assert abs(dropped.mean() - p) < 4 * se, (dropped.mean(), se)
    np.testing.assert_array_equal(out[~dropped], np.asarray(labels)[~dropped])
    np.testing.assert_array_equal(np.asarray(fn(labels[:7], key, p, null)), out[:7])
    np.testing.assert_array_equal(np.asarray(fn(labels[:1], key, p, null)), out[:1])
    other = np.asarray(fn(labels, jax.random.key(4), p, null)) == null
    both = np.mean(dropped & other)  # independent draws: p^2
    assert abs(both - p * p) < 4 * np.sqrt(p * p * (1 - p * p) / n)
    # the documented keys: fold_in(fold_in(key, LABEL_DROPOUT_SALT), b)
    kd = jax.random.fold_in(key, LABEL_DROPOUT_SALT)
    want = [bool(jax.random.bernoulli(jax.random.fold_in(kd, b), p)) for b in range(5)]
    np.testing.assert_array_equal(dropped[:5], want)
    np.testing.assert_array_equal(np.asarray(drop_labels(labels[:7], key, 0.0, null)), labels[:7])


# --------------------------------------------------------------------------- the step


class Spy:
    """An objective that reports the labels bound to the source it is given (a ``[batch]``
    metric, which the step passes through as float32: exact for small integers)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, source, x0, key):
        loss, metrics = self.inner(source, x0, key)
        return loss, {**metrics, "seen": source.labels}


LEARN_BATCH, LEARN_DROPOUT = 64, 0.3


@functools.cache
def conditional_step():
    """``(graphdef, make_source, objective, step)``: a conditional MLP's train step on the two
    clusters with label dropout (compiled once for the tests below)."""
    proc = EDM()
    graphdef, _ = model_state(width=32)
    make_source = network_source(proc, graphdef, 1.0)
    obj = EDMLoss(process=proc, sigma_data=1.0)
    step = make_train_step(
        Spy(obj),
        make_source,
        OPT,
        EMA(batch_size=LEARN_BATCH, decay=0.9),
        labelled_batch_fn(batch=LEARN_BATCH),
        label_dropout=LEARN_DROPOUT,
    )
    return graphdef, make_source, obj, step


def test_step_binds_the_dropped_labels_and_its_loss_is_the_objectives():
    """The objective sees ``drop_labels`` of the batch's labels with the step's ``k_drop``
    (recomputed here), its loss is the objective's on the source with those labels, and
    ``null_labels`` is their null share."""
    _, make_source, obj, step = conditional_step()
    state = model_state(width=32)[1]
    k_loss, k_drop = step_keys(state)
    x0, labels = labelled_batch_fn(batch=LEARN_BATCH)(state.step)
    params = jax.tree.map(jnp.copy, state.params)  # the step donates its state
    new, metrics = step(state)
    want = np.asarray(drop_labels(labels, k_drop, LEARN_DROPOUT, K))
    seen = np.asarray(metrics["seen"]).astype(np.int32)
    np.testing.assert_array_equal(seen, want)
    null = seen == K
    assert 0 < null.sum() < LEARN_BATCH
    np.testing.assert_array_equal(seen[~null], np.asarray(labels)[~null])
    np.testing.assert_allclose(float(metrics["null_labels"]), null.mean(), rtol=1e-6)
    ref, _ = jax.jit(lambda p: obj(make_source(p, k_drop).with_labels(want), x0, k_loss))(params)
    np.testing.assert_allclose(float(metrics["loss"]), float(ref), rtol=1e-6)
    assert int(new.step) == 1


def test_bad_input_is_refused_before_compiling():
    graphdef, state = model_state()
    proc = EDM()
    obj = EDMLoss(process=proc)
    ema = EMA(batch_size=BATCH, decay=0.9)
    cond = network_source(proc, graphdef, 0.5)
    for bad in (1.0, -0.1, "0.1", float("nan")):
        with pytest.raises(ValueError, match=r"^objective\.label_dropout must be a number in"):
            make_train_step(obj, cond, OPT, ema, labelled_batch_fn(), label_dropout=bad)
    uncond_graphdef, uncond_state = model_state(num_classes=0)
    uncond = network_source(proc, uncond_graphdef, 0.5)
    cases = [
        (uncond, labelled_batch_fn(), 0.0, uncond_state, r"^model\.num_classes must be > 0"),
        (cond, bare_batch_fn, 0.1, state, r"^data\.labels must be true for"),
        (
            cond,
            lambda i: (bare_batch_fn(i), jnp.zeros((BATCH, 1), jnp.int32)),
            0.0,
            state,
            r"^batch_fn\(step\) labels must be integer class labels",
        ),
        (
            cond,
            lambda i: (bare_batch_fn(i), jnp.zeros((BATCH,), jnp.float32)),
            0.0,
            state,
            r"^batch_fn\(step\) labels must be integer class labels",
        ),
    ]
    for make_source, batch_fn, p, st, match in cases:
        step = make_train_step(obj, make_source, OPT, ema, batch_fn, label_dropout=p)
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(step, st)  # tracing only: nothing is compiled or run


def _old_step_module():
    """``scorelib/training/step.py`` as of commit 69c121e (before labels), or skip."""
    try:
        text = subprocess.run(
            ["git", "show", "69c121e:scorelib/training/step.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("commit 69c121e is not in this checkout")
    spec = importlib.util.spec_from_loader("step_69c121e", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(text, "step_69c121e.py", "exec"), module.__dict__)
    return module


def test_bare_batches_give_the_step_of_before_labels_bit_for_bit():
    """An unconditional network and a bare-array batch_fn: three steps of this step and of
    the step before labels existed (commit 69c121e) give the same parameters, EMA, optimizer
    state and metrics, bit for bit."""
    old = _old_step_module()
    proc = EDM()
    graphdef, _ = model_state(num_classes=0)
    args = (
        EDMLoss(process=proc),
        network_source(proc, graphdef, 0.5),
        OPT,
        EMA(batch_size=BATCH, decay=0.9),
        bare_batch_fn,
    )
    runs = []
    for make in (make_train_step, old.make_train_step):
        step = make(*args)
        state = model_state(num_classes=0)[1]
        ms = []
        for _ in range(3):
            state, m = step(state)
            ms.append(m)
        runs.append((jax.device_get(state), jax.device_get(ms)))
    (new_state, new_m), (old_state, old_m) = runs
    assert set(new_m[0]) == set(old_m[0])
    new, old = jax.tree.leaves((new_state, new_m)), jax.tree.leaves((old_state, old_m))
    for a, b in zip(new, old, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_multi_seed_training_takes_labelled_batches():
    """train_seeds with (x0, labels) batches and label dropout computes what
    make_train_step computes for each seed alone."""
    proc = EDM()
    graphdef, s0 = model_state(seed=0)
    _, s1 = model_state(seed=1)
    make_source = network_source(proc, graphdef, 1.0)
    ema = EMA(batch_size=BATCH, decay=0.9)
    obj = EDMLoss(process=proc, sigma_data=1.0)
    final, _ = train_seeds(
        {"edm": obj}, make_source, OPT, ema, labelled_batch_fn(), [s0, s1], 3, label_dropout=0.3
    )
    single = make_train_step(obj, make_source, OPT, ema, labelled_batch_fn(), label_dropout=0.3)
    for i, state in enumerate((s0, s1)):
        for _ in range(3):
            state, _ = single(state)
        got = jax.tree.map(lambda a, i=i: a[i], final["edm"].params)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(state.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- learning


def test_a_short_conditional_run_learns_class_dependent_outputs():
    """Two clusters (std 0.1) at +-(1, 0.5), label dropout 0.3, 300 steps of batch 64: at
    sigma = 1 and x = 0 the exact denoiser is ``m_c sigma^2 / (sigma^2 + 0.01)`` for class
    ``c`` and 0 for the null label (equal classes). The trained one (EMA) must point to its
    class's centre and the null one stay near 0."""
    _, make_source, _, step = conditional_step()
    state = model_state(width=32)[1]
    for _ in range(300):
        state, m = step(state)
    src = make_source(state.ema_params, None)
    x = jnp.zeros((3, 2), jnp.float32)
    d = np.asarray(jax.jit(lambda s: s.denoiser(x, 1.0))(src.with_labels(jnp.arange(3))))
    for c in range(K):
        m_c = CENTRES[c]
        along = d[c] @ m_c / (m_c @ m_c)  # 0.99 exactly
        assert along > 0.6, (c, d)
    assert np.linalg.norm(d[K]) < 0.5 * np.linalg.norm(CENTRES[0]), d


# --------------------------------------------------------------------------- devices

SHARDED = textwrap.dedent(
    """
    import json, jax, jax.numpy as jnp
    from flax import nnx
    from scorelib import parallel
    from scorelib.nets.mlp import MLP
    from scorelib.objectives import EDMLoss
    from scorelib.processes import EDM
    from scorelib.training import EMA, init_state, make_optimizer, make_train_step, network_source
    from test_labels_training import labelled_batch_fn

    class Coded:  # EDM's loss, plus a metric that identifies the bound labels
        def __init__(self, inner):
            self.inner = inner
        def __call__(self, source, x0, key):
            loss, m = self.inner(source, x0, key)
            w = jnp.arange(1, x0.shape[0] + 1, dtype=jnp.float32)
            m["code"] = jnp.sum(w * source.labels.astype(jnp.float32))
            return loss, m

    opt = make_optimizer(lr=1e-2, warmup_steps=2, grad_clip=1.0)
    proc = EDM()
    out = {}
    for name, mesh in (("one", None), ("sharded", parallel.make_mesh())):
        model = MLP((2,), width=16, depth=2, num_classes=2, rngs=nnx.Rngs(0))
        graphdef, state = init_state(model, opt, seed=7)
        if mesh is not None:
            state = parallel.shard(state, mesh)
        step = make_train_step(
            Coded(EDMLoss(process=proc, sigma_data=1.0)),
            network_source(proc, graphdef, 1.0),
            opt,
            EMA(batch_size=32, decay=0.9),
            labelled_batch_fn(batch=32),
            batch_sharding=None if mesh is None else parallel.batch_sharding(mesh),
            label_dropout=0.5,
        )
        rows = []
        for _ in range(3):
            state, m = step(state)
            rows.append([float(m["loss"]), float(m["code"]), float(m["null_labels"])])
        out[name] = rows
    out["devices"] = jax.device_count()
    print(json.dumps(out))
    """
)


@pytest.mark.slow  # a subprocess with 4 CPU devices: over 5 s
def test_label_dropout_does_not_depend_on_the_sharding():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), str(REPO)])
    res = subprocess.run(
        [sys.executable, "-c", SHARDED],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    one, sharded = np.array(out["one"]), np.array(out["sharded"])
    np.testing.assert_array_equal(sharded[:, 1:], one[:, 1:])  # the same labels dropped
    np.testing.assert_allclose(sharded[:, 0], one[:, 0], rtol=1e-5)
