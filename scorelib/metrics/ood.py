"""Out-of-distribution detection by multiscale score matching (MSMA).

Mahmood, Oliva and Styner, "Multiscale score matching for out-of-distribution detection",
ICLR 2021 (arXiv 2010.13132), Sec. 3-4: a score model trained at ``L`` noise levels maps an
input ``x`` to the vector of its score norms, one per level::

    n(x) = ( || s(x; sigma_1) ||_2, ..., || s(x; sigma_L) ||_2 )          (units 1 / data)

(their eq. 5: the norms of the multiscale score estimates at ``x`` itself, not at a noised
``x``); an auxiliary density model is fitted on the vectors of in-distribution inputs (a
Gaussian mixture, one of the paper's three), and the negative log-likelihood of ``n(x)`` under
it is the OOD score: high for inputs whose score norms look unlike the training data's.
Detection is judged by the area under the ROC curve between in-distribution and OOD inputs.

Noise levels are VE-frame sigmas (``ve_sigma = sigma(t) / alpha(t)``, EDM's sigma): for any
source, ``s(x; sigma)`` is the score of the VE-frame density ``p_sigma = p_data * N(0,
sigma^2 I)`` at ``x``, ``s_ve(x; sigma) = alpha s_t(alpha x, t)`` with ``t =
process.t_of_ve_sigma(sigma)`` and ``alpha = alpha(t)`` (``p_t(x) = p_sigma(x / alpha) /
alpha^d``), so the norms do not depend on the source's process. For EDM and VE (``alpha =
1``) it is the source's score at ``(x, t)``.

The mixture is fitted by scikit-learn's ``GaussianMixture`` (EM) on the standardised vectors
(each level's norm centred and divided by its in-distribution standard deviation, so that
levels whose norms differ by orders of magnitude share one covariance floor ``reg_covar``);
the reported negative log-likelihood is that of the unstandardised vector (the standardised
one's plus ``sum_l log std_l``), in nats. AUROC by scikit-learn's ``roc_auc_score``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_array, check_choice, check_int, check_real_dtype, require
from scorelib.processes.base import broadcast_to_data
from scorelib.scores.base import check_examples, flatten

Array = Any

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def check_sigmas(sigmas, process=None) -> np.ndarray:
    """``sigmas`` as a float64 ``[L]`` array of distinct VE-frame noise levels, ``L >= 2``.

    With a ``process``, each level must lie in the process's range ``[ve_sigma(t_min),
    ve_sigma(t_max)]`` (to a relative 1e-6).

    Raises:
      ValueError: naming ``sigmas``: not a 1-D list of finite numbers, fewer than 2 levels, a
        level <= 0, repeated levels, or a level outside the process's range.
    """
    try:
        s = np.asarray(sigmas, np.float64)
    except (TypeError, ValueError):
        s = None
    require(s is not None and s.ndim == 1, "sigmas", "a 1-D list of noise levels", sigmas)
    require(s.size >= 2, "sigmas", "at least 2 noise levels (L >= 2)", s.tolist())
    require(bool(np.all(np.isfinite(s))), "sigmas", "finite", s.tolist())
    require(bool(np.all(s > 0)), "sigmas", "> 0 (VE-frame noise levels)", s.tolist())
    require(np.unique(s).size == s.size, "sigmas", "distinct", s.tolist())
    if process is not None:
        lo = float(process.ve_sigma(jnp.float32(process.t_min)))
        hi = float(process.ve_sigma(jnp.float32(process.t_max)))
        inside = (s >= lo * (1 - 1e-6)) & (s <= hi * (1 + 1e-6))
        require(
            bool(np.all(inside)),
            "sigmas",
            f"inside the process's noise range [{lo:.6g}, {hi:.6g}]",
            s.tolist(),
        )
    return s


@jax.jit
def _norms(source, x, sigmas):
    """``[batch, L]`` VE-frame score norms (module docstring)."""
    p = source.process

    def one_level(sigma):
        t = p.t_of_ve_sigma(sigma)
        alpha = p.alpha(t)
        s = source.score(broadcast_to_data(alpha, x) * x, jnp.broadcast_to(t, (x.shape[0],)))
        return alpha * jnp.linalg.norm(flatten(s), axis=1)

    return jax.lax.map(one_level, sigmas).T


def score_norms(source, x: Array, sigmas, *, batch_size: int | None = None) -> np.ndarray:
    """The multiscale score-norm vectors ``n(x)`` of a score source (module docstring).

    Args:
      source: any score source (a trained ``NetworkScore``, an analytic Gaussian, ...).
      x: ``[n, *data_shape]`` inputs (data units; not noised).
      sigmas: ``[L]`` distinct VE-frame noise levels (data units, ``L >= 2``), inside the
        source's process range.
      batch_size: inputs per compiled chunk (``None``: all at once); the values do not depend
        on it.

    Returns:
      ``[n, L]`` float64 norms ``||s_ve(x; sigma_l)||_2`` (units 1 / data).

    Raises:
      ValueError: naming ``sigmas`` (as :func:`check_sigmas`), ``x`` (not real ``[n,
        *data_shape]`` with the source's ``data_shape``, or non-finite values) or
        ``batch_size``.

    Source: Mahmood et al., ICLR 2021, eq. 5.
    """
    s = check_sigmas(sigmas, source.process)
    check_examples(source, x, "x")
    x = np.asarray(x, np.float32)
    require(bool(np.all(np.isfinite(x))), "x", "finite", "non-finite values")
    n = x.shape[0]
    bs = min(n, n if batch_size is None else check_int(batch_size, "batch_size", low=1))
    levels = jnp.asarray(s, jnp.float32)
    out = []
    for start in range(0, n, bs):
        stop = min(start + bs, n)
        xb = np.zeros((bs, *x.shape[1:]), np.float32)  # padded: one compilation
        xb[: stop - start] = x[start:stop]
        out.append(np.asarray(_norms(source, jnp.asarray(xb), levels), np.float64)[: stop - start])
    return np.concatenate(out)


@dataclasses.dataclass(frozen=True, eq=False)
class NormDensity:
    """A Gaussian mixture fitted on standardised score-norm vectors (:func:`fit_norm_density`).

    Attributes:
      mean, std: ``[L]`` the in-distribution vectors' mean and standard deviation per level.
      gmm: the fitted ``sklearn.mixture.GaussianMixture`` on ``(n - mean) / std``.
    """

    mean: np.ndarray
    std: np.ndarray
    gmm: Any

    @property
    def levels(self) -> int:
        """``L``, the length of the vectors it scores."""
        return int(self.mean.shape[0])


def _check_features(norms, name: str, levels: int | None = None) -> np.ndarray:
    check_real_dtype(norms, name)
    a = np.asarray(norms, np.float64)
    want = "[n, L]" if levels is None else f"[n, L={levels}]"
    ok = a.ndim == 2 and a.shape[0] >= 1 and (levels is None or a.shape[1] == levels)
    require(ok, name, f"a {want} array of score norms", a.shape)
    require(bool(np.all(np.isfinite(a))), name, "finite", "non-finite values")
    return a


def fit_norm_density(
    norms: Array, *, n_components: int = 4, covariance_type: str = "full", seed: int = 0
) -> NormDensity:
    """Fit the auxiliary density of MSMA on in-distribution score-norm vectors.

    Args:
      norms: ``[n, L]`` vectors of in-distribution inputs (:func:`score_norms`), ``L >= 2``.
      n_components: mixture components (``1 <= n_components <= n``).
      covariance_type: scikit-learn's ``'full'``, ``'tied'``, ``'diag'`` or ``'spherical'``.
      seed: the EM initialisation's ``random_state``.

    Returns:
      a :class:`NormDensity`.

    Raises:
      ValueError: naming ``norms`` (not ``[n, L >= 2]``, non-finite, or a level with zero
        spread), ``n_components``, ``covariance_type`` or ``seed``.

    Source: Mahmood et al., ICLR 2021, Sec. 4 (the GMM auxiliary model).
    """
    # scikit-learn takes about 1 s to import: paid on first use only
    from sklearn.mixture import GaussianMixture

    a = _check_features(norms, "norms")
    require(a.shape[1] >= 2, "norms", "[n, L] with L >= 2 noise levels", a.shape)
    n_components = check_int(n_components, "n_components", low=1, high=a.shape[0])
    check_choice(covariance_type, "covariance_type", COVARIANCE_TYPES)
    seed = check_int(seed, "seed", low=0)
    mean, std = a.mean(axis=0), a.std(axis=0)
    require(bool(np.all(std > 0)), "norms", "spread at every level (std > 0)", std.tolist())
    gmm = GaussianMixture(
        n_components=n_components, covariance_type=covariance_type, random_state=seed
    )
    gmm.fit((a - mean) / std)
    return NormDensity(mean=mean, std=std, gmm=gmm)


def select_components(
    norms: Array,
    candidates=range(2, 21),
    *,
    folds: int = 10,
    covariance_type: str = "full",
    seed: int = 0,
) -> dict:
    """The mixture's number of components by K-fold cross-validation, as the authors choose
    it (2 to 20 components, 10 folds; ``ood_detection_helper.py`` of ``ahsanMah/msma``).

    Each candidate is fitted on ``folds - 1`` folds of the standardised vectors (the
    standardisation of :func:`fit_norm_density`, from all of ``norms``) and scored by the
    mean log-likelihood of the held-out fold (scikit-learn's ``GridSearchCV`` with
    ``GaussianMixture.score``); the candidate with the highest mean over folds wins (the
    smallest on a tie).

    Args:
      norms: ``[n, L]`` in-distribution score-norm vectors, ``L >= 2``.
      candidates: component counts to try, each ``>= 1`` and at most the size of a training
        fold (``n - ceil(n / folds)``).
      folds: ``K >= 2``, at most ``n``; the folds are shuffled with ``seed``.
      covariance_type: as :func:`fit_norm_density`.
      seed: the folds' shuffle and every fit's EM initialisation.

    Returns:
      ``{"n_components": int, "cv_loglik": {k: mean held-out log-likelihood per vector
      (nats, standardised units)}}``.

    Raises:
      ValueError: naming ``norms``, ``candidates``, ``folds``, ``covariance_type`` or
        ``seed``, before any fit.

    Source: Mahmood et al., ICLR 2021, Sec. 4; the authors' code.
    """
    # scikit-learn takes about 1 s to import: paid on first use only
    from sklearn.mixture import GaussianMixture
    from sklearn.model_selection import GridSearchCV, KFold

    a = _check_features(norms, "norms")
    require(a.shape[1] >= 2, "norms", "[n, L] with L >= 2 noise levels", a.shape)
    folds = check_int(folds, "folds", low=2, high=a.shape[0])
    check_choice(covariance_type, "covariance_type", COVARIANCE_TYPES)
    seed = check_int(seed, "seed", low=0)
    fold_train = a.shape[0] - -(-a.shape[0] // folds)
    ks = sorted({check_int(k, "candidates", low=1, high=fold_train) for k in candidates})
    require(len(ks) >= 1, "candidates", "at least one component count", list(candidates))
    std = a.std(axis=0)
    require(bool(np.all(std > 0)), "norms", "spread at every level (std > 0)", std.tolist())
    z = (a - a.mean(axis=0)) / std
    search = GridSearchCV(
        GaussianMixture(covariance_type=covariance_type, random_state=seed),
        {"n_components": ks},
        cv=KFold(folds, shuffle=True, random_state=seed),
        refit=False,
    )
    search.fit(z)
    scores = search.cv_results_["mean_test_score"]
    return {
        "n_components": int(search.best_params_["n_components"]),
        "cv_loglik": {int(k): float(v) for k, v in zip(ks, scores, strict=True)},
    }


def ood_scores(density: NormDensity, norms: Array) -> np.ndarray:
    """``-log p(n(x))`` under the fitted mixture: ``[n]`` float64 nats (higher: more OOD).

    The density of the unstandardised vector: the standardised mixture's negative
    log-likelihood plus ``sum_l log std_l``.

    Raises:
      ValueError: naming ``norms`` if it is not ``[n, L]`` with the density's ``L``.
    """
    a = _check_features(norms, "norms", density.levels)
    z = (a - density.mean) / density.std
    return -density.gmm.score_samples(z) + float(np.sum(np.log(density.std)))


def auroc(scores_in: Array, scores_out: Array) -> float:
    """Area under the ROC curve of OOD scores, out-of-distribution the positive class.

    The probability that a random OOD input scores higher than a random in-distribution
    one (ties count one half): 1 separates perfectly, 0.5 is chance (scikit-learn's
    ``roc_auc_score``).

    Args:
      scores_in: ``[n_in]`` scores of in-distribution inputs.
      scores_out: ``[n_out]`` scores of OOD inputs (same orientation: higher = more OOD).

    Raises:
      ValueError: naming ``scores_in`` / ``scores_out`` if not a non-empty 1-D finite array.
    """
    # scikit-learn takes about 1 s to import: paid on first use only
    from sklearn.metrics import roc_auc_score

    arrays = []
    for name, v in (("scores_in", scores_in), ("scores_out", scores_out)):
        check_array(v, name, ("n",))
        a = np.asarray(v, np.float64)
        require(bool(np.all(np.isfinite(a))), name, "finite", "non-finite values")
        arrays.append(a)
    s_in, s_out = arrays
    labels = np.concatenate([np.zeros(s_in.size), np.ones(s_out.size)])
    return float(roc_auc_score(labels, np.concatenate([s_in, s_out])))


def msma(
    source,
    x_fit: Array,
    x_in: Array,
    x_out: Mapping[str, Array],
    sigmas,
    *,
    n_components: int = 4,
    covariance_type: str = "full",
    seed: int = 0,
    batch_size: int | None = None,
) -> dict:
    """MSMA end to end: fit on ``x_fit``'s score norms, score held-out ``x_in`` and each OOD set.

    Args:
      source: any score source.
      x_fit: ``[n_fit, *data_shape]`` in-distribution inputs the mixture is fitted on (e.g.
        the training split).
      x_in: ``[n_in, *data_shape]`` held-out in-distribution inputs (e.g. the test split).
      x_out: ``{name: [n_name, *data_shape]}`` OOD sets (non-empty).
      sigmas: ``[L]`` VE-frame noise levels (:func:`score_norms`).
      n_components, covariance_type, seed: as :func:`fit_norm_density`.
      batch_size: as :func:`score_norms`.

    Returns:
      ``{"auroc": {name: float}, "nll_in": [n_in], "nll_out": {name: [n_name]}, "density":
      NormDensity}``; NLLs in nats.

    Raises:
      ValueError: naming ``x_out`` (empty, or a set whose ``data_shape`` differs from
        ``x_fit``'s), ``x_in`` (likewise), or as :func:`score_norms` and
        :func:`fit_norm_density`, before any score is computed.

    Source: Mahmood et al., ICLR 2021, Sec. 4.
    """
    check_sigmas(sigmas, source.process)
    shape = tuple(np.shape(x_fit)[1:])
    require(isinstance(x_out, Mapping) and len(x_out) >= 1, "x_out", "a non-empty dict", x_out)
    for name, x in [("x_in", x_in)] + [(f"x_out[{k!r}]", v) for k, v in x_out.items()]:
        got = tuple(np.shape(x)[1:])
        require(got == shape, name, f"[n, *data_shape] with x_fit's data_shape {shape}", got)
    density = fit_norm_density(
        score_norms(source, x_fit, sigmas, batch_size=batch_size),
        n_components=n_components,
        covariance_type=covariance_type,
        seed=seed,
    )
    nll_in = ood_scores(density, score_norms(source, x_in, sigmas, batch_size=batch_size))
    nll_out = {
        k: ood_scores(density, score_norms(source, v, sigmas, batch_size=batch_size))
        for k, v in x_out.items()
    }
    return {
        "auroc": {k: auroc(nll_in, v) for k, v in nll_out.items()},
        "nll_in": nll_in,
        "nll_out": nll_out,
        "density": density,
    }
