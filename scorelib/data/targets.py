"""Targets with a known score, for target score matching (TSM).

Target score matching (De Bortoli, Hutchinson, Wirnsberger, Doucet, "Target score
matching", arXiv 2402.08667, 2024) needs the *clean* score ``grad log p_0(x_0)`` of
the training distribution, which is available when ``p_0`` is given as a density
(possibly unnormalised, e.g. a Boltzmann density ``exp(-E(x))``). A target here is a
frozen object with

* ``dim`` -- the data dimension ``d`` (examples are ``[batch, d]``);
* ``log_prob(x: [b, d]) -> [b]`` -- the log-density (``normalised`` says whether the
  normalising constant is included);
* ``score(x: [b, d]) -> [b, d]`` -- ``grad_x log p_0(x)``, in closed form where one is
  written, else by ``jax.grad`` of ``log_prob``;
* ``sample(key, n) -> [n, d]`` -- exact samples (example ``i`` from
  ``fold_in(key, i)``, so a sample of ``n`` is a prefix of one of ``n + k``), or a
  ``ValueError`` naming the target and the method that needed samples when the
  target has no exact sampler;
* ``sigma_data`` -- the root-mean-square per-coordinate standard deviation
  ``sqrt(tr Cov[x_0] / d)`` (the ``sigma_d`` of the Gaussian-optimal DSM/TSM mixture);
* ``fisher_scale()`` -- ``sqrt(d / E ||grad log p_0||^2)``, the length scale of the score
  at low noise (Monte Carlo; the ``sigma_fisher`` of the Fisher-scaled preconditioning);
* ``noisy_score(process)`` -- where available, the exact score source of
  ``p_t`` under a noise process (a :class:`scorelib.scores.ScoreSource`).

Classes (``data.labels``). A target whose draw has a natural class says how many in
``num_classes`` (``None``: no classes) and then gives

* ``batch(..., labels=True)``, ``sample_from_keys(keys, labels=True)``,
  ``sample(key, n, labels=True)`` -> ``(x [n, d], y [n] int32)``, the points exactly those
  drawn without labels (the same keys and draws);
* ``score_given(x, labels)`` -- the clean conditional score ``grad_x log p_0(x | c)``, with
  ``c = num_classes`` (the null label) giving the unconditional :meth:`Target.score`: the
  TSM label of a class-conditional model (``scorelib/objectives/tsm.py``);
* ``noisy_score(process, conditional=True)`` -- the exact conditional noisy source, a
  :class:`scorelib.scores.PerClassScore` with the class weights as its prior.

Asking any of these of a target without classes raises ``ValueError`` naming
``data.labels``. :class:`GaussianMixtureTarget`'s class is its component.

Targets are frozen dataclasses registered as *static* pytrees and compared and
hashed by identity (``eq=False``): their arrays are numpy constants folded into
compiled code, and an objective holding a target can be passed into ``jax.jit``.

Targets:

* :class:`GaussianMixtureTarget` -- ``sum_k w_k N(m_k, C_k)`` in any dimension with
  full covariances; closed-form log-density, score and exact sampler; its noisy
  score is :class:`scorelib.scores.MixtureScore`.
* :class:`ManyWellTarget` -- the many-well energy of Midgley et al., "Flow annealed
  importance sampling bootstrap", ICLR 2023, Sec. 5.2 (after Wu, Köhler and Noé
  2020): per pair of coordinates ``log p(x_1, x_2) = -x_1^4 + 6 x_1^2 + 0.5 x_1 -
  x_2^2 / 2`` (a double well times a standard Gaussian), or, with
  ``gaussian_pairs=False``, a product of identical 1-D double wells in every
  coordinate. Exact samples by inverse CDF on a fine 1-D grid; its noisy score
  factorises over coordinates and is computed by 1-D quadrature
  (:class:`scorelib.scores.ManyWellNoisyScore`).
* :class:`EnergyTarget` -- any user energy ``E(x)``, score by ``jax.grad``, no
  exact sampler (an example of a target that can be trained on by TSM only with
  samples from elsewhere).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_choice, check_int, require
from scorelib._pytree import static_pytree
from scorelib.data.batching import batch_keys
from scorelib.keys import example_keys
from scorelib.processes.base import Process
from scorelib.scores.base import ScoreSource
from scorelib.scores.conditional import PerClassScore, check_label_values, select_by_label
from scorelib.scores.gaussian import GaussianScore
from scorelib.scores.manywell import ManyWellNoisyScore
from scorelib.scores.mixture import MixtureScore, mixture_log_prob, mixture_score, mixture_terms

Array = Any

# ---------------------------------------------------------------------------
# the interface
# ---------------------------------------------------------------------------


def _check_x(target: Target, x: Array) -> Array:
    x = jnp.asarray(x)
    require(
        x.ndim == 2 and x.shape[-1] == target.dim,
        f"{target.name}: x",
        f"of shape [batch, {target.dim}]",
        tuple(x.shape),
    )
    return x


def _check_class_labels(labels: Array, batch: int, num_classes: int) -> Array:
    """``labels`` as ``[batch]`` int32 in ``[0, num_classes]`` (``num_classes`` the null label);
    values are range-checked when concrete.

    Raises:
      ValueError: naming ``labels`` for another shape, a non-integer dtype, or a concrete
        label outside ``[0, num_classes]``.
    """
    dtype = labels.dtype if hasattr(labels, "dtype") else np.asarray(labels).dtype
    require(
        np.shape(labels) == (batch,) and np.issubdtype(dtype, np.integer),
        "labels",
        f"integer class labels [{batch}] (one per example)",
        f"dtype {dtype} and shape {np.shape(labels)}",
    )
    if not isinstance(labels, jax.core.Tracer):
        check_label_values(np.asarray(labels), num_classes, "labels")
    return jnp.asarray(labels, jnp.int32)


class Target:
    """Base class of targets with a known (clean) score. See the module docstring.

    Subclasses are frozen dataclasses with ``eq=False`` registered as static pytrees
    and implement ``log_prob`` and either ``score`` or nothing (then the score is
    ``jax.grad`` of ``log_prob``), and ``_sample_one`` when they have an exact sampler.
    """

    name: str = "target"
    dim: int
    normalised: bool = True

    # --- classes ----------------------------------------------------------
    @property
    def num_classes(self) -> int | None:
        """``K``, the number of classes of a draw (labels in ``[0, K)``; ``K`` the null label),
        or ``None`` for a target without classes (the default)."""
        return None

    def require_classes(self, needed_by: str = "labels") -> int:
        """:attr:`num_classes`; raises ``ValueError`` naming ``data.labels`` (and
        ``needed_by``) when the target has no classes."""
        k = self.num_classes
        require(
            k is not None,
            "data.labels",
            f"false for target {self.name!r} ({type(self).__name__}): it has no classes, but "
            f"{needed_by} needs them (a GaussianMixtureTarget's class is its component)",
            True,
        )
        return k

    def _sample_one_labelled(self, key: jax.Array) -> tuple[Array, Array]:
        """``(x [d], class)`` from one key; ``x`` exactly :meth:`_sample_one`'s."""
        raise NotImplementedError

    def score_given(self, x: Array, labels: Array) -> Array:
        """``grad_x log p_0(x | c)``: ``x: [b, d]``, ``labels: [b]`` int in ``[0, K]`` (``K``
        the null label: :meth:`score`) -> ``[b, d]`` (1 / data units).

        Raises:
          ValueError: naming ``data.labels`` for a target without classes.
        """
        self.require_classes("score_given")
        raise NotImplementedError(f"{type(self).__name__} has no conditional score")

    # --- densities --------------------------------------------------------
    def log_prob(self, x: Array) -> Array:
        """``log p_0(x)`` (up to a constant unless ``normalised``); ``x: [b, d] -> [b]``."""
        raise NotImplementedError

    def score(self, x: Array) -> Array:
        """``grad_x log p_0(x)``: ``[b, d] -> [b, d]`` in units of 1/data.

        The default differentiates :meth:`log_prob` with ``jax.grad`` (each example's
        log-density depends only on its own row, so the gradient of the sum is the
        per-example gradient).
        """
        x = _check_x(self, x)
        return jax.grad(lambda z: jnp.sum(self.log_prob(z)))(x)

    # --- sampling ---------------------------------------------------------
    @property
    def has_exact_sampler(self) -> bool:
        """Whether :meth:`sample` draws exact samples (else it raises ``ValueError``)."""
        return type(self)._sample_one is not Target._sample_one

    def _sample_one(self, key: jax.Array) -> Array:
        raise NotImplementedError

    def require_samples(self, needed_by: str) -> None:
        """Raise ``ValueError`` naming this target and ``needed_by`` unless it has exact samples."""
        if not self.has_exact_sampler:
            raise ValueError(
                f"target {self.name!r} ({type(self).__name__}) has no exact sampler, but "
                f"{needed_by} needs exact samples from it; use a target with an exact "
                "sampler (GaussianMixtureTarget, ManyWellTarget) or supply samples yourself"
            )

    def sample_from_keys(
        self, keys: Array, *, needed_by: str = "sample", labels: bool = False
    ) -> Array:
        """Exact samples ``[n, d]`` (float32), example ``i`` drawn from ``keys[i]``; with
        ``labels``, ``(x, y)`` and ``y: [n]`` int32 their classes (the same points).

        Raises:
          ValueError: if the target has no exact sampler (the message names the
            target and ``needed_by``), or naming ``data.labels`` for labels of a target
            without classes.
        """
        self.require_samples(needed_by)
        require(isinstance(labels, bool), "data.labels", "true or false", labels)
        if labels:
            self.require_classes(needed_by)
            return _labelled_samples_from_keys(self, keys)
        return _samples_from_keys(self, keys)

    def sample(
        self, key: jax.Array, n: int, *, needed_by: str = "sample", labels: bool = False
    ) -> Array:
        """``n`` exact samples ``[n, d]``; example ``i`` uses ``fold_in(key, i)``; with
        ``labels``, ``(x, y)`` as :meth:`sample_from_keys`.

        Raises:
          ValueError: if ``n < 1`` or the target has no exact sampler, or naming
            ``data.labels`` for labels of a target without classes.
        """
        self.require_samples(needed_by)
        n = check_int(n, "n", low=1)
        if labels:
            return self.sample_from_keys(example_keys(key, n), needed_by=needed_by, labels=True)
        return _sample_n(self, key, n)

    def batch(
        self,
        batch_size: int,
        *,
        seed,
        step,
        process_index=0,
        needed_by="training",
        labels: bool = False,
    ) -> Array:
        """The training stream: the local batch ``[B, d]`` at ``(seed, step, process_index)``;
        with ``labels``, ``(x, y)`` and ``y: [B]`` int32 the points' classes (the same points).

        Per-example keys from :func:`scorelib.data.batching.batch_keys`, so the
        batch does not depend on how many processes share it; jit-compatible
        (``batch_size`` and ``labels`` static, the integers may be traced).

        Raises:
          ValueError: if ``batch_size < 1`` or the target has no exact sampler, or naming
            ``data.labels`` for labels of a target without classes.
        """
        keys = batch_keys(batch_size, seed=seed, step=step, process_index=process_index)
        return self.sample_from_keys(keys, needed_by=needed_by, labels=labels)

    # --- summaries --------------------------------------------------------
    @property
    def sigma_data(self) -> float:
        """``sqrt(tr Cov[x_0] / d)``: the RMS per-coordinate standard deviation."""
        raise NotImplementedError(f"{type(self).__name__} does not know its sigma_data")

    def fisher_scale(self, n: int = 65_536, seed: int = 0) -> float:
        """``sqrt(d / J_0)`` with ``J_0 = E ||grad log p_0(x_0)||^2`` (the Fisher information
        of the location family; data units), by Monte Carlo over ``n`` exact samples drawn
        from ``key(seed)``, accumulated in float64.

        The length scale of the score at low noise, as ``sigma_data`` is the scale of the
        data: ``sigma_data`` for ``N(mu, sigma_data^2 I)`` and ``sqrt(d / tr C^{-1})`` for
        any Gaussian, and smaller than ``sigma_data`` for data with narrow modes (by the
        Cramér-Rao bound ``J_0 >= d^2 / tr Cov[x_0]``, ``fisher_scale <= sigma_data``). Used by
        :func:`scorelib.nets.precond.fisher_precond`.

        Raises:
          ValueError: if ``n < 2`` or the target has no exact sampler.
        """
        n = check_int(n, "n", low=2)
        x = self.sample(jax.random.key(seed), n, needed_by="fisher_scale")
        total = 0.0
        for i in range(0, n, 8192):  # bounded memory for large d
            s = np.asarray(self.score(x[i : i + 8192]), np.float64)
            total += float(np.sum(s**2))
        return float(np.sqrt(self.dim / (total / n)))

    def noisy_score(self, process: Process, *, conditional: bool = False) -> ScoreSource:
        """The exact score source of ``p_t`` under ``process``, where one is implemented;
        with ``conditional``, the exact class-conditional one (module docstring).

        Raises:
          ValueError: naming ``data.labels`` for ``conditional`` without classes.
          NotImplementedError: for a target without a closed-form noisy score.
        """
        if conditional:
            self.require_classes("noisy_score(conditional=True)")
        raise NotImplementedError(f"{type(self).__name__} has no closed-form noisy score")


