"""How far a score source is from a gradient field: the asymmetry of its Jacobian on noised
data.

At noisy points ``x_b = alpha(t) x0_b + sigma(t) eps_b`` (``eps_b`` from example ``b``'s own
key, :func:`scorelib.metrics.score_error.noisy_samples`) the per-example asymmetry
``|J_b - J_b^T|_F^2`` of the score's Jacobian ``J_b = d s(x_b, t_b) / d x_b`` and its
Frobenius norm ``|J_b|_F^2`` (:func:`scorelib.scores.jacobian.jacobian_asymmetry`: exact by
forward mode for small ``d``, or Hutchinson's estimate). Reported as Chao, Sun, Cheng and Lee
("On investigating the conservative property of score-based generative models", ICML 2022,
arXiv 2209.12753, Sec. 5) report them: the asymmetry itself and, normalised, the share of the
Jacobian's squared Frobenius norm in its antisymmetric part ``K = (J - J^T) / 2``::

    relative = sum_b |J_b - J_b^T|_F^2 / (4 sum_b |J_b|_F^2) = sum_b |K_b|_F^2 / sum_b |J_b|_F^2

in ``[0, 1]`` (0 for a gradient field, 1 for a purely rotational one). The paper's NAsym
averages per-example ratios of one-probe estimates; here the sums are pooled over examples (a
ratio of unbiased estimates, consistent as examples grow).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import numpy as np

from scorelib._checks import check_choice, check_int
from scorelib.metrics.score_error import noisy_samples, padded_chunks
from scorelib.scores.base import check_examples
from scorelib.scores.jacobian import FORMS, PROBE_NOISES, example_probes, jacobian_asymmetry

Array = Any

METHODS = ("exact", "hutchinson")


@functools.partial(jax.jit, static_argnames=("method", "probes", "noise", "form"))
def _chunk(source, x0, t, key, first_index, *, method, probes, noise, form):
    x = noisy_samples(source.process, x0, t, jax.random.fold_in(key, 0), first_index=first_index)
    eps = None
    if method == "hutchinson":
        d = math.prod(x0.shape[1:])
        eps = example_probes(
            jax.random.fold_in(key, 1), x0.shape[0], probes, d, noise, first_index=first_index
        )
    return jacobian_asymmetry(source, x, t, eps=eps, form=form)


def score_asymmetry(
    source,
    x0: Array,
    t: Array,
    key: jax.Array,
    *,
    method: str = "exact",
    probes: int | None = None,
    noise: str | None = None,
    form: str | None = None,
    batch_size: int | None = None,
    first_index: int = 0,
) -> dict:
    """The asymmetry of ``source``'s score Jacobian at noised ``x0`` (module docstring).

    Args:
      source: a score source (e.g. a trained ``NetworkScore``).
      x0: ``[n, *data_shape]`` clean data, data units.
      t: scalar or ``[n]`` process times (``process.t_of_ve_sigma(sigma)`` for a VE-frame
        noise level ``sigma``).
      key: PRNG key; the noise of example ``b`` comes from ``fold_in(fold_in(key, 0),
        first_index + b)``, its probes from ``fold_in(fold_in(key, 1), first_index + b)``.
      method: ``'exact'`` (the whole Jacobian, ``d`` forward-mode products per example) or
        ``'hutchinson'`` (``probes`` JVP/VJP pairs per example).
      probes: Hutchinson only, >= 1 (default 1).
      noise: Hutchinson only, ``'rademacher'`` (default) or ``'gaussian'``.
      form: Hutchinson only, ``'skew'`` (default) or ``'paper'``
        (:mod:`scorelib.scores.jacobian`).
      batch_size: examples per compiled chunk (``None``: all at once); the values do not
        depend on it.
      first_index: global index of ``x0[0]`` for the per-example keys (an int >= 0).

    Returns:
      a dict: ``asymmetry`` (mean over examples of ``|J - J^T|_F^2``, units 1 / data^4),
      ``stderr`` (its standard error over examples, 0 for ``n = 1``), ``frobenius`` (mean
      ``|J|_F^2``), ``relative`` (dimensionless, in ``[0, 1]`` for the exact method; ``nan``
      when every Jacobian is 0), and ``per_example``: ``{"asymmetry", "frobenius"}`` as ``[n]``
      float64 arrays.

    Raises:
      ValueError: naming ``method``, ``probes``, ``noise``, ``form`` (a Hutchinson option
        given with ``method='exact'`` is refused), ``x0``, ``t``, ``batch_size`` or
        ``first_index``, before any compute.

    Source: Chao et al., ICML 2022 (arXiv 2209.12753), Sec. 4-5 (Asym and NAsym).
    """
    check_choice(method, "method", METHODS)
    if method == "exact":
        if probes is not None or noise is not None or form is not None:
            raise ValueError(
                "probes, noise and form are options of method='hutchinson'; the exact method "
                f"uses no probes: got probes={probes!r}, noise={noise!r}, form={form!r}"
            )
        probes, noise, form = 1, "rademacher", "skew"  # unused
    else:
        probes = check_int(1 if probes is None else probes, "probes", low=1)
        noise = check_choice("rademacher" if noise is None else noise, "noise", PROBE_NOISES)
        form = check_choice("skew" if form is None else form, "form", FORMS)
    first_index = check_int(first_index, "first_index", low=0)
    check_examples(source, x0, "x0")
    asym, frob = [], []
    for start, stop, xb, tb in padded_chunks(x0, t, batch_size):
        a, f = _chunk(
            source,
            xb,
            tb,
            key,
            first_index + start,
            method=method,
            probes=probes,
            noise=noise,
            form=form,
        )
        asym.append(np.asarray(a, np.float64)[: stop - start])
        frob.append(np.asarray(f, np.float64)[: stop - start])
    asym, frob = np.concatenate(asym), np.concatenate(frob)
    n = asym.size
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = float(asym.sum() / (4.0 * frob.sum()))
    return {
        "asymmetry": float(asym.mean()),
        "stderr": float(asym.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
        "frobenius": float(frob.mean()),
        "relative": relative,
        "per_example": {"asymmetry": asym, "frobenius": frob},
    }
