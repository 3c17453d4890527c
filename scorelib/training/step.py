"""The jit-compiled train step.

One step, for state ``s`` with ``i = s.step``::

    k_loss, k_drop = split(fold_in(s.key, i))
    x0 = batch_fn(i)                                   # on device, a pure function of i
    (loss, metrics), g = value_and_grad(objective(make_source(params, k_drop), x0, k_loss))
    params', opt' = optax update;  ema' = beta(i) ema + (1 - beta(i)) params'

Every random draw and every batch depends only on ``(key, i)``, so a run resumed
from a checkpoint at step ``k`` computes exactly what the uninterrupted run
computes; nothing depends on where a run was interrupted.

Non-finite handling: a step is *non-finite* when the loss or the global gradient
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

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

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
    from scorelib.scores import NetworkScore

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


def _select(pred, new, old):
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


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
) -> Callable[[TrainState], tuple[TrainState, dict]]:
    """Build ``step(state) -> (state, metrics)``, jit-compiled with the state donated.

    Args:
      objective: ``objective(source, x0, key) -> (scalar loss, dict of scalars)``
        (e.g. ``objectives.EDMLoss``).
      make_source: ``(params, dropout_key) -> ScoreSource`` (see :func:`network_source`).
      optimizer: an optax transformation (e.g. :func:`make_optimizer`).
      ema: an :class:`EMA` configuration.
      batch_fn: ``step_index (int32 scalar) -> x0 [batch, *data_shape]``, a pure
        traceable function (the batch is produced inside the compiled step).
      lr_schedule: optional ``count -> lr`` to report ``metrics['lr']`` at update count
        ``step - n_skipped``.
      jit: compile (with ``donate_argnums=0``); ``False`` for debugging.
      batch_sharding: data parallelism: the sharding of ``x0`` (e.g.
        ``scorelib.parallel.batch_sharding(mesh)``, split along the batch axis); each
        device then computes the loss of its part of the batch and the gradients are
        all-reduced. Place the state with ``scorelib.parallel.shard`` (replicated). The
        per-example keys make the result that of one device up to float rounding.

    Returns:
      ``step``; after ``state, m = step(state)`` the old ``state`` must not be used
      (its buffers were donated). ``m`` holds float32 scalars ``loss``, ``grad_norm``,
      ``ema_beta``, ``finite`` (1.0 or 0.0), the objective's metrics and ``lr`` if given.
    """

    def step(state: TrainState) -> tuple[TrainState, dict]:
        i = state.step
        k_loss, k_drop = jax.random.split(jax.random.fold_in(state.rng, i))
        x0 = batch_fn(i)
        if batch_sharding is not None:
            x0 = jax.lax.with_sharding_constraint(x0, batch_sharding)

        def loss_fn(params):
            return objective(make_source(params, k_drop), x0, k_loss)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        beta = ema.beta(i)
        ema_params = ema_update(state.ema_params, params, beta)

        new = state.replace(
            params=_select(finite, params, state.params),
            ema_params=_select(finite, ema_params, state.ema_params),
            opt_state=_select(finite, opt_state, state.opt_state),
            step=i + 1,
            n_skipped=state.n_skipped + (~finite).astype(jnp.int32),
            first_nonfinite=jnp.where(
                (state.first_nonfinite < 0) & ~finite, i, state.first_nonfinite
            ),
        )
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

    return jax.jit(step, donate_argnums=0) if jit else step