@jax.jit
def _samples_from_keys(target: Target, keys: Array) -> Array:
    # the target is a static pytree: one compilation per target object
    return jax.vmap(target._sample_one)(keys).astype(jnp.float32)


@jax.jit
def _labelled_samples_from_keys(target: Target, keys: Array) -> tuple[Array, Array]:
    x, y = jax.vmap(target._sample_one_labelled)(keys)
    return x.astype(jnp.float32), y.astype(jnp.int32)


@partial(jax.jit, static_argnums=2)
def _sample_n(target: Target, key: jax.Array, n: int) -> Array:
    return _samples_from_keys(target, example_keys(key, n))


# ---------------------------------------------------------------------------
# Gaussian mixtures
# ---------------------------------------------------------------------------


@static_pytree
@dataclasses.dataclass(frozen=True, eq=False)
class GaussianMixtureTarget(Target):
    """``p_0 = sum_k w_k N(m_k, C_k)`` in ``d`` dimensions with full covariances.

    Build it with :meth:`create` (validates and precomputes). Fields (numpy, float64):
    ``weights [K]`` (normalised), ``means [K, d]``, ``covs [K, d, d]`` and the
    eigendecompositions ``eigvals [K, d]``, ``eigvecs [K, d, d]`` of the covariances.

    * ``log_prob``: ``logsumexp_k (log w_k + log N(x; m_k, C_k))``, normalised.
    * ``score``: ``sum_k r_k(x) (-C_k^{-1} (x - m_k))`` with responsibilities
      ``r_k = softmax_k``; ``C_k^{-1}`` through the eigendecomposition, never ``inv``.
    * ``sample``: ``k ~ Cat(w)``, ``x = m_k + U_k diag(sqrt(lam_k)) z``.
    * classes: the component ``k`` of a draw is its class (``num_classes = K``);
      ``score_given(x, k) = -C_k^{-1} (x - m_k)``; the conditional noisy source is
      ``N(alpha m_k, alpha^2 C_k + sigma^2 I)`` per class (``noisy_score(process,
      conditional=True)``).
    """

    dim: int = 1
    weights: np.ndarray = None
    means: np.ndarray = None
    covs: np.ndarray = None
    eigvals: np.ndarray = None
    eigvecs: np.ndarray = None
    name: str = "gmm"

    @classmethod
    def create(cls, weights, means, covs=None, *, stds=None, name: str | None = None):
        """Build and validate a mixture.

        Args:
          weights: ``[K]`` positive (normalised here).
          means: ``[K, d]`` (or ``[K]`` for ``d = 1``).
          covs: ``[K, d, d]`` symmetric positive definite covariances; or
          stds: instead of ``covs``, ``[K]`` isotropic standard deviations
            (``C_k = stds_k^2 I``).
          name: a label for messages and tables (default ``gmm{d}d``).

        Raises:
          ValueError: naming ``target.weights``/``target.means``/``target.covs``/
            ``target.stds`` on inconsistent shapes, non-positive weights or stds, a
            covariance that is not symmetric positive definite, or when both or
            neither of ``covs`` and ``stds`` are given.
        """
        w = np.asarray(weights, dtype=np.float64)
        m = np.asarray(means, dtype=np.float64)
        if m.ndim == 1:
            m = m[:, None]
        require(m.ndim == 2 and m.shape[0] >= 1, "target.means", "of shape [K, d]", np.shape(means))
        k, d = m.shape
        ok = w.shape == (k,) and np.all(np.isfinite(w)) and not np.any(w <= 0)
        require(ok, "target.weights", f"{k} positive numbers", weights)
        if (covs is None) == (stds is None):
            raise ValueError("give exactly one of target.covs and target.stds")
        if stds is not None:
            s = np.asarray(stds, dtype=np.float64).reshape(-1)
            require(s.shape == (k,) and np.all(s > 0), "target.stds", f"{k} positive numbers", stds)
            c = (s**2)[:, None, None] * np.eye(d)[None]
        else:
            c = np.asarray(covs, dtype=np.float64)
            if d == 1 and c.shape in ((k,), (k, 1)):
                c = c.reshape(k, 1, 1)
            require(c.shape == (k, d, d), "target.covs", f"of shape ({k}, {d}, {d})", c.shape)
            require(
                np.allclose(c, np.swapaxes(c, -1, -2), rtol=1e-6, atol=1e-9),
                "target.covs",
                "symmetric",
                "an asymmetric matrix",
            )
        lam, u = np.linalg.eigh(0.5 * (c + np.swapaxes(c, -1, -2)))
        if not np.all(lam > 0):
            raise ValueError(
                f"target.covs must be positive definite; smallest eigenvalue {lam.min():.3g}"
            )
        return cls(
            dim=d,
            weights=w / w.sum(),
            means=m,
            covs=c,
            eigvals=lam,
            eigvecs=u,
            name=name if name is not None else f"gmm{d}d",
        )

    # jnp constants (float32) used inside traced code
    def _consts(self):
        f = jnp.float32
        return (
            jnp.asarray(np.log(self.weights), f),
            jnp.asarray(self.means, f),
            jnp.asarray(self.eigvals, f),
            jnp.asarray(self.eigvecs, f),
        )

    def _terms(self, x):
        """The library's mixture terms (``scorelib/scores/mixture.py``) at ``alpha = 1``,
        ``sigma = 0``: the clean density."""
        logw, m, lam, u = self._consts()
        return mixture_terms(
            _check_x(self, x),
            log_weights=logw,
            means=m,
            eigvecs=u,
            eigvals=lam,
            alpha=1.0,
            sigma=0.0,
        )

    def log_prob(self, x):
        """``logsumexp_k (log w_k + log N(x; m_k, C_k))`` (normalised): ``[b, d] -> [b]``.

        Raises:
          ValueError: unless ``x`` is ``[b, dim]``.
        """
        return mixture_log_prob(self._terms(x)[0])

    def score(self, x):
        """``sum_k r_k(x) (-C_k^{-1} (x - m_k))``: ``[b, d] -> [b, d]`` (1 / data units).

        Raises:
          ValueError: unless ``x`` is ``[b, dim]``.
        """
        return mixture_score(*self._terms(x))

    def _sample_one(self, key):
        return self._sample_one_labelled(key)[0]

    def _sample_one_labelled(self, key):
        logw, m, lam, u = self._consts()
        kc, kz = jax.random.split(key)
        k = jax.random.categorical(kc, logw)
        z = jax.random.normal(kz, (self.dim,), jnp.float32)
        return m[k] + u[k] @ (jnp.sqrt(lam[k]) * z), k

    @property
    def num_classes(self) -> int:
        """``K``, the number of components: a draw's class is its component."""
        return int(self.weights.shape[0])

    def score_given(self, x, labels):
        """``grad_x log p_0(x | k) = -C_k^{-1} (x - m_k)`` of each example's component ``k``
        (the component scores of :func:`scorelib.scores.mixture.mixture_terms`); the null
        label ``K`` gives the mixture's :meth:`score`.

        Args:
          x: ``[b, d]`` (data units).
          labels: ``[b]`` int in ``[0, K]`` (traced values are not range-checked; a
            concrete array is).

        Returns:
          ``[b, d]`` (1 / data units).

        Raises:
          ValueError: unless ``x`` is ``[b, dim]`` and ``labels`` integer ``[b]``; naming
            ``labels`` for a concrete label outside ``[0, K]``.
        """
        log_joint, comp = self._terms(x)
        labels = _check_class_labels(labels, x.shape[0], self.num_classes)
        k = self.num_classes
        own = select_by_label(jnp.swapaxes(comp, 0, 1), jnp.minimum(labels, k - 1))
        return jnp.where((labels == k)[:, None], mixture_score(log_joint, comp), own)

    @property
    def mean(self) -> np.ndarray:
        """``[d]`` mixture mean ``sum_k w_k m_k``."""
        return self.weights @ self.means

    @property
    def covariance(self) -> np.ndarray:
        """``[d, d]`` mixture covariance ``sum_k w_k (C_k + m_k m_k^T) - mu mu^T``."""
        mu = self.mean
        second = np.einsum(
            "k,kij->ij", self.weights, self.covs + self.means[:, :, None] * self.means[:, None, :]
        )
        return second - np.outer(mu, mu)

    @property
    def sigma_data(self) -> float:
        """``sqrt(tr Cov[x_0] / d)`` (data units), from :attr:`covariance`."""
        return float(np.sqrt(np.trace(self.covariance) / self.dim))

    def noisy_score(self, process: Process, *, conditional: bool = False):
        """``p_t = sum_k w_k N(alpha m_k, alpha^2 C_k + sigma^2 I)`` as a :class:`MixtureScore`;
        with ``conditional``, the exact class-conditional source: a
        :class:`~scorelib.scores.PerClassScore` of one ``GaussianScore`` per component
        (``N(alpha m_k, alpha^2 C_k + sigma^2 I)``) with the weights ``w_k`` as its prior,
        whose null label is the mixture and whose ``class_log_prob`` is the exact noisy
        classifier ``log p_t(k | x)``.
        """
        if not conditional:
            return MixtureScore.create(
                process, self.weights, self.means.astype(np.float32), self.covs.astype(np.float32)
            )
        classes = [
            GaussianScore.from_covariance(process, self.means[k], self.covs[k])
            for k in range(self.num_classes)
        ]
        return PerClassScore.create(classes, prior=self.weights)


