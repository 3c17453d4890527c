"""Guidance: conditional score sources built from other sources.

Both guidances are :class:`~scorelib.scores.conditional.ConditionalScore` sources that wrap
other sources, so every sampler, ``draw_samples`` and teleportation draw guided samples
unchanged (the driver binds the labels per example); the guidance scale is a pytree leaf,
so a sweep over it compiles once.

**Classifier-free guidance** (Ho and Salimans 2022, "Classifier-free diffusion guidance",
eq. 6), written once on the denoiser (an affine combination with weights summing to one,
so the same on the score, the noise prediction or the velocity)::

    D_w(x, t | c) = D(x, t | null) + w (D(x, t | c) - D(x, t | null))

**Convention** (one for the library): ``w`` is the *lerp weight* of k-diffusion and EDM2
(``cfg_scale``, ``guidance``): ``w = 1`` is the conditional model without guidance, ``w = 0``
the unconditional (guide) model, ``w > 1`` guides. Ho and Salimans write
``(1 + w_HS) D(c) - w_HS D(null)`` with ``w_HS = 0`` unguided: ``w = 1 + w_HS``
(:func:`lerp_weight_from_ho_salimans`). The guide is the model's own null label (one batched
call of ``2 * batch`` examples), or any other source (EDM2's autoguidance guides with a
weaker model). Guidance acts for every ``w != 1`` (below 1 too); at ``w = 1`` the source is
the model itself, bit for bit, and the guide is not evaluated (``lax.cond`` on the scale, so
the scale stays a leaf; EDM2's ``generate_images.py`` skips the guide at 1 likewise).

* ``interval``: Kynkäänniemi et al. 2024 ("Applying guidance in a limited interval
  improves sample and distribution quality in diffusion models", Sec. 3): guidance acts only
  at VE noise levels ``lo < sigma <= hi`` (the paper states the interval in sigma, not in
  step indices); elsewhere the conditional model alone (``w = 1``), and the guide is not
  evaluated there (``lax.cond`` on a call's single noise level), so a step outside costs one
  network evaluation instead of two. Levels within a relative ``1e-5`` of an edge count as
  on it (a grid level mapped to process time and back keeps its side).
* ``filter="tangential"``: TCFG (Kwon et al., CVPR 2025, "Tangential damping classifier-free
  guidance", arXiv 2503.18137), derived here from the paper's description and its public
  ports (ComfyUI's ``nodes_tcfg.py``): per example, the unconditional and conditional
  *scores* (here ``e = x / alpha - D``, the VE-frame noise direction; the score is
  ``-e / sigma^2`` in that frame, and the construction is invariant to the common scale),
  flattened to ``[2, d]``, give by SVD a top right singular vector ``v_1`` (the direction
  both share most); the unconditional one is replaced by its projection ``(e_u . v_1) v_1``
  (its components tangential to the shared direction are damped), then ordinary CFG. The
  filtered pair is not an affine combination, so the score space matters: it is the noise
  direction, as in the ports. ``w = 1`` is still the conditional model exactly.

**Classifier guidance** (Dhariwal and Nichol 2021, eq. 10; Song et al. 2021, "Score-based
generative modelling through SDEs", App. I.4, eq. 49)::

    score_s(x, t | c) = score(x, t) + s grad_x log p_t(c | x)

with ``s = 1`` the conditional score by Bayes' rule (exactly so for an exact classifier),
``s = 0`` unguided; a noise-conditional classifier is any object with
``class_log_prob(x, t, labels) -> [batch]`` and ``num_classes``
(``scorelib.scores.classifier.NoisyClassifier``, or the exact
:meth:`~scorelib.scores.conditional.PerClassScore.class_log_prob`). With an ``interval`` the
scale is ``s`` inside it and 1 outside (the conditional score, as for CFG). The gradient is
that of the batch sum (examples are independent: score_sde's ``models/utils.py``).

Cost: ``info["nfe"]`` of a sampler counts calls of the guided source; CFG with the model's
own null label evaluates the network on ``2 * batch`` examples per call (inside the
interval), classifier guidance the prior and the classifier's forward and backward.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_choice, check_real, require
from scorelib.processes.base import broadcast_to_data
from scorelib.scores.base import ScoreSource, check_query, flatten
from scorelib.scores.conditional import ConditionalScore

Array = Any

FILTERS = ("none", "tangential")
#: Relative tolerance of the interval's edges (a grid level mapped to process time and back).
INTERVAL_RTOL = 1e-5


def lerp_weight_from_ho_salimans(w_hs: float) -> float:
    """The library's CFG weight ``w = 1 + w_HS`` of Ho and Salimans' ``w_HS`` (2022, eq. 6:
    ``(1 + w_HS) D(c) - w_HS D(null)``; ``w_HS = 0`` is the conditional model)."""
    return 1.0 + float(w_hs)


def check_interval(interval) -> tuple[float, float] | None:
    """``interval`` as a float pair ``(lo, hi)`` with ``0 <= lo < hi`` (``hi`` may be inf),
    or ``None``.

    Raises:
      ValueError: naming ``sampler.guidance.interval``.
    """
    if interval is None:
        return None
    field = "sampler.guidance.interval"
    try:
        pair = len(interval) == 2 and not isinstance(interval, str)
    except TypeError:  # a number, not a pair
        pair = False
    require(pair, field, "a pair [lo, hi] of VE noise levels", interval)
    lo = check_real(interval[0], field, low=0.0)
    hi = check_real(interval[1], field, low=0.0, low_open=True, allow_inf=True)
    require(lo < hi, field, "a pair with lo < hi", tuple(interval))
    return lo, hi


def inside_interval(process, t: Array, interval: Array) -> Array:
    """Whether the VE level of ``t`` (scalar or ``[batch]``) lies in ``(lo, hi]``, each edge
    with a relative tolerance :data:`INTERVAL_RTOL`; same shape as ``t``."""
    sigma = process.ve_sigma(t)
    lo, hi = interval[0], interval[1]
    return (sigma > lo * (1 + INTERVAL_RTOL)) & (sigma <= hi * (1 + INTERVAL_RTOL))


def _switch(inside: Array, on, off, x: Array):
    """``on()`` where ``inside``, else ``off()``: one ``lax.cond`` for a scalar ``inside`` (the
    branch not taken is not computed), both and a per-example select otherwise."""
    if jnp.ndim(inside) == 0:
        return jax.lax.cond(inside, on, off)
    return jnp.where(broadcast_to_data(inside, x), on(), off())


def tangential_filter(e_cond: Array, e_uncond: Array) -> Array:
    """TCFG's filtered unconditional direction (module docstring): per example, the
    projection of ``e_uncond`` on the top right singular vector ``v_1`` of the ``[2, d]``
    matrix ``[e_uncond; e_cond]``.

    ``v_1 = M^T u / |M^T u|`` with ``u`` the top eigenvector of the ``2 x 2`` Gram matrix
    ``M M^T`` (``numpy.linalg.eigh``'s order: ascending), which is the SVD's right singular
    vector without forming the ``[d, d]`` side; its sign does not matter. A pair of zero
    vectors gives zero.

    Args:
      e_cond, e_uncond: ``[batch, *data_shape]``.

    Returns:
      ``[batch, *data_shape]``: ``(e_uncond . v_1) v_1``.
    """
    m = jnp.stack([flatten(e_uncond), flatten(e_cond)], axis=1)  # [b, 2, d]
    gram = jnp.einsum("bid,bjd->bij", m, m)
    _, vecs = jnp.linalg.eigh(gram)
    u = vecs[:, :, -1]  # [b, 2], the largest eigenvalue's
    v = jnp.einsum("bi,bid->bd", u, m)
    norm = jnp.linalg.norm(v, axis=-1, keepdims=True)
    v = v / jnp.where(norm > 0, norm, 1.0)
    proj = jnp.sum(flatten(e_uncond) * v, axis=-1, keepdims=True) * v
    return jnp.reshape(proj, e_uncond.shape)


class ClassifierFreeGuidance(ConditionalScore):
    """Classifier-free guidance of a conditional model (module docstring).

    Fields:
      model: the conditional source (:class:`~scorelib.scores.conditional.ConditionalScore`,
        e.g. a class-conditional ``NetworkScore``).
      guide: ``None``: the model at its null label (one batched call); else any source (a
        conditional one is called with the same labels, e.g. a weaker model).
      scale: ``w``, the lerp weight (a leaf; 1: the conditional model, 0: the guide).
      interval: ``[2]`` VE levels ``(lo, hi]`` where guidance acts (a leaf), or ``None``.
      filter: ``"none"`` or ``"tangential"`` (TCFG; static).
    """

    model: Any = None
    guide: Any = None
    scale: Array = 1.0
    interval: Array = None
    filter: str = struct.field(pytree_node=False, default="none")

    @classmethod
    def create(
        cls, model, *, scale: float, guide=None, interval=None, filter: str = "none"
    ) -> ClassifierFreeGuidance:
        """Guide ``model`` with weight ``scale`` (the lerp weight ``w``). A ``model`` already
        conditioned (``model.conditioned(labels)``) passes its labels on: the guided source
        guides towards them (``conditioned`` on the guided source replaces them).

        Raises:
          ValueError: naming ``sampler.guidance.*``: a model that is not conditional or has
            no null label without a ``guide``, a guide on another process or data shape, a
            non-finite scale, a bad interval or filter.
        """
        require(
            isinstance(model, ConditionalScore) and model.num_classes > 0,
            "sampler.guidance",
            "used with a class-conditional model (model.num_classes > 0)",
            type(model).__name__,
        )
        if guide is None:
            require(
                model.allows_null,
                "sampler.guidance.guide",
                "given: the model has no unconditional (null-label) score",
                None,
            )
        else:
            require(
                isinstance(guide, ScoreSource) and guide.process == model.process,
                "sampler.guidance.guide",
                "a score source on the model's process",
                type(guide).__name__,
            )
        scale = check_real(scale, "sampler.guidance.scale")
        check_choice(filter, "sampler.guidance.filter", FILTERS)
        interval = check_interval(interval)
        dtype = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(
            process=model.process,
            labels=model.labels,  # a conditioned model's labels guide (not the null label)
            condition=model.condition,
            model=model,
            guide=guide,
            scale=jnp.asarray(scale, dtype),
            interval=None if interval is None else jnp.asarray(interval, dtype),
            filter=filter,
        )

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    def expected_data_shape(self):
        return self.model.expected_data_shape()

    def inner_sources(self) -> tuple[str, ...]:
        return ("model", "guide")

    def batch_multiple(self) -> int:
        """Twice the model's without a separate guide (both halves in one call)."""
        own = self.model.batch_multiple()
        return 2 * own if self.guide is None else max(own, self.guide.batch_multiple())

    def _pair(self, x, t, labels):
        """``(D(x, t | c), D_guide(x, t))``."""
        if self.guide is None:
            b = x.shape[0]
            t2 = t if jnp.ndim(t) == 0 else jnp.concatenate([t, t])
            both = self.model.denoiser_given(
                jnp.concatenate([x, x]), t2, jnp.concatenate([labels, self.model.null_labels(b)])
            )
            return both[:b], both[b:]
        d_c = self.model.denoiser_given(x, t, labels)
        if isinstance(self.guide, ConditionalScore) and self.guide.num_classes > 0:
            return d_c, self.guide.denoiser_given(x, t, labels)
        return d_c, self.guide.denoiser(x, t)

    def denoiser_given(self, x, t, labels):
        """``D_guide + w (D_c - D_guide)`` (data units; shape of ``x``), the conditional
        ``D_c`` alone outside the interval. Arguments as
        :meth:`~scorelib.scores.conditional.ConditionalScore.denoiser_given`."""
        check_query(self, x, t)

        w = jnp.asarray(self.scale, x.dtype)

        def guided():
            d_c, d_u = self._pair(x, t, labels)
            if self.filter == "tangential":
                x_ve = x / broadcast_to_data(self.process.alpha(t), x)
                d_u = x_ve - tangential_filter(x_ve - d_c, x_ve - d_u)
            return d_u + w * (d_c - d_u)

        # w = 1 is the model itself, exactly and without the guide (EDM2 skips it too);
        # outside the interval likewise. A traced test: the scale stays a leaf.
        on = w != 1
        if self.interval is not None:
            on = on & inside_interval(self.process, t, self.interval)
        return _switch(on, guided, lambda: self.model.denoiser_given(x, t, labels), x)


class ClassifierGuidance(ConditionalScore):
    """Classifier guidance of an unconditional source by a noise-conditional classifier
    (module docstring): ``score(x, t) + s grad_x log p_t(c | x)``.

    Fields:
      prior: the unconditional source (a conditional one is used at its null label).
      classifier: an object with ``class_log_prob(x, t, labels) -> [batch]`` and
        ``num_classes`` (a pytree: a ``NoisyClassifier``, or a ``PerClassScore``).
      scale: ``s`` (a leaf; 1: Bayes, 0: unguided).
      interval: ``[2]`` VE levels ``(lo, hi]`` where the scale is ``s`` (1 elsewhere), or
        ``None``.
    """

    prior: Any = None
    classifier: Any = None
    scale: Array = 1.0
    interval: Array = None

    @classmethod
    def create(cls, prior, classifier, *, scale: float, interval=None) -> ClassifierGuidance:
        """Guide ``prior`` by ``classifier`` with scale ``s``.

        Raises:
          ValueError: naming ``sampler.guidance.*``: a prior that is not a score source, a
            classifier without ``class_log_prob``/``num_classes`` or on another process, a
            non-finite scale, a bad interval.
        """
        require(
            isinstance(prior, ScoreSource),
            "sampler.guidance",
            "a score source to guide",
            type(prior).__name__,
        )
        ok = (
            callable(getattr(classifier, "class_log_prob", None))
            and int(getattr(classifier, "num_classes", 0) or 0) > 0
        )
        require(
            ok,
            "sampler.guidance.classifier",
            "a noise-conditional classifier (class_log_prob(x, t, labels), num_classes >= 1)",
            type(classifier).__name__,
        )
        process = getattr(classifier, "process", prior.process)
        require(
            process == prior.process,
            "sampler.guidance.classifier",
            "a classifier on the prior's process",
            process,
        )
        scale = check_real(scale, "sampler.guidance.scale")
        interval = check_interval(interval)
        dtype = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(
            process=prior.process,
            prior=prior,
            classifier=classifier,
            scale=jnp.asarray(scale, dtype),
            interval=None if interval is None else jnp.asarray(interval, dtype),
        )

    @property
    def num_classes(self) -> int:
        return int(self.classifier.num_classes)

    def expected_data_shape(self):
        return self.prior.expected_data_shape()

    def inner_sources(self) -> tuple[str, ...]:
        return ("prior",)

    def classifier_gradient(self, x: Array, t: Array, labels: Array) -> Array:
        """``grad_x log p_t(c | x)`` per example (units 1 / data; 0 for the null label)."""
        k = self.num_classes
        safe = jnp.minimum(labels, k - 1)
        grad = jax.grad(lambda y: jnp.sum(self.classifier.class_log_prob(y, t, safe)))(x)
        return grad * broadcast_to_data((labels < k).astype(x.dtype), x)

    def score_given(self, x, t, labels):
        """``score(x, t) + s grad_x log p_t(c | x)`` (units 1 / data; shape of ``x``); with an
        interval, ``s`` inside it and 1 outside. Arguments as
        :meth:`~scorelib.scores.conditional.ConditionalScore.score_given`."""
        check_query(self, x, t)
        prior = self.prior
        if isinstance(prior, ConditionalScore) and prior.num_classes > 0:
            base = prior.score_given(x, t, prior.null_labels(x.shape[0]))
        else:
            base = prior.score(x, t)
        s = jnp.asarray(self.scale, x.dtype)
        if self.interval is not None:
            inside = inside_interval(self.process, t, self.interval)
            s = jnp.where(inside, s, jnp.ones_like(s))
            s = broadcast_to_data(s, x) if jnp.ndim(s) else s
        return base + s * self.classifier_gradient(x, t, labels)
