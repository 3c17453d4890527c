"""Class-conditional score sources: the label is a property of the source, bound per example.

A conditional source answers ``score(x, t | c) = grad_x log p_t(x | c)`` and the denoiser
``D(x, t | c) = E[x_0 | x_t = x, c]`` for integer class labels ``c`` in ``[0, K)``; the label
``K`` (:attr:`ConditionalScore.null_label`) is the *null* label, the unconditional score
``grad_x log p_t(x)`` (EDM's zero class vector, Karras et al. 2022, ``training/networks.py``;
k-diffusion's extra class row). It implements one of :meth:`ConditionalScore.denoiser_given`
or :meth:`ConditionalScore.score_given` (labels explicit, Tweedie written once in
``scores/base.py``), and is still a plain :class:`~scorelib.scores.ScoreSource`: its
``denoiser(x, t)`` and ``score(x, t)`` use the labels bound to the examples of the call.

Binding. The source holds a rule from an example's *global index* to its label
(:class:`Labels`: a table with repeats, or a uniform draw from the example's key) and
:meth:`ConditionalScore.for_examples` turns it into ``[batch]`` labels for examples
``first_index .. first_index + batch - 1``, as a random source binds its keys
(``SmoothedScore``). Every sampler's driver binds the source for each block of examples it
runs (``scorelib/samplers/driver.py``), so every sampler, ``draw_samples`` over many batches,
teleportation and several devices draw conditional samples unchanged, and a sample depends
on its key and global index only. Training binds the batch's labels directly
(:meth:`ConditionalScore.with_labels`).

Sources that wrap other sources (guidance, ``scorelib/scores/guidance.py``) call the inner
source with explicit labels and bind its own draws with :meth:`ConditionalScore.for_examples`
of the wrapper (:meth:`ConditionalScore.inner_sources`).

Exact conditional sources for tests and tables: :class:`PerClassScore` (one source per class:
a class's Gaussian, a mixture of a class's components, the training set restricted to a
class), with the unconditional score and the exact classifier ``log p_t(c | x)`` from the
classes' log-densities when they have them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_int, is_int, require
from scorelib.keys import LABEL_SALT, example_keys
from scorelib.scores.base import ScoreSource, check_query, denoiser_from_score, score_from_denoiser

Array = Any


def check_label_values(values, num_classes: int, field: str = "labels") -> np.ndarray:
    """``values`` as an int32 numpy array of labels in ``[0, num_classes]`` (``num_classes``
    is the null label).

    Raises:
      ValueError: naming ``field`` for non-integers, or labels outside ``[0, num_classes]``.
    """
    arr = np.asarray(values)
    ok = arr.size >= 1 and (
        np.issubdtype(arr.dtype, np.integer)
        or (
            np.issubdtype(arr.dtype, np.floating)
            and bool(np.all(np.isfinite(arr) & (arr == np.round(arr))))
        )
    )
    require(ok, field, f"integer class labels in [0, {num_classes}] ({num_classes}: null)", values)
    # the range is checked before the cast, so a float label beyond int64 is not wrapped
    bad = arr[(arr < 0) | (arr > num_classes)]
    require(
        bad.size == 0,
        field,
        f"class labels in [0, {num_classes - 1}] (or {num_classes}, the null label)",
        bad[0].item() if bad.size else None,
    )
    return arr.astype(np.int32)


class Labels(struct.PyTreeNode):
    """Which class each example of a draw is conditioned on, by the example's global index.

    Example ``i`` (its index among all samples of a draw, ``first_index + b``) gets

    * ``values[(i // repeats) % M]`` when ``values: [M]`` is given: ``M`` labels, each held
      by ``repeats`` consecutive examples, the table repeated over the draw;
    * a uniform class in ``[0, num_classes)`` from its own key,
      ``randint(fold_in(k_i, LABEL_SALT))`` with ``k_i = fold_in(key, i)`` the example's
      key of the sampler (:data:`scorelib.keys.LABEL_SALT`), when ``values`` is ``None``.

    Build with :meth:`given`, :meth:`constant`, :meth:`balanced` or :meth:`uniform`.

    Fields:
      values: ``[M]`` int32 labels (leaf), or ``None`` for uniform draws.
      repeats: consecutive examples per entry of ``values`` (static, ``>= 1``).
      num_classes: ``K`` (static): labels lie in ``[0, K]``, ``K`` the null label.
    """

    values: Array = None
    repeats: int = struct.field(pytree_node=False, default=1)
    num_classes: int = struct.field(pytree_node=False, default=0)

    @classmethod
    def given(cls, values, num_classes: int, repeats: int = 1) -> Labels:
        """A table of labels (``num_classes`` for the null label), each held by ``repeats``
        consecutive examples.

        Raises:
          ValueError: naming ``sampler.labels`` for labels outside ``[0, num_classes]``,
            ``num_classes`` below 1 or ``repeats`` below 1.
        """
        k = check_int(num_classes, "model.num_classes", low=1)
        arr = check_label_values(np.ravel(values), k, "sampler.labels")
        return cls(
            values=jnp.asarray(arr),
            repeats=check_int(repeats, "sampler.labels_repeats", low=1),
            num_classes=k,
        )

    @classmethod
    def constant(cls, label: int, num_classes: int) -> Labels:
        """Every example gets ``label`` (``num_classes``: the null label, unconditional)."""
        return cls.given([label], num_classes)

    @classmethod
    def balanced(cls, num_classes: int, repeats: int = 1) -> Labels:
        """Classes ``0 .. K-1`` in turn (``repeats`` consecutive examples each): any
        ``K * repeats`` consecutive examples hold every class equally often."""
        return cls.given(
            np.arange(check_int(num_classes, "model.num_classes", low=1)), num_classes, repeats
        )

    @classmethod
    def uniform(cls, num_classes: int) -> Labels:
        """A uniform class in ``[0, num_classes)`` for each example, from its own key."""
        return cls(num_classes=check_int(num_classes, "model.num_classes", low=1))

    def take(self, key, first_index: Array, batch: int) -> Array:
        """``[batch]`` int32 labels of examples ``first_index .. first_index + batch - 1``
        (jit-safe with a traced ``first_index``).

        Args:
          key: the draw's PRNG key (used by uniform labels only).
          first_index: the global index of the first example (int or traced int scalar).
          batch: a Python int ``>= 1``.
        """
        if self.values is None:
            keys = example_keys(key, batch, first_index)

            def one(k):
                k = jax.random.fold_in(k, LABEL_SALT)
                return jax.random.randint(k, (), 0, self.num_classes, dtype=jnp.int32)

            return jax.vmap(one)(keys)
        idx = jnp.asarray(first_index, jnp.int32) + jnp.arange(batch, dtype=jnp.int32)
        m = self.values.shape[0]
        return jnp.take(self.values, (idx // self.repeats) % m).astype(jnp.int32)


def as_labels(labels, num_classes: int) -> Labels:
    """``labels`` as a :class:`Labels` rule: a rule itself, an int (every example that class),
    or a sequence or array of labels (a table by global index)."""
    if isinstance(labels, Labels):
        require(
            labels.num_classes == num_classes,
            "sampler.labels",
            f"a Labels rule of {num_classes} classes (the source's)",
            f"{labels.num_classes} classes",
        )
        return labels
    if is_int(labels):
        return Labels.constant(int(labels), num_classes)
    return Labels.given(labels, num_classes)


class ConditionalScore(ScoreSource):
    """A score source conditioned on a class label per example (module docstring).

    Subclasses give :attr:`num_classes` and implement :meth:`denoiser_given` or
    :meth:`score_given`; a wrapper of other sources lists them in :meth:`inner_sources`.

    Fields:
      labels: ``[batch]`` int32 labels bound to the examples of a call (``num_classes`` the
        null label), or ``None``.
      condition: the unbound rule (:class:`Labels`) that :meth:`for_examples` turns into
        ``labels``, or ``None``.

    With neither, ``denoiser``/``score`` give the unconditional answer (the null label) when
    the source has one (:attr:`allows_null`), and raise otherwise.
    """

    labels: Array = None
    condition: Any = None

    # ------------------------------------------------------------------ what subclasses give
    @property
    def num_classes(self) -> int:
        """``K``: labels lie in ``[0, K)``; ``K`` is the null label."""
        raise NotImplementedError

    @property
    def allows_null(self) -> bool:
        """Whether the null label (the unconditional score) is defined for this source."""
        return True

    def inner_sources(self) -> tuple[str, ...]:
        """Names of the fields holding score sources that :meth:`for_examples` binds too."""
        return ()

    def denoiser_given(self, x: Array, t: Array, labels: Array) -> Array:
        """``E[x_0 | x_t = x, c]`` (data units); shape of ``x``.

        Args:
          x: ``[batch, *data_shape]`` in process coordinates.
          t: scalar or ``[batch]`` process time.
          labels: ``[batch]`` int32 in ``[0, num_classes]`` (``num_classes``: null).

        Default: Tweedie from :meth:`score_given`.
        """
        if type(self).score_given is ConditionalScore.score_given:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither score_given nor denoiser_given"
            )
        return denoiser_from_score(self.process, x, t, self.score_given(x, t, labels))

    def score_given(self, x: Array, t: Array, labels: Array) -> Array:
        """``grad_x log p_t(x | c)`` (units 1 / data); shape of ``x``. Arguments as
        :meth:`denoiser_given`. Default: Tweedie from :meth:`denoiser_given`."""
        if type(self).denoiser_given is ConditionalScore.denoiser_given:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither score_given nor denoiser_given"
            )
        return score_from_denoiser(self.process, x, t, self.denoiser_given(x, t, labels))

    # ------------------------------------------------------------------ the bound source
    @property
    def null_label(self) -> int:
        """The label of the unconditional score, ``num_classes``."""
        return self.num_classes

    def null_labels(self, batch: int) -> Array:
        """``[batch]`` int32 null labels."""
        return jnp.full((batch,), self.num_classes, jnp.int32)

    def bound_labels(self, batch: int) -> Array:
        """The ``[batch]`` labels of a call: the bound ones, else the null label.

        Raises:
          ValueError: bound labels for another batch size; a ``condition`` that was never
            bound (:meth:`for_examples`); no labels at all for a source without a null label.
        """
        if self.labels is not None:
            require(
                tuple(self.labels.shape) == (batch,),
                f"{type(self).__name__}.labels",
                f"one label per example of the batch ({batch}); bind them with "
                f"for_examples(key, {batch}, first_index) or with_labels",
                f"shape {tuple(self.labels.shape)}",
            )
            return self.labels
        require(
            self.condition is None,
            f"{type(self).__name__}.labels",
            f"bound before the source is called: for_examples(key, {batch}, first_index) "
            "(every sampler does it)",
            None,
        )
        require(
            self.allows_null,
            f"{type(self).__name__}.labels",
            "given: this source has no unconditional (null-label) score; condition it with "
            ".conditioned(labels)",
            None,
        )
        return self.null_labels(batch)

    def denoiser(self, x, t):
        """:meth:`denoiser_given` with the labels bound to the call (:meth:`bound_labels`)."""
        batch = check_query(self, x, t)
        return self.denoiser_given(x, t, self.bound_labels(batch))

    def score(self, x, t):
        """:meth:`score_given` with the labels bound to the call (:meth:`bound_labels`)."""
        batch = check_query(self, x, t)
        return self.score_given(x, t, self.bound_labels(batch))

    def conditioned(self, labels) -> ConditionalScore:
        """A copy conditioned on ``labels`` by global index: a :class:`Labels` rule, an int
        (every example that class; ``num_classes`` is unconditional) or a sequence of labels
        (example ``i`` gets ``labels[i % len(labels)]``).

        Raises:
          ValueError: naming ``sampler.labels`` for labels outside ``[0, num_classes]``, or
            for any labels when the source is unconditional (``num_classes = 0``).
        """
        require(
            self.num_classes > 0,
            "sampler.labels",
            "None for an unconditional model (model.num_classes = 0)",
            labels,
        )
        return self.replace(condition=as_labels(labels, self.num_classes), labels=None)

    def with_labels(self, labels: Array) -> ConditionalScore:
        """A copy with ``labels: [batch]`` bound directly (training: the batch's labels)."""
        return self.replace(labels=jnp.asarray(labels, jnp.int32), condition=None)

    def for_examples(self, key, batch: int, first_index: Array = 0) -> ConditionalScore:
        """A copy bound to examples ``first_index .. first_index + batch - 1`` of ``key``:
        its labels from ``condition`` (kept as they are without one) and every inner
        source's own binding (:meth:`inner_sources`)."""
        out = self
        for name in self.inner_sources():
            inner = getattr(self, name)
            if isinstance(inner, ScoreSource):
                out = out.replace(**{name: inner.for_examples(key, batch, first_index)})
        if self.condition is not None:
            out = out.replace(labels=self.condition.take(key, first_index, batch))
        return out


def is_conditional(source) -> bool:
    """Whether ``source`` is a :class:`ConditionalScore` with at least one class."""
    return isinstance(source, ConditionalScore) and source.num_classes > 0


def select_by_label(values: Array, labels: Array) -> Array:
    """``out[b] = values[labels[b], b]`` for ``values: [K, batch, ...]`` and ``labels: [batch]``
    in ``[0, K)``."""
    return jnp.take_along_axis(values, labels.reshape((1, -1) + (1,) * (values.ndim - 2)), axis=0)[
        0
    ]


class PerClassScore(ConditionalScore):
    """The exact conditional source of classes given one source each.

    ``score(x, t | c) = sources[c].score(x, t)``; e.g. ``GaussianScore`` fitted to each
    class (``fit_gaussian`` of the class's examples), a ``MixtureScore`` of a class's
    components, the ``EmpiricalScore`` of a class's training examples. Every class's source
    is evaluated on the whole batch and each example takes its own class's answer: ``K``
    evaluations, whose cost is that of one pooled evaluation for the training set (the
    classes split its points).

    The null label is the mixture of the classes with prior weights ``pi_c``: the pooled
    law ``p_t(x) = sum_c pi_c p_t(x | c)``, whose denoiser is the class-posterior-weighted
    mean of the classes' denoisers (``D`` is linear in the law). It needs each class's
    ``log_prob(x, t)`` (``GaussianScore``, ``MixtureScore``, ``EmpiricalScore`` have it),
    which also gives the exact noisy classifier :meth:`class_log_prob`; or an explicit
    ``null`` source.

    Fields:
      sources: a tuple of ``K`` score sources on the same process and data shape.
      log_prior: ``[K]`` normalised log class weights ``log pi_c``.
      null: the unconditional source, or ``None`` (then from the log-densities).
    """

    sources: tuple = ()
    log_prior: Array = None
    null: Any = None

    @classmethod
    def create(cls, sources, prior=None, null=None) -> PerClassScore:
        """Build from one source per class, optional class weights ``prior: [K]`` (positive;
        default uniform) and an optional unconditional ``null`` source.

        Raises:
          ValueError: naming ``sources`` (fewer than one, processes or data shapes that
            differ), ``prior`` (not ``K`` positive numbers) or ``null``.
        """
        sources = tuple(sources)
        require(
            len(sources) >= 1 and all(isinstance(s, ScoreSource) for s in sources),
            "sources",
            "one score source per class",
            [type(s).__name__ for s in sources],
        )
        process = sources[0].process
        require(
            all(s.process == process for s in sources),
            "sources",
            "sources on one process",
            [s.process for s in sources],
        )
        shapes = {s.expected_data_shape()[0] for s in sources}
        require(len(shapes) == 1, "sources", "sources of one data shape", shapes)
        k = len(sources)
        p = np.ones(k) if prior is None else np.asarray(prior, np.float64)
        require(
            p.shape == (k,) and bool(np.all(np.isfinite(p) & (p > 0))),
            "prior",
            f"{k} positive class weights",
            prior,
        )
        if null is not None:
            require(
                isinstance(null, ScoreSource) and null.process == process,
                "null",
                "a score source on the classes' process",
                type(null).__name__,
            )
        dtype = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(
            process=process,
            sources=sources,
            log_prior=jnp.asarray(np.log(p / p.sum()), dtype),
            null=null,
        )

    @classmethod
    def from_labelled(cls, fit, x, labels, num_classes: int) -> PerClassScore:
        """The exact class-conditional source of a labelled data set: ``fit`` (e.g.
        ``lambda x: fit_gaussian(process, x)`` for a class's Gaussian, or
        ``lambda x: EmpiricalScore.create(process, x)`` for the training set restricted to
        the class) of each class's examples, the classes weighted by their counts, so that
        the null label is the pooled data's law (exactly for the training set; for the
        Gaussians, the mixture of the class Gaussians).

        Args:
          fit: ``x_c [n_c, *data_shape] -> ScoreSource``.
          x: ``[n, *data_shape]`` data; labels: ``[n]`` int classes in ``[0, num_classes)``.
          num_classes: ``K >= 1``.

        Raises:
          ValueError: naming ``labels`` for a shape other than ``[n]``, a class outside
            ``[0, K)`` or a class with fewer than two examples.
        """
        x = np.asarray(x)
        k = check_int(num_classes, "model.num_classes", low=1)
        labels = np.asarray(labels)
        require(labels.shape == (x.shape[0],), "labels", f"[n] = ({x.shape[0]},)", labels.shape)
        labels = check_label_values(labels, k - 1, "labels")
        counts = np.bincount(labels, minlength=k)
        require(
            counts.min() >= 2,
            "labels",
            "at least two examples of every class (a per-class source is fitted to them)",
            f"class {int(np.argmin(counts))} with {int(counts.min())}",
        )
        return cls.create([fit(x[labels == c]) for c in range(k)], prior=counts)

    @property
    def num_classes(self) -> int:
        return len(self.sources)

    @property
    def allows_null(self) -> bool:
        return self.null is not None or self._has_log_probs()

    def _has_log_probs(self) -> bool:
        return all(callable(getattr(s, "log_prob", None)) for s in self.sources)

    def expected_data_shape(self):
        return self.sources[0].expected_data_shape()

    def inner_sources(self) -> tuple[str, ...]:
        return ("null",)

    def for_examples(self, key, batch: int, first_index: Array = 0) -> PerClassScore:
        out = super().for_examples(key, batch, first_index)
        return out.replace(
            sources=tuple(s.for_examples(key, batch, first_index) for s in self.sources)
        )

    def class_log_joint(self, x: Array, t: Array) -> Array:
        """``[batch, K]``: ``log pi_c + log p_t(x | c)`` (nats).

        Raises:
          ValueError: when a class's source has no ``log_prob``.
        """
        require(
            self._has_log_probs(),
            "sources",
            "sources with a log_prob (GaussianScore, MixtureScore, EmpiricalScore) for the "
            "class posterior",
            [type(s).__name__ for s in self.sources],
        )
        return jnp.stack([s.log_prob(x, t) for s in self.sources], axis=-1) + self.log_prior

    def log_prob(self, x: Array, t: Array) -> Array:
        """``log p_t(x) = logsumexp_c (log pi_c + log p_t(x | c))``: ``[batch]`` (nats)."""
        return jax.nn.logsumexp(self.class_log_joint(x, t), axis=-1)

    def class_log_prob(self, x: Array, t: Array, labels: Array) -> Array:
        """The exact noisy classifier ``log p_t(c | x)`` of each example's label: ``[batch]``.

        Bayes: ``log pi_c + log p_t(x | c) - log p_t(x)``; its input gradient is the
        difference of the conditional and unconditional scores (the classifier-guidance
        term of Dhariwal and Nichol 2021, eq. 10 / Song et al. 2021, eq. 49, exactly).
        """
        lj = self.class_log_joint(x, t)
        picked = jnp.take_along_axis(lj, labels[:, None], axis=1)[:, 0]
        return picked - jax.nn.logsumexp(lj, axis=-1)

    def denoiser_given(self, x, t, labels):
        """The class's denoiser per example; the null label's is the pooled law's."""
        check_query(self, x, t)
        each = jnp.stack([s.denoiser(x, t) for s in self.sources])  # [K, batch, ...]
        if self.null is not None:
            null = self.null.denoiser(x, t)
        elif self._has_log_probs():
            post = jax.nn.softmax(self.class_log_joint(x, t), axis=-1)  # [batch, K]
            flat = each.reshape(each.shape[0], each.shape[1], -1)
            null = jnp.einsum("bk,kbd->bd", post, flat).reshape(x.shape)
        else:
            null = jnp.full(x.shape, jnp.nan, x.dtype)  # no null defined (allows_null False)
        k = self.num_classes
        safe = jnp.minimum(labels, k - 1)
        return jnp.where(
            (labels == k).reshape((-1,) + (1,) * (x.ndim - 1)), null, select_by_label(each, safe)
        )
