"""How far a score source is from a reference score source, on noised data.

Both quantities are pooled over a batch of noisy points ``x_b = alpha(t) x0_b + sigma(t)
eps_b``, with ``eps_b ~ N(0, I)`` drawn from example ``b``'s own key
(:func:`scorelib.keys.example_keys`), so a value depends on the key and the examples'
global indices, never on how the batch is split into chunks:

* the relative score error (De Bortoli et al., "Target score matching", arXiv 2402.08667,
  2024, compare the score error of DSM- and TSM-trained models across noise levels;
  dividing by the reference's mean squared norm, to compare noise levels, is ours)::

      E(s; s_ref) = sum_b ||s(x_b, t_b) - s_ref(x_b, t_b)||^2 / sum_b ||s_ref(x_b, t_b)||^2

* the fraction of a reference score that an approximation explains, in score space
  ``1 - E(s_approx; s_ref)`` (the explained-variance measure of Wang & Vastola, "The
  unreasonable effectiveness of Gaussian score approximation for diffusion models and
  its applications", TMLR 2024, arXiv 2412.09726, with the network as reference), and,
  our addition, in denoiser space::

      1 - sum_b ||D(x_b, t_b) - D_ref(x_b, t_b)||^2 / sum_b ||D_ref(x_b, t_b) - mean_b D_ref||^2

  At high noise every score is dominated by the shared ``-x / sigma^2`` term, which makes
  the score-space fraction close to 1 for any approximation; the denoiser-space fraction
  compares posterior means about their batch mean and does not have that term.

Scores and denoisers are each source's own (a source that defines only one gets the other
from Tweedie's formula, :func:`scorelib.scores.base.score_from_denoiser` /
:func:`~scorelib.scores.base.denoiser_from_score`, evaluating the source once). Sums are
taken in float64 on the host.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_array, check_int, check_time, require
from scorelib.keys import example_keys
from scorelib.scores.base import (
    ScoreSource,
    check_examples,
    denoiser_from_score,
    flatten,
    score_from_denoiser,
)

Array = Any

SPACES = ("score", "denoiser")


def noisy_samples(process, x0: Array, t: Array, key: jax.Array, *, first_index: Array = 0) -> Array:
    """``x_t = alpha(t) x0 + sigma(t) eps`` with per-example noise.

    Example ``b`` draws ``eps_b ~ N(0, I)`` from ``fold_in(key, first_index + b)``
    (:func:`scorelib.keys.example_keys`), so a batch is a prefix of a larger one and
    chunks of a batch, given their ``first_index``, give the same points as the whole.

    Args:
      process: the noise process (:mod:`scorelib.processes`).
      x0: ``[batch, *data_shape]`` clean data (data units).
      t: scalar or ``[batch]`` process times.
      key: one PRNG key.
      first_index: the global index of example 0 (int, may be traced).

    Returns:
      ``[batch, *data_shape]`` noisy points, dtype of ``x0``.

    Raises:
      ValueError: if ``x0`` is not real ``[batch, *data_shape]`` or ``t`` is neither a
        real scalar nor ``[batch]``.
    """
    check_time(t, "t", check_array(x0, "x0", ("batch", "*data_shape"))["batch"])
    x0 = jnp.asarray(x0)
    keys = example_keys(key, x0.shape[0], first_index)
    eps = jax.vmap(lambda k: jax.random.normal(k, x0.shape[1:], x0.dtype))(keys)
    return process.marginal_sample(x0, t, eps)


@functools.partial(jax.jit, static_argnames=("spaces", "stacked"))
def _chunk(sources, reference, x0, t, key, first_index, *, spaces, stacked):
    """``({name: {space: [(m,) b] squared differences}}, {space: reference [b, d]})``."""
    x = noisy_samples(reference.process, x0, t, key, first_index=first_index)
    ref = _outputs(reference, x, t)

    def sq_diff(src):
        out = _outputs(src, x, t)
        return {space: jnp.sum((out[space] - ref[space]) ** 2, axis=1) for space in spaces}

    diffs = {
        name: jax.vmap(sq_diff)(src) if stacked else sq_diff(src) for name, src in sources.items()
    }
    return diffs, {space: ref[space] for space in spaces}


def _outputs(src, x, t) -> dict:
    """``{"score", "denoiser"}`` of ``src`` at ``(x, t)``, flattened to ``[b, d]``, with the
    one the source does not define from the other by Tweedie (:mod:`scorelib.scores.base`),
    so each source is evaluated once (what is not used is removed by the compiler)."""
    cls = type(src)
    s = src.score(x, t) if cls.score is not ScoreSource.score else None
    d = src.denoiser(x, t) if cls.denoiser is not ScoreSource.denoiser else None
    if s is None:
        s = score_from_denoiser(src.process, x, t, d)
    if d is None:
        d = denoiser_from_score(src.process, x, t, s)
    return {"score": flatten(s), "denoiser": flatten(d)}


def _check_source(name, source, reference, stacked: bool) -> None:
    require(
        source.process == reference.process,
        f"{name}.process",
        f"the reference's process {reference.process!r}",
        source.process,
    )
    if stacked:
        leaves = jax.tree.leaves(source)
        lead = {np.shape(a)[0] if np.ndim(a) else None for a in leaves}
        require(
            bool(leaves) and len(lead) == 1 and None not in lead,
            f"{name} (stacked=True)",
            "a score source whose every array leaf has the same leading model axis",
            sorted({np.shape(a) for a in leaves}),
        )


def padded_chunks(x0: Array, t: Array, batch_size: int | None):
    """Validate ``(x0, t)`` and yield ``(start, stop, x0_chunk, t_chunk)`` over the examples.

    Chunks hold ``batch_size`` examples (all ``n`` for ``None``); the last one is padded (``x0``
    with zeros, ``t`` with its last value) to the same shape, so one compilation serves every
    chunk: keep the first ``stop - start`` rows of a chunk's results.

    Args:
      x0: ``[n, *data_shape]``.
      t: scalar or ``[n]`` process times (broadcast to ``[n]`` in ``x0``'s dtype).
      batch_size: an int >= 1 or ``None``.

    Raises:
      ValueError: naming ``x0``, ``t`` or ``batch_size``, before the first chunk.
    """
    n = check_array(x0, "x0", ("batch", "*data_shape"))["batch"]
    check_time(t, "t", n)
    x0 = jnp.asarray(x0)
    t = jnp.asarray(t, x0.dtype)
    t = jnp.broadcast_to(t, (n,))
    bs = min(n, n if batch_size is None else check_int(batch_size, "batch_size", low=1))
    return _chunks(x0, t, n, bs)


def _chunks(x0, t, n, bs):
    for start in range(0, n, bs):
        stop = min(start + bs, n)
        pad = bs - (stop - start)
        xb = jnp.pad(x0[start:stop], [(0, pad)] + [(0, 0)] * (x0.ndim - 1))
        yield start, stop, xb, jnp.pad(t[start:stop], (0, pad), mode="edge")


def _pooled(sources: dict, reference, x0, t, key, *, spaces, stacked, batch_size, first_index):
    """``({name: {space: sum of squared differences (float64, scalar or [m])}},
    {space: reference outputs [n, d] float64})``."""
    check_examples(reference, x0, "x0")
    for name, src in sources.items():
        _check_source(name, src, reference, stacked)
        check_examples(src, x0, "x0")
    diffs = {name: {space: [] for space in spaces} for name in sources}
    refs = {space: [] for space in spaces}
    for start, stop, xb, tb in padded_chunks(x0, t, batch_size):
        d, r = _chunk(
            sources, reference, xb, tb, key, first_index + start, spaces=spaces, stacked=stacked
        )
        for space in spaces:
            refs[space].append(np.asarray(r[space], np.float64)[: stop - start])
            for name in sources:
                diffs[name][space].append(
                    np.asarray(d[name][space], np.float64)[..., : stop - start]
                )
    sums = {
        name: {space: np.concatenate(v, axis=-1).sum(axis=-1) for space, v in per.items()}
        for name, per in diffs.items()
    }
    return sums, {space: np.concatenate(v) for space, v in refs.items()}


def _ratio(num, den):
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den


def relative_score_error(
    source,
    reference,
    x0: Array,
    t: Array,
    key: jax.Array,
    *,
    stacked: bool = False,
    batch_size: int | None = None,
    first_index: int = 0,
):
    """``sum_b ||s(x_b) - s_ref(x_b)||^2 / sum_b ||s_ref(x_b)||^2`` at noised ``x0``.

    The points ``x_b`` are :func:`noisy_samples` of ``x0`` at ``t`` with ``key`` (so two
    calls with the same key compare sources at the same points). Scores are each source's
    own ``score`` (no conversion, which would lose precision at small sigma).

    Args:
      source: the score source to judge, e.g. a trained ``NetworkScore``.
      reference: the reference score source (e.g. a target's exact noisy score), under
        the same process.
      x0: ``[n, *data_shape]`` clean data, data units.
      t: scalar or ``[n]`` process times (``process.t_of_ve_sigma(sigma)`` for a VE-frame
        noise level ``sigma``).
      key: PRNG key of the noise.
      stacked: ``source`` holds ``m`` models along a leading axis of every array leaf
        (e.g. a ``NetworkScore`` whose ``params`` are stacked over seeds); the models are
        evaluated with ``jax.vmap`` at the same points.
      batch_size: examples per compiled chunk (``None``: all at once); the result does
        not depend on it beyond float rounding of the sums.
      first_index: global index of ``x0[0]`` for the per-example noise keys.

    Returns:
      a float (``stacked=False``) or ``[m]`` float64 array; dimensionless (``nan`` or
      ``inf`` if the reference score is 0 at every point).

    Raises:
      ValueError: for sources under different processes, a ``stacked`` source without a
        common leading axis, ``x0`` not real ``[n, *data_shape]`` with the sources'
        ``data_shape`` (the message names both shapes), a bad ``t`` shape or ``batch_size``.

    Source: De Bortoli, Hutchinson, Wirnsberger, Doucet, "Target score matching", arXiv
    2402.08667 (2024) (score error of DSM vs TSM per noise level; normalised here).
    """
    sums, ref = _pooled(
        {"source": source},
        reference,
        x0,
        t,
        key,
        spaces=("score",),
        stacked=stacked,
        batch_size=batch_size,
        first_index=first_index,
    )
    out = _ratio(sums["source"]["score"], np.sum(ref["score"] ** 2))
    return out if stacked else float(out)


def explained_fraction(
    approximation,
    reference,
    x0: Array,
    t: Array,
    key: jax.Array,
    *,
    stacked: bool = False,
    batch_size: int | None = None,
    first_index: int = 0,
) -> dict:
    """The fraction of ``reference`` that ``approximation`` explains at noised ``x0``.

    Score space: ``1 - sum_b ||s - s_ref||^2 / sum_b ||s_ref||^2``, i.e. one minus
    :func:`relative_score_error`. Denoiser space: ``1 - sum_b ||D - D_ref||^2 / sum_b
    ||D_ref - mean_b D_ref||^2`` (denoisers in data units; the reference's variation about
    its batch mean, see the module docstring). 1 is a perfect match, 0 no better than a
    zero score (score space) or a constant denoiser (denoiser space); it can be negative.

    Args:
      approximation: the score source that explains (e.g. a Gaussian fitted to the data),
        or ``{name: source}`` to compare several at the same points in one pass (the
        reference is evaluated once).
      reference: the score source to explain (e.g. a trained network), same process.
      x0, t, key, stacked, batch_size, first_index: as :func:`relative_score_error`.

    Returns:
      ``{"score": f, "denoiser": f}`` (``{name: {...}}`` for a mapping): floats, or ``[m]``
      float64 with ``stacked=True``.

    Raises:
      ValueError: as :func:`relative_score_error`, or for an empty mapping.

    Source: Wang & Vastola, TMLR 2024 (arXiv 2412.09726): the explained variance
    ``1 - ||s_net - s_approx||^2 / ||s_net||^2`` of a trained network's score by a
    Gaussian, a Gaussian mixture and the training set's exact score across noise levels;
    the denoiser-space form is this library's.
    """
    single = not isinstance(approximation, Mapping)
    sources = {"approximation": approximation} if single else dict(approximation)
    require(len(sources) >= 1, "approximation", "a score source or a non-empty mapping", sources)
    sums, ref = _pooled(
        sources,
        reference,
        x0,
        t,
        key,
        spaces=SPACES,
        stacked=stacked,
        batch_size=batch_size,
        first_index=first_index,
    )
    den = {
        "score": np.sum(ref["score"] ** 2),
        "denoiser": np.sum((ref["denoiser"] - ref["denoiser"].mean(axis=0)) ** 2),
    }
    out = {}
    for name, per in sums.items():
        fr = {space: 1.0 - _ratio(per[space], den[space]) for space in SPACES}
        out[name] = fr if stacked else {k: float(v) for k, v in fr.items()}
    return out["approximation"] if single else out
