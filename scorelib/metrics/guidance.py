"""How good a noise-conditional classifier is for guidance: its input gradient against the
exact one, and its accuracy, at given noise levels.

A classifier is any object with ``class_log_prob(x, t, labels) -> [batch]`` and ``process``
(``scorelib.scores.classifier.NoisyClassifier``; the exact classifier of a mixture whose
classes are its components, ``scorelib.scores.PerClassScore.class_log_prob``). At each VE
noise level ``sigma`` the labelled clean data ``(x0_b, c_b)`` are noised, ``x_b = alpha(t)
(x0_b + sigma eps_b)`` at ``t = t_of_ve_sigma(sigma)``, with ``eps_b`` from
``fold_in(fold_in(key, l), b)`` for level ``l`` and example ``b``
(:func:`scorelib.metrics.noisy_samples`), so every classifier compared with the same key
sees the same points.

* :func:`classifier_gradient_error`: the relative mean squared error of the guidance term
  ``g = grad_x log p_phi(c_b | x_b)`` against the exact ``g*``::

      E(sigma) = sum_b |g_b - g*_b|^2 / sum_b |g*_b|^2

  (0 for the exact classifier, 1 for a classifier whose gradient is 0, e.g. a constant or
  freshly initialised one). Its Monte-Carlo standard error is the delta method's for a ratio
  of means: ``sqrt(var_b(a_b - E b_b) / n) / mean_b(b_b)`` with ``a = |g - g*|^2``,
  ``b = |g*|^2``. DLSM (Chao et al., ICLR 2022) claims a smaller error for its classifier
  than for a cross-entropy one; this is the estimator that checks it.
* :func:`noisy_classifier_accuracy`: the share of noised examples whose most probable class (over
  ``class_log_prob`` of every class) is their label, with its binomial standard error.

Sums are taken in float64 on the host.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_array, check_real, require
from scorelib.metrics.score_error import noisy_samples
from scorelib.scores.base import flatten

Array = Any


def _check(classifier, name: str, process) -> None:
    require(
        callable(getattr(classifier, "class_log_prob", None)),
        name,
        "a noise-conditional classifier (class_log_prob(x, t, labels) -> [batch])",
        type(classifier).__name__,
    )
    got = getattr(classifier, "process", None)
    require(got is not None, f"{name}.process", "a noise process", got)
    require(got == process, f"{name}.process", f"the process {process!r}", got)


def _levels(sigmas) -> np.ndarray:
    levels = np.atleast_1d(np.asarray(sigmas, np.float64))
    require(levels.ndim == 1 and levels.size >= 1, "sigmas", "a list of VE noise levels", sigmas)
    for s in levels:
        check_real(float(s), "sigmas", low=0.0, low_open=True, high_open=True)
    return levels


def _labelled(x0, labels) -> tuple[Array, Array]:
    n = check_array(x0, "x0", ("n", "*data_shape"))["n"]
    labels = np.asarray(labels)
    require(
        labels.shape == (n,) and np.issubdtype(labels.dtype, np.integer),
        "labels",
        f"[{n}] integer class labels (one per example of x0)",
        labels.shape,
    )
    return jnp.asarray(x0), jnp.asarray(labels, jnp.int32)


def _input_gradient(classifier, x, t, labels):
    """``grad_x log p(c | x)`` per example: the gradient of the batch sum, ``[n, d]``."""
    grad = jax.grad(lambda y: jnp.sum(classifier.class_log_prob(y, t, labels)))(x)
    return flatten(grad)


@jax.jit
def _gradient_terms(classifier, exact, x0, labels, t, key):
    """``(a [n], b [n])``: ``|g - g*|^2`` and ``|g*|^2`` per example at time ``t``."""
    x = noisy_samples(exact.process, x0, t, key)
    g = _input_gradient(classifier, x, t, labels)
    g_star = _input_gradient(exact, x, t, labels)
    return jnp.sum((g - g_star) ** 2, axis=1), jnp.sum(g_star**2, axis=1)


def classifier_gradient_error(classifier, exact, x0, labels, sigmas, key) -> dict[str, np.ndarray]:
    """The classifier's guidance-gradient error against the exact one at each noise level
    (module docstring).

    Args:
      classifier: the classifier to score (``class_log_prob`` and ``process``).
      exact: the exact classifier on the same process (``PerClassScore`` of the classes).
      x0: ``[n, *data_shape]`` clean labelled data (data units).
      labels: ``[n]`` int classes of ``x0``.
      sigmas: VE noise levels (> 0), a scalar or a list of ``L``.
      key: a PRNG key; level ``l`` draws its noise from ``fold_in(key, l)``.

    Returns:
      ``{"sigma", "error", "stderr", "exact_mean_square"}``, each ``[L]`` float64:
      the levels, ``E(sigma)`` (dimensionless), its standard error and ``mean_b |g*_b|^2``
      (units 1 / data^2).

    Raises:
      ValueError: naming ``classifier``/``exact`` (no ``class_log_prob``, or on another
        process), ``x0``, ``labels`` or ``sigmas``.
    """
    process = getattr(exact, "process", None)
    _check(exact, "exact", process)
    _check(classifier, "classifier", process)
    levels = _levels(sigmas)
    x0, labels = _labelled(x0, labels)
    n = x0.shape[0]
    out = {"sigma": levels, "error": [], "stderr": [], "exact_mean_square": []}
    for i, sigma in enumerate(levels):
        t = jnp.asarray(process.t_of_ve_sigma(float(sigma)), x0.dtype)
        a, b = jax.device_get(
            _gradient_terms(classifier, exact, x0, labels, t, jax.random.fold_in(key, i))
        )
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        ratio = a.sum() / b.sum()
        resid = a - ratio * b
        se = np.sqrt(resid.var(ddof=1) / n) / b.mean() if n > 1 else np.nan
        out["error"].append(ratio)
        out["stderr"].append(se)
        out["exact_mean_square"].append(b.mean())
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _predictions(classifier, x0, t, key, num_classes):
    """``[n]`` int32: the most probable class of each noised example."""
    x = noisy_samples(classifier.process, x0, t, key)
    n = x.shape[0]
    each = [
        classifier.class_log_prob(x, t, jnp.full((n,), k, jnp.int32)) for k in range(num_classes)
    ]
    return jnp.argmax(jnp.stack(each, axis=1), axis=1).astype(jnp.int32)


def noisy_classifier_accuracy(classifier, x0, labels, sigmas, key) -> dict[str, np.ndarray]:
    """The classifier's accuracy on noised labelled data at each VE noise level.

    Args:
      classifier: ``class_log_prob``, ``num_classes`` and ``process`` (a ``NoisyClassifier``
        or a ``PerClassScore``: the exact, Bayes classifier of its classes).
      x0, labels, sigmas, key: as :func:`classifier_gradient_error` (the same key noises the
        data identically); a small level (e.g. the process's ``ve_sigma(t_min)``) gives the
        accuracy on clean data.

    Returns:
      ``{"sigma", "accuracy", "stderr"}``, each ``[L]`` float64 (the binomial standard error
      ``sqrt(acc (1 - acc) / n)``).

    Raises:
      ValueError: as :func:`classifier_gradient_error`, or ``classifier.num_classes``
        missing.
    """
    process = getattr(classifier, "process", None)
    _check(classifier, "classifier", process)
    k = int(getattr(classifier, "num_classes", 0) or 0)
    require(k >= 1, "classifier.num_classes", "an int >= 1", k)
    levels = _levels(sigmas)
    x0, labels = _labelled(x0, labels)
    acc = []
    for i, sigma in enumerate(levels):
        t = jnp.asarray(process.t_of_ve_sigma(float(sigma)), x0.dtype)
        pred = _predictions(classifier, x0, t, jax.random.fold_in(key, i), k)
        acc.append(float(np.mean(np.asarray(pred) == np.asarray(labels))))
    acc = np.asarray(acc, np.float64)
    n = x0.shape[0]
    return {"sigma": levels, "accuracy": acc, "stderr": np.sqrt(acc * (1 - acc) / n)}
