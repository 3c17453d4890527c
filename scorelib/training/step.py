"""The jit-compiled train step.

One step, for state ``s`` with ``i = s.step``::

    k_loss, k_drop = split(fold_in(s.key, i))
    x0 = batch_fn(i)                                   # on device, a pure function of i
    (loss, metrics), g = value_and_grad(objective(make_source(params, k_drop), x0, k_loss))
    params', opt' = optax update;  ema' = beta(i) ema + (1 - beta(i)) params'

Every random draw and every batch depends only on ``(key, i)``, so a run resumed
from a checkpoint at step ``k`` computes exactly what the uninterrupted run
computes; nothing depends on where a run was interrupted.

Class labels and label dropout (``data.labels``, ``objective.label_dropout``). When
``batch_fn(i)`` returns ``(x0, labels)`` (``labels: [batch]`` int in ``[0, K)``, ``K`` the
source's ``num_classes``), the objective gets the source with the labels bound,
``make_source(params, k_drop).with_labels(labels')``, where each example's label is
replaced by the null label ``K`` (the unconditional score) with probability
``label_dropout`` (p), so that one network learns the conditional and the unconditional
score (classifier-free guidance, Ho and Salimans 2022; k-diffusion's ``cond_dropout_rate``)::

    k_b   = fold_in(fold_in(k_drop, LABEL_DROPOUT_SALT), b)       # example b of the global batch
    drop_b = bernoulli(k_b, p);   labels'_b = K if drop_b else labels_b

The draw of example ``b`` depends only on the step key and ``b`` (the example's position in
the global batch, as its data key): not on the batch size, on how the batch is sharded over
devices, or on the number of processes, and never on anything inside the network (EDM drew
its mask inside the forward pass from a global RNG; here the network sees only labels).
``LABEL_DROPOUT_SALT`` keeps the draw apart from the network's own dropout draws from
``k_drop`` (``nnx.Rngs``' small counters). The step's metrics then hold ``null_labels``, the
share of null labels in the batch. A ``batch_fn`` that returns a bare array runs exactly the
step of before labels existed, bit for bit.

Non-finite handling (:func:`apply_update` and :func:`advance`, which every train step
uses, distillation's too): a step is *non-finite* when the loss or the global gradient
norm is NaN/inf. Its update is always discarded (params, EMA and optimizer state
keep their old values, the step still advances) and ``first_nonfinite`` records
the first such step, and ``n_skipped`` counts them. The policy is the loop's
(``train(..., nonfinite=)``): ``'skip'`` goes on (as diffusion_distillation
does), ``'stop'`` raises ``FloatingPointError`` at the next host sync. Because
the compiled step never applies a non-finite update, the state is never
poisoned, whichever step the host happens to look at, and a checkpoint never
holds NaN parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from scorelib._checks import check_real, require
from scorelib.keys import LABEL_DROPOUT_SALT, example_keys
from scorelib.scores import NetworkScore
from scorelib.scores.conditional import is_conditional
from scorelib.training.ema import EMA, ema_update
from scorelib.training.state import TrainState


def network_source(
    process,
    graphdef,
    sigma_data: float = 0.5,
    *,
    dropout: bool = False,
    sigma_fisher: float | None = None,
):
    """A ``make_source(params, dropout_key)`` for an EDM-preconditioned network (or, with
    ``sigma_fisher``, one behind :func:`scorelib.nets.precond.fisher_precond`).

    Returns a function building ``scores.NetworkScore(process, graphdef, params,
    sigma_data, dropout_key, sigma_fisher)``; the key is passed only when ``dropout`` is
    true.
    """

    def make_source(params, dropout_key):
        return NetworkScore(
            process=process,
            graphdef=graphdef,
            params=params,
            sigma_data=sigma_data,
            dropout_key=dropout_key if dropout else None,
            sigma_fisher=sigma_fisher,
        )

    return make_source


def check_label_dropout(label_dropout) -> float:
    """``label_dropout`` as a float in ``[0, 1)``.

    Raises:
      ValueError: naming ``objective.label_dropout`` otherwise (1 would never train a label).
    """
    return check_real(label_dropout, "objective.label_dropout", low=0.0, high=1.0, high_open=True)


def drop_labels(labels, key, p: float, null_label: int):
    """Each example's label replaced by ``null_label`` with probability ``p``.

    Example ``b`` draws ``bernoulli(fold_in(fold_in(key, LABEL_DROPOUT_SALT), b), p)``
    (module docstring), so the draw depends only on ``key`` and ``b``.

    Args:
      labels: ``[batch]`` int labels.
      key: the step's ``k_drop``.
      p: the dropout probability in ``[0, 1)`` (0 returns ``labels`` unchanged, no draw).
      null_label: the source's null label ``K``.

    Returns:
      ``[batch]`` int32 labels.
    """
    labels = jnp.asarray(labels, jnp.int32)
    if p == 0.0:
        return labels
    keys = example_keys(jax.random.fold_in(key, LABEL_DROPOUT_SALT), labels.shape[0])
    drop = jax.vmap(lambda k: jax.random.bernoulli(k, p))(keys)
    return jnp.where(drop, jnp.int32(null_label), labels)


def split_batch(batch, field: str = "batch_fn(step)"):
    """``(x0, labels)`` of what a ``batch_fn`` returns: an array ``x0`` (labels ``None``) or a
    pair ``(x0, labels)`` with ``labels: [batch]`` integer.

    Raises:
      ValueError: naming ``field`` for a tuple that is not such a pair.
    """
    if not isinstance(batch, (tuple, list)):
        return batch, None
    require(len(batch) == 2, field, "x0 or a pair (x0, labels)", f"{len(batch)} arrays")
    x0, labels = batch
    dtype = getattr(labels, "dtype", None)
    require(
        jnp.ndim(labels) == 1
        and labels.shape[0] == x0.shape[0]
        and dtype is not None
        and jnp.issubdtype(dtype, jnp.integer),
        f"{field} labels",
        f"integer class labels [batch] ({x0.shape[0]}, one per example of x0)",
        f"dtype {dtype} and shape {jnp.shape(labels)}",
    )
    return x0, labels


def _select(pred, new, old):
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def _optimizer_step(optimizer, grads, params, opt_state):
    """``(params, opt_state)`` after one optax update."""
    updates, new_opt = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt


def apply_update(
    state: TrainState,
    loss: jax.Array,
    grads: Any,
    optimizer,
    *,
    ema_beta: jax.Array,
    ema_part: str | None = None,
) -> tuple[TrainState, jax.Array, jax.Array]:
    """One optimizer update of ``state``'s parameters and their EMA, discarded when the step
    is non-finite (the loss or the global gradient norm is NaN/inf); the step counters are
    :func:`advance`'s.

    Two layouts (:class:`TrainState`):

    * one optimizer: ``grads`` has the structure of ``state.params``; every parameter
      moves and ``ema_params <- ema_update(ema_params, params, ema_beta)``.
    * parts (``optimizer`` a dict ``{part: optax transformation}``, ``state.params`` and
      ``state.opt_state`` dicts of parts): ``grads`` is ``{part: gradients}`` for the parts
      this step updates; the other parts keep their parameters and optimizer state. The
      EMA is that of ``params[ema_part]`` (the ``ema_part`` the state was created with,
      :meth:`TrainState.create`) and moves only on the steps that update that part.

    Args:
      state: the state before the step.
      loss: the scalar loss whose gradients are ``grads``.
      grads: the gradients (see above).
      optimizer: an optax transformation, or a dict of them by part.
      ema_beta: the EMA decay of this step (``EMA.beta(state.step)``).
      ema_part: the part whose EMA ``state.ema_params`` holds; ``None``: all parameters.

    Returns:
      ``(state, grad_norm, finite)``: the state with ``params``, ``ema_params`` and
      ``opt_state`` replaced (the old ones when not ``finite``), the global norm of
      ``grads`` and whether the step is finite (a bool scalar).

    Raises:
      ValueError: naming ``ema_part`` when it is given for a single-optimizer state, or
        when the parameters it names do not have the structure of ``state.ema_params``.
    """
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if isinstance(optimizer, Mapping):
        params, opt_state = dict(state.params), dict(state.opt_state)
        for k in grads:
            params[k], opt_state[k] = _optimizer_step(
                optimizer[k], grads[k], state.params[k], state.opt_state[k]
            )
    else:
        require(ema_part is None, "ema_part", "None for a single-optimizer state", ema_part)
        params, opt_state = _optimizer_step(optimizer, grads, state.params, state.opt_state)
    params = _select(finite, params, state.params)
    opt_state = _select(finite, opt_state, state.opt_state)
    ema_params = state.ema_params
    if ema_part is None or ema_part in grads:
        tracked = params if ema_part is None else params[ema_part]
        require(
            jax.tree.structure(tracked) == jax.tree.structure(ema_params),
            "ema_part",
            "the part whose EMA the state holds (TrainState.create's ema_part)",
            ema_part,
        )
        ema_params = _select(finite, ema_update(ema_params, tracked, ema_beta), ema_params)
    new_state = state.replace(params=params, ema_params=ema_params, opt_state=opt_state)
    return new_state, grad_norm, finite


def advance(state: TrainState, new: TrainState, finite: jax.Array) -> TrainState:
    """``new`` with the step counted: ``step + 1``, and a non-finite step (``finite``
    false) counted in ``n_skipped`` and recorded in ``first_nonfinite`` (if it is the
    first), from ``state``'s counters."""
    i = state.step
    return new.replace(
        step=i + 1,
        n_skipped=state.n_skipped + (~finite).astype(jnp.int32),
        first_nonfinite=jnp.where((state.first_nonfinite < 0) & ~finite, i, state.first_nonfinite),
    )