def random_gaussian_mixture(
    dim: int,
    n_components: int = 4,
    *,
    seed: int = 0,
    mean_scale: float = 2.0,
    var_range: tuple[float, float] = (0.05, 0.5),
    name: str | None = None,
) -> GaussianMixtureTarget:
    """A reproducible random mixture with full covariances.

    Means ``m_k ~ N(0, mean_scale^2 I)``, weights ``Dirichlet(5, ..., 5)``,
    covariances ``Q_k diag(lam_k) Q_k^T`` with a Haar-random rotation ``Q_k`` and
    ``lam_k`` log-uniform in ``var_range``. Drawn with ``numpy.random.default_rng(seed)``.

    Raises:
      ValueError: for ``dim < 1``, ``n_components < 1`` or a bad ``var_range``.
    """
    check_int(dim, "target.dim", low=1)
    check_int(n_components, "target.n_components", low=1)
    lo, hi = (float(v) for v in var_range)
    require(0 < lo <= hi, "target.var_range", "a pair with 0 < lo <= hi", var_range)
    rng = np.random.default_rng(seed)
    k, d = int(n_components), int(dim)
    weights = rng.dirichlet(np.full(k, 5.0))
    means = mean_scale * rng.standard_normal((k, d))
    covs = np.empty((k, d, d))
    for i in range(k):
        q, r = np.linalg.qr(rng.standard_normal((d, d)))
        q = q * np.sign(np.diag(r))[None, :]
        lam = np.exp(rng.uniform(np.log(lo), np.log(hi), d))
        covs[i] = (q * lam) @ q.T
    return GaussianMixtureTarget.create(weights, means, covs, name=name or f"gmm{d}d")


