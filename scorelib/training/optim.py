"""The optimizer factory of every training step: Adam or AdamW with a linear learning-rate
warm-up and gradient clipping (optax).

Defaults follow score SDE (Song et al., ICLR 2021, ``configs/default_*``: Adam,
lr 2e-4, 5000 warm-up steps, clip 1.0) and EDM (Karras et al. 2022,
``train.py``: Adam beta = (0.9, 0.999), eps 1e-8, lr ramp-up). Distillation (Xu, Nie and
Vahdat 2025, Table 5) uses AdamW (Loshchilov and Hutter 2019: lr 1e-4, weight decay 0.01)
without clipping or warm-up: ``weight_decay`` given, ``grad_clip=None``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from scorelib._checks import check_int, check_real


def warmup_schedule(lr: float, warmup_steps: int):
    """``lr(n) = lr * min((n + 1) / warmup_steps, 1)`` for update count ``n = 0, 1, ...``.

    The ``+ 1`` makes the first update non-zero (score SDE and EDM both start at
    lr 0, which wastes the first step); ``warmup_steps = 0`` gives a constant lr.
    """
    if warmup_steps == 0:
        return optax.constant_schedule(lr)
    return lambda count: lr * jnp.minimum((count + 1) / warmup_steps, 1.0)


def make_optimizer(
    lr: float,
    warmup_steps: int = 0,
    grad_clip: float | None = 1.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float | None = None,
    clip_groups: tuple[str, ...] | None = None,
) -> optax.GradientTransformation:
    """``clip_by_global_norm(grad_clip)`` then Adam, or AdamW with ``weight_decay``, at the
    learning rate :func:`warmup_schedule`.

    Args:
      lr: peak learning rate (> 0).
      warmup_steps: number of updates of the linear ramp (>= 0).
      grad_clip: max global gradient norm (> 0), or ``None`` for no clipping.
      b1, b2: Adam decay rates in ``[0, 1)``.
      eps: Adam's denominator epsilon (> 0).
      weight_decay: ``None`` for Adam; a rate (>= 0) for AdamW's decoupled weight decay
        ``p <- p - lr (adam_update + weight_decay p)`` (Loshchilov and Hutter 2019, Alg. 2),
        applied after the clipping.
      clip_groups: the names of the parameter tree's top-level entries, to clip each by
        its own norm (each ``grad_clip``) instead of the whole tree by one: for networks
        whose parts have separate losses (``("first", "second")``, the two modules of
        :class:`scorelib.nets.Cascade`), so that one part's gradient never scales
        another's update; ``None``: one global norm.

    Returns:
      An ``optax.GradientTransformation``. Its state holds the update count, so
      the schedule resumes exactly from a checkpoint. The state's layout is what
      checkpoints hold, so it stays as it was for both variants: Adam's ends with the
      schedule's count (also at a constant rate, ``warmup_steps = 0``), AdamW's constant
      rate is a number (no schedule count; distillation checkpoints).

    Raises:
      ValueError: naming the field (``optim.lr`` etc.) when a value is out of range.
    """
    inf = math.inf
    lr = check_real(lr, "optim.lr", low=0.0, low_open=True, high=inf, high_open=True)
    warmup_steps = check_int(warmup_steps, "optim.warmup_steps", low=0)
    if grad_clip is not None:
        grad_clip = check_real(
            grad_clip, "optim.grad_clip", low=0.0, low_open=True, high=inf, high_open=True
        )
    b1 = check_real(b1, "optim.b1", low=0.0, high=1.0, high_open=True)
    b2 = check_real(b2, "optim.b2", low=0.0, high=1.0, high_open=True)
    eps = check_real(eps, "optim.eps", low=0.0, low_open=True, high=inf, high_open=True)
    if weight_decay is None:
        adam = optax.adam(warmup_schedule(lr, warmup_steps), b1=b1, b2=b2, eps=eps)
    else:
        weight_decay = check_real(
            weight_decay, "optim.weight_decay", low=0.0, high=inf, high_open=True
        )
        rate = lr if warmup_steps == 0 else warmup_schedule(lr, warmup_steps)
        adam = optax.adamw(rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    if grad_clip is None:
        return adam
    return optax.chain(clip_transform(grad_clip, clip_groups), adam)


def clip_transform(grad_clip: float, clip_groups: tuple[str, ...] | None = None):
    """``optax.clip_by_global_norm(grad_clip)`` of the whole gradient tree, or (with
    ``clip_groups``, the names of its top-level entries) of each entry alone (the first
    transform of :func:`make_optimizer`)."""
    if not clip_groups:
        return optax.clip_by_global_norm(grad_clip)
    clips = {name: optax.clip_by_global_norm(grad_clip) for name in clip_groups}
    return optax.multi_transform(clips, top_level_labels)


def top_level_labels(params):
    """The tree of ``params`` with each leaf replaced by the key of its top-level entry."""
    return jax.tree_util.tree_map_with_path(lambda path, _: str(_key(path[0])), params)


def _key(entry):
    return getattr(entry, "key", getattr(entry, "name", getattr(entry, "idx", entry)))