def update_step(state, loss, metrics, grads, optimizer, ema: EMA, lr_schedule=None):
    """The end of a single-optimizer train step: :func:`apply_update` with the EMA decay of
    ``state.step``, :func:`advance`, and the step's float32 metrics (the objective's
    ``metrics`` plus ``loss``, ``grad_norm``, ``ema_beta``, ``finite`` and, with
    ``lr_schedule``, ``lr`` at update count ``step - n_skipped``).

    Returns:
      ``(new state, metrics)``.
    """
    beta = ema.beta(state.step)
    new, grad_norm, finite = apply_update(state, loss, grads, optimizer, ema_beta=beta)
    new = advance(state, new, finite)
    out = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    out.update(
        loss=loss.astype(jnp.float32),
        grad_norm=grad_norm.astype(jnp.float32),
        ema_beta=beta,
        finite=finite.astype(jnp.float32),
    )
    if lr_schedule is not None:
        out["lr"] = jnp.asarray(lr_schedule(state.step - state.n_skipped), jnp.float32)
    return new, out


def make_train_step(
    objective: Callable,
    make_source: Callable[[Any, jax.Array], Any],
    optimizer: optax.GradientTransformation,
    ema: EMA,
    batch_fn: Callable[[jax.Array], jax.Array],
    *,
    lr_schedule: Callable | None = None,
    jit: bool = True,
    batch_sharding: jax.sharding.Sharding | None = None,
    label_dropout: float = 0.0,
) -> Callable[[TrainState], tuple[TrainState, dict]]:
    """Build ``step(state) -> (state, metrics)``, jit-compiled with the state donated.

    Args:
      objective: ``objective(source, x0, key) -> (scalar loss, dict of scalars)``
        (e.g. ``objectives.EDMLoss``).
      make_source: ``(params, dropout_key) -> ScoreSource`` (see :func:`network_source`).
      optimizer: an optax transformation (e.g. :func:`make_optimizer`).
      ema: an :class:`EMA` configuration.
      batch_fn: ``step_index (int32 scalar) -> x0 [batch, *data_shape]``, or ``-> (x0,
        labels [batch])`` with integer class labels in ``[0, K)`` for a class-conditional
        source (``K`` its ``num_classes``); a pure traceable function (the batch is produced
        inside the compiled step).
      lr_schedule: optional ``count -> lr`` to report ``metrics['lr']`` at update count
        ``step - n_skipped``.
      jit: compile (with ``donate_argnums=0``); ``False`` for debugging.
      batch_sharding: data parallelism: the sharding of ``x0`` (e.g.
        ``scorelib.parallel.batch_sharding(mesh)``, split along the batch axis); each
        device then computes the loss of its part of the batch and the gradients are
        all-reduced. Place the state with ``scorelib.parallel.shard`` (replicated). The
        per-example keys make the result that of one device up to float rounding. The
        labels are split the same way.
      label_dropout: the probability in ``[0, 1)`` that an example's label is replaced by the
        null label (module docstring); > 0 needs labels.

    Raises:
      ValueError: naming ``objective.label_dropout`` (outside ``[0, 1)``) at once; and when
        the step is first traced (its first call, before anything is compiled): naming
        ``model.num_classes`` for labels with a source that is not class-conditional,
        ``data.labels`` for ``label_dropout > 0`` without labels, ``batch_fn(step)`` for a
        batch that is neither ``x0`` nor ``(x0, labels [batch])``.

    Returns:
      ``step``; after ``state, m = step(state)`` the old ``state`` must not be used
      (its buffers were donated). ``m`` holds float32 scalars ``loss``, ``grad_norm``,
      ``ema_beta``, ``finite`` (1.0 or 0.0), the objective's metrics, ``lr`` if given and,
      with labels, ``null_labels`` (the share of the batch trained unconditionally).
    """
    label_dropout = check_label_dropout(label_dropout)

    def step(state: TrainState) -> tuple[TrainState, dict]:
        i = state.step
        k_loss, k_drop = jax.random.split(jax.random.fold_in(state.rng, i))
        x0, labels = split_batch(batch_fn(i))
        if batch_sharding is not None:
            x0 = jax.lax.with_sharding_constraint(x0, batch_sharding)
        null_frac = None
        if labels is None:
            require(
                label_dropout == 0.0,
                "data.labels",
                "true for objective.label_dropout > 0 (a batch_fn that returns (x0, labels))",
                False,
            )
        else:
            k = _source_classes(make_source, state.params, k_drop)
            labels = drop_labels(labels, k_drop, label_dropout, k)
            if batch_sharding is not None:
                labels = jax.lax.with_sharding_constraint(labels, batch_sharding)
            null_frac = jnp.mean((labels == k).astype(jnp.float32))

        def loss_fn(params):
            source = make_source(params, k_drop)
            if labels is not None:
                source = source.with_labels(labels)
            if getattr(objective, "uses_step", False):  # e.g. SURE's DSM ramp
                return objective(source, x0, k_loss, step=i)
            return objective(source, x0, k_loss)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        new, out = update_step(state, loss, metrics, grads, optimizer, ema, lr_schedule)
        if null_frac is not None:
            out["null_labels"] = null_frac
        return new, out

    return jax.jit(step, donate_argnums=0) if jit else step


def _source_classes(make_source, params, key) -> int:
    """``K``, the ``num_classes`` of the source ``make_source`` builds (a static attribute;
    building the source computes nothing).

    Raises:
      ValueError: naming ``model.num_classes`` when it is not class-conditional.
    """
    source = make_source(params, key)
    require(
        is_conditional(source),
        "model.num_classes",
        "> 0 (a class-conditional network) for batches with labels (data.labels=true)",
        getattr(source, "num_classes", 0),
    )
    return int(source.num_classes)