# ---------------------------------------------------------------------------
# many-well
# ---------------------------------------------------------------------------

_TAIL_NATS = 80.0  # grid ends where the 1-D density is exp(-80) below its maximum


@static_pytree
@dataclasses.dataclass(frozen=True, eq=False)
class ManyWellTarget(Target):
    """Many-well: a product of 1-D double wells (and standard Gaussians).

    One double well has energy ``E(x) = a x^4 - b x^2 - c x``; the defaults
    ``a, b, c = 1, 6, 0.5`` are those of Midgley et al., ICLR 2023 (Sec. 5.2, the
    "Many Well" problem, from Wu, Köhler and Noé 2020): two modes near
    ``x = +-1.7`` separated by a barrier of about 9-10 nats, the right mode about
    5.7 times as heavy as the left.

    * ``gaussian_pairs=True`` (Midgley et al.): ``dim`` must be even; coordinates
      ``0, 2, 4, ...`` are double wells and ``1, 3, 5, ...`` standard normals, i.e.
      ``dim / 2`` copies of the 2-D double well ``exp(-E(x_1) - x_2^2 / 2)``;
      ``2^(dim/2)`` modes.
    * ``gaussian_pairs=False``: every coordinate is a double well; ``2^dim`` modes.

    ``log_prob`` is normalised: ``log Z_1 = log int exp(-E)`` by the trapezoid rule
    on ``grid_size`` points in float64 (relative error far below float32
    resolution). ``score`` is ``jax.grad`` of ``log_prob`` (checked against the
    closed form ``-E'(x) = -4 a x^3 + 2 b x + c`` in the tests). Exact samples by
    inverse CDF: the cumulative trapezoid CDF on the same grid, inverted by linear
    interpolation (exact up to the grid resolution ``h ~ 4e-4`` and the float32
    resolution of the uniform draw, ``~1e-7`` of tail mass).

    Build with ``ManyWellTarget.create(dim, ...)``.

    Raises (create):
      ValueError: for ``dim < 1``, odd ``dim`` with ``gaussian_pairs``, ``a <= 0``,
        ``grid_size < 101``.
    """

    dim: int = 8
    a: float = 1.0
    b: float = 6.0
    c: float = 0.5
    gaussian_pairs: bool = True
    grid: np.ndarray = None  # [G] float64 1-D grid covering the double well
    cdf: np.ndarray = None  # [G] float64 CDF on the grid, 0 ... 1
    log_z1: float = 0.0  # log normaliser of one double well
    well_mean: float = 0.0
    well_var: float = 0.0
    name: str = "manywell"

    @classmethod
    def create(
        cls,
        dim: int = 8,
        *,
        a: float = 1.0,
        b: float = 6.0,
        c: float = 0.5,
        gaussian_pairs: bool = True,
        grid_size: int = 20001,
        name: str | None = None,
    ) -> ManyWellTarget:
        """Build the target: tabulate one double well's density and CDF in float64.

        Args:
          dim: data dimension ``d`` (even when ``gaussian_pairs``).
          a, b, c: the double-well energy ``E(x) = a x^4 - b x^2 - c x`` (``a > 0``).
          gaussian_pairs: odd coordinates standard normal (Midgley et al.) or all wells.
          grid_size: points of the 1-D grid (>= 101) for the normaliser and the CDF.
          name: a label for messages and tables (default ``manywell{d}d``).

        Raises:
          ValueError: naming the field, as in the class docstring.
        """
        dim = check_int(dim, "target.dim", low=1)
        require(
            not (gaussian_pairs and dim % 2),
            "target.dim",
            "even when target.gaussian_pairs is true",
            dim,
        )
        require(a > 0, "target.a", "> 0 (a confining quartic)", a)
        check_int(grid_size, "target.grid_size", low=101)
        a, b, c = float(a), float(b), float(c)

        def neg_energy(x):
            return -(a * x**4 - b * x**2 - c * x)

        # A generous range, then trim it to where the density is within _TAIL_NATS of its max.
        r = (
            1.0
            + 2.0 * math.sqrt(max(b, 0.0) / a)
            + (abs(c) / a) ** (1 / 3)
            + (4 * _TAIL_NATS / a) ** 0.25
        )
        coarse = np.linspace(-r, r, 200001)
        lp = neg_energy(coarse)
        keep = np.nonzero(lp >= lp.max() - _TAIL_NATS)[0]
        lo, hi = coarse[max(keep[0] - 1, 0)], coarse[min(keep[-1] + 1, coarse.size - 1)]
        grid = np.linspace(lo, hi, int(grid_size))
        lp = neg_energy(grid)
        shift = lp.max()
        p = np.exp(lp - shift)
        h = grid[1] - grid[0]
        cum = np.concatenate([[0.0], np.cumsum(0.5 * h * (p[1:] + p[:-1]))])
        z = cum[-1]
        cdf = cum / z
        mean = float(np.trapezoid(grid * p, grid) / z)
        var = float(np.trapezoid((grid - mean) ** 2 * p, grid) / z)
        return cls(
            dim=dim,
            a=a,
            b=b,
            c=c,
            gaussian_pairs=bool(gaussian_pairs),
            grid=grid,
            cdf=cdf,
            log_z1=float(np.log(z) + shift),
            well_mean=mean,
            well_var=var,
            name=name if name is not None else f"manywell{dim}d",
        )

    # --- structure ----------------------------------------------------------
    @property
    def well_mask(self) -> np.ndarray:
        """``[d]`` bool: which coordinates are double wells (the rest are N(0, 1))."""
        idx = np.arange(self.dim)
        return (idx % 2 == 0) if self.gaussian_pairs else np.ones(self.dim, bool)

    @property
    def n_wells(self) -> int:
        """Number of double-well coordinates."""
        return int(self.well_mask.sum())

    def neg_energy_1d(self, x: Array) -> Array:
        """Unnormalised 1-D double-well log-density ``-E(x) = -a x^4 + b x^2 + c x``."""
        return -(self.a * x**4 - self.b * x**2 - self.c * x)

    def grad_neg_energy_1d(self, x: Array) -> Array:
        """``-E'(x) = -4 a x^3 + 2 b x + c`` (elementwise)."""
        return -4.0 * self.a * x**3 + 2.0 * self.b * x + self.c

    # --- density ------------------------------------------------------------
    def log_prob(self, x):
        """Normalised ``sum_i log p(x_i)`` over the coordinates: ``[b, d] -> [b]``.

        Raises:
          ValueError: unless ``x`` is ``[b, dim]``.
        """
        x = _check_x(self, x)
        mask = jnp.asarray(self.well_mask)
        per = jnp.where(mask, self.neg_energy_1d(x), -0.5 * x**2)
        n_g = self.dim - self.n_wells
        log_z = self.n_wells * self.log_z1 + 0.5 * n_g * math.log(2 * math.pi)
        return jnp.sum(per, axis=-1) - log_z

    # score: jax.grad of log_prob (the base-class default)

    def _sample_one(self, key):
        ku, kn = jax.random.split(key)
        # keep only strictly increasing float32 CDF values so the inverse is well defined
        cdf32 = self.cdf.astype(np.float32)
        keep = np.concatenate([[True], np.diff(cdf32) > 0])
        cdf = jnp.asarray(cdf32[keep])
        grid = jnp.asarray(self.grid[keep].astype(np.float32))
        u = jax.random.uniform(ku, (self.dim,), jnp.float32)
        wells = jnp.interp(u, cdf, grid)
        gauss = jax.random.normal(kn, (self.dim,), jnp.float32)
        return jnp.where(jnp.asarray(self.well_mask), wells, gauss)

    @property
    def sigma_data(self) -> float:
        """``sqrt(tr Cov[x_0] / d)`` (data units) from the quadrature variance of a well."""
        n_w = self.n_wells
        return float(np.sqrt((n_w * self.well_var + (self.dim - n_w) * 1.0) / self.dim))

    def noisy_score(self, process: Process, *, conditional: bool = False) -> ManyWellNoisyScore:
        """The exact ``p_t`` score under ``process`` by 1-D quadrature
        (:class:`scorelib.scores.ManyWellNoisyScore`).

        Raises:
          ValueError: naming ``data.labels`` for ``conditional`` (the wells have no classes).
        """
        if conditional:
            self.require_classes("noisy_score(conditional=True)")
        return ManyWellNoisyScore(process=process, target=self)


