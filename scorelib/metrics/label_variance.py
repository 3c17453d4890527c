"""The conditional variance of a score-matching regression label, by Monte Carlo.

A score-matching objective regresses ``s_theta(x_t, t)`` onto a label ``u`` whose
conditional mean is the noisy score, ``E[u | x_t] = s_t(x_t)`` (the DSM label
``-eps / sigma``, the TSM label ``grad log p_0(x_0) / alpha``, or any mixture of the two;
:meth:`scorelib.objectives.MixedScoreMatching.labels`). Then

    V(t) = E_{x_0, eps} ||u - s_t(x_t)||^2 = E_{x_t} tr Cov[u | x_t]

is the part of the loss no model can remove and the noise in its gradient (De Bortoli,
Hutchinson, Wirnsberger, Doucet, "Target score matching", arXiv 2402.08667, 2024: the
DSM label's variance diverges as ``sigma -> 0``, the TSM label's vanishes). For Gaussian
data ``x_0 ~ N(mu, C)``, ``C = U diag(lam) U^T``, and
``A = alpha^2 C + sigma^2 I``, ``E||s_t||^2 = tr A^{-1}`` and ``E[u . s_t] = E||s_t||^2``,
so ``V = E||u||^2 - tr A^{-1}``:

    DSM:  V = d / sigma^2 - tr A^{-1}
            = sum_i alpha^2 lam_i / (sigma^2 (alpha^2 lam_i + sigma^2))
    TSM:  V = tr C^{-1} / alpha^2 - tr A^{-1}
            = sum_i sigma^2 / (alpha^2 lam_i (alpha^2 lam_i + sigma^2))

so the DSM label's variance grows like ``d / sigma^2`` and the TSM label's vanishes as
``sigma -> 0`` (checked against these forms in ``tests/metrics/test_label_variance.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_time, require
from scorelib.keys import example_keys
from scorelib.objectives import label_residuals
from scorelib.scores.base import check_examples

Array = Any


@jax.jit
def _residuals(objectives, truth, x0, t, key, first_index):
    keys = example_keys(key, x0.shape[0], first_index)
    eps = jax.vmap(lambda k: jax.random.normal(k, x0.shape[1:], x0.dtype))(keys)
    out = {}
    for name, objective in objectives.items():
        r = label_residuals(objective, truth, x0, t, eps)
        out[name] = r["u"]
    return out, {"u_dsm": r["u_dsm"], "u_tsm": r["u_tsm"]}


def _stats(v) -> dict[str, float]:
    v = np.asarray(v, np.float64)
    return {"mean": float(v.mean()), "se": float(v.std() / math.sqrt(v.size))}


def label_variance(
    objectives: Mapping[str, Any],
    truth,
    x0: Array,
    t: Array,
    key: jax.Array,
    *,
    first_index: int = 0,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Monte-Carlo ``E||u - s_t(x_t)||^2`` of each objective's label at times ``t``.

    Example ``b`` is ``x_t = alpha x0_b + sigma eps_b`` with ``eps_b`` from
    ``fold_in(key, first_index + b)`` (:func:`scorelib.keys.example_keys`); every
    objective is evaluated at the same points (common random numbers), in one compiled
    call.

    Args:
      objectives: ``{name: objective}``, each a :class:`scorelib.objectives.
        MixedScoreMatching` (or ``TSM``) whose ``kappa`` defines its label ``u``; all with
        the same process and target.
      truth: the exact noisy score of the target under that process (e.g.
        ``target.noisy_score(process)``).
      x0: ``[n, d]`` exact samples of the target, ``n >= 2``.
      t: scalar or ``[n]`` process times.
      key: PRNG key of the noise ``eps``.
      first_index: global index of ``x0[0]``.

    Returns:
      ``(per_objective, pure)``: ``per_objective[name]`` and ``pure["u_dsm"]``,
      ``pure["u_tsm"]`` (the DSM label ``-eps / sigma`` and the TSM label
      ``grad log p_0(x_0) / alpha``) are each ``{"mean": float, "se": float}``: the mean
      over the examples of the squared label residual summed over coordinates (units
      1/data^2) and its standard error ``std / sqrt(n)``.

    Raises:
      ValueError: for no objectives, objectives with different processes or targets,
        ``x0`` not real ``[n >= 2, d]`` with ``truth``'s ``d``, or ``t`` neither a scalar
        nor ``[n]``.

    Source: De Bortoli et al., "Target score matching", arXiv 2402.08667 (2024) (the DSM
    and TSM labels); the Gaussian closed forms are derived in this module's docstring.
    """
    require(len(objectives) >= 1, "objectives", "a non-empty mapping", dict(objectives))
    first = next(iter(objectives.values()))
    for name, obj in objectives.items():
        require(
            obj.process == first.process and obj.target is first.target,
            f"objectives[{name!r}]",
            "an objective with the same process and target as the others",
            obj,
        )
    n = check_examples(truth, x0, "x0")
    require(np.ndim(x0) == 2 and n >= 2, "x0", "[n >= 2, d]", np.shape(x0))
    check_time(t, "t", n)
    x0 = jnp.asarray(x0)
    t = jnp.asarray(t, x0.dtype)
    per, pure = _residuals(dict(objectives), truth, x0, jnp.broadcast_to(t, (n,)), key, first_index)
    return {k: _stats(v) for k, v in per.items()}, {k: _stats(v) for k, v in pure.items()}