# ---------------------------------------------------------------------------
# energies without an exact sampler
# ---------------------------------------------------------------------------


@static_pytree
@dataclasses.dataclass(frozen=True, eq=False)
class EnergyTarget(Target):
    """An unnormalised Boltzmann target ``p_0 ∝ exp(-energy(x))`` with no exact sampler.

    ``energy`` maps ``[b, d] -> [b]`` (jax-traceable). ``score`` is ``-grad energy``
    by ``jax.grad``. ``sample`` raises ``ValueError`` naming the target and the
    method that needed samples.
    """

    dim: int = 1
    energy: Callable[[Array], Array] = None
    normalised: bool = False
    name: str = "energy"

    def log_prob(self, x):
        """``-energy(x)`` (unnormalised): ``[b, d] -> [b]``.

        Raises:
          ValueError: unless ``x`` is ``[b, dim]``.
        """
        x = _check_x(self, x)
        return -self.energy(x)


# ---------------------------------------------------------------------------
# building targets from configs
# ---------------------------------------------------------------------------

TARGET_KINDS = ("gmm", "gmm_random", "manywell")


def make_target(kind: str, **kwargs) -> Target:
    """Build a target by name (for configs).

    * ``'gmm'``: :meth:`GaussianMixtureTarget.create` (``weights``, ``means``,
      ``covs`` or ``stds``, ``name``);
    * ``'gmm_random'``: :func:`random_gaussian_mixture` (``dim``, ``n_components``,
      ``seed``, ``mean_scale``, ``var_range``, ``name``);
    * ``'manywell'``: :meth:`ManyWellTarget.create` (``dim``, ``a``, ``b``, ``c``,
      ``gaussian_pairs``, ``grid_size``, ``name``).

    Raises:
      ValueError: for an unknown ``kind`` (naming ``target.kind``) or bad arguments.
    """
    check_choice(kind, "target.kind", TARGET_KINDS)
    if kind == "gmm":
        return GaussianMixtureTarget.create(**kwargs)
    if kind == "gmm_random":
        if "var_range" in kwargs:
            kwargs["var_range"] = tuple(kwargs["var_range"])
        return random_gaussian_mixture(**kwargs)
    return ManyWellTarget.create(**kwargs)


def gmm_1d() -> GaussianMixtureTarget:
    """The 1-D three-component mixture used in the TSM low-noise table.

    ``0.3 N(-2, 0.4^2) + 0.4 N(0, 0.2^2) + 0.3 N(2.5, 0.6^2)``: modes of different
    widths, the narrowest (0.2) setting the noise level below which the posterior
    of ``x_0`` given ``x_t`` concentrates on one mode.
    """
    return GaussianMixtureTarget.create(
        weights=[0.3, 0.4, 0.3], means=[[-2.0], [0.0], [2.5]], stds=[0.4, 0.2, 0.6], name="gmm1d"
    )


__all__ = [
    "TARGET_KINDS",
    "EnergyTarget",
    "GaussianMixtureTarget",
    "ManyWellTarget",
    "Target",
    "gmm_1d",
    "make_target",
    "random_gaussian_mixture",
]
