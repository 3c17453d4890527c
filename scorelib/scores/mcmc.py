"""Langevin Monte Carlo on an unnormalised log-density: the ULA and MALA kernels, written once.

Both propose, from a chain at ``x`` with step ``h > 0`` (data units squared),

    y = x + h grad log pi(x) + sqrt(2 h) z,    z ~ N(0, I)

(the Euler-Maruyama step of the Langevin diffusion ``dx = grad log pi dt + sqrt(2) dB``).
ULA (the unadjusted Langevin algorithm; Roberts & Tweedie, "Exponential convergence of
Langevin distributions and their discrete approximations", Bernoulli 1996, Sec. 1.4.1) always
moves to ``y``: its stationary law is ``pi`` up to an ``O(h)`` bias (for ``N(m, v I)`` exactly
``N(m, v / (1 - h / (2 v)) I)``). MALA (the Metropolis-adjusted Langevin algorithm; Roberts &
Tweedie 1996, Sec. 1.4.3) accepts ``y`` with probability ``min(1, r)``,

    log r = log pi(y) - log pi(x) + log q(x | y) - log q(y | x),
    log q(b | a) = -|b - a - h grad log pi(a)|^2 / (4 h)   (+ a constant that cancels),

so that ``pi`` is exactly invariant. Needed: ``log pi`` up to a constant (MALA only) and its
gradient. Used by the reverse-diffusion Monte Carlo score (``scores/rdmc.py``: chains on the
posterior ``q_t(x_0 | x)``) and by the plain-Langevin samplers of a target
(``samplers/mcmc.py``).

Cost, in evaluations of the target (the budget the rdMC table compares at): ULA takes one
gradient per step; MALA one ``(log pi, grad log pi)`` pair per step plus one at the start
(:func:`chain_evaluations`).

Keys: chain ``c`` owns ``keys[c]``; its step ``j`` (0-based) draws
``z = normal(fold_in(fold_in(keys[c], j), 0))`` and, for MALA, the acceptance uniform
``u = uniform(fold_in(fold_in(keys[c], j), 1))``, so a chain depends on its own key only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_choice, check_int, require

Array = Any

METHODS = ("ula", "mala")


def check_log_density(target: Any, field: str = "data.target") -> int:
    """Check that ``target`` gives an unnormalised log-density and its gradient; return its dim.

    A target here is anything with ``dim`` (an int), ``log_prob(x: [b, dim]) -> [b]`` (nats,
    up to a constant) and ``score(x: [b, dim]) -> [b, dim]`` (``grad log p``), e.g. the
    targets of ``scorelib.data.targets``. ``log_prob`` is traced once on a ``[1, dim]``
    abstract input (nothing is computed) to find targets that declare it but do not
    implement it.

    Raises:
      ValueError: ``<field> must be a target with a log-density ...`` naming the field, for
        anything else (a data set, a score source, a target whose ``log_prob`` raises
        ``NotImplementedError``).
    """
    allowed = "a target with a log-density (dim, log_prob(x) and score(x) of p ∝ exp(-f))"
    name = getattr(target, "name", type(target).__name__)
    dim = getattr(target, "dim", None)
    ok = (
        isinstance(dim, int)
        and not isinstance(dim, bool)
        and dim >= 1
        and callable(getattr(target, "log_prob", None))
        and callable(getattr(target, "score", None))
    )
    require(ok, field, allowed, name)
    try:
        out = jax.eval_shape(target.log_prob, jax.ShapeDtypeStruct((1, dim), jnp.float32))
    except NotImplementedError:
        out = None
    require(
        out is not None and tuple(out.shape) == (1,),
        field,
        allowed + f" whose log_prob maps [b, {dim}] to [b]",
        name,
    )
    return dim


def chain_evaluations(method: str, n_steps: int, final_grad: bool) -> dict:
    """Target evaluations of one chain of :func:`langevin_chains`: ``{"grad", "density"}``.

    ULA: ``n_steps`` gradients (``+ 1`` when the gradient at the last state is wanted), no
    densities. MALA: ``n_steps + 1`` gradients and as many log-densities (one pair at the
    start, one per proposal; the last state's gradient comes free), or none when
    ``n_steps = 0`` and no gradient is wanted.
    """
    check_choice(method, "method", METHODS)
    n_steps = check_int(n_steps, "n_steps", low=0)
    if method == "ula":
        return {"grad": n_steps + int(final_grad), "density": 0}
    n = n_steps + 1 if (n_steps > 0 or final_grad) else 0
    return {"grad": n, "density": n}


def langevin_chains(
    log_prob: Callable[[Array], Array] | None,
    grad_log_prob: Callable[[Array], Array],
    x: Array,
    step: Array,
    keys: jax.Array,
    n_steps: int,
    *,
    method: str,
    final_grad: bool = False,
) -> dict:
    """``n_steps`` ULA or MALA steps of ``n`` independent chains (traced; call inside ``jit``).

    Args:
      log_prob: ``[n, d] -> [n]``, ``log pi`` up to a constant (MALA only; ``None`` for ULA).
      grad_log_prob: ``[n, d] -> [n, d]``, ``grad log pi``.
      x: ``[n, d]`` start states (data units).
      step: ``h > 0``, a scalar or ``[n]`` (one step per chain; data units squared).
      keys: ``[n]`` chain keys (module docstring, "Keys").
      n_steps: a Python int ``>= 0``.
      method: ``"ula"`` or ``"mala"``.
      final_grad: also return ``grad log pi`` at the final states.

    Returns:
      ``{"x": [n, d], "grad": [n, d] or None, "accept": [n]}``: the final states, their
      gradient when ``final_grad``, and each chain's fraction of accepted proposals (1 for
      ULA; 1 when ``n_steps = 0``). The loop is a ``lax.scan``; compile time does not grow
      with ``n_steps``.
    """
    n = x.shape[0]
    h = jnp.broadcast_to(jnp.asarray(step, x.dtype), (n,))[:, None]  # [n, 1]

    def draws(j):
        kj = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, j)
        z = jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, 0), x.shape[1:], x.dtype))
        u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, 1), (), x.dtype))
        return z(kj), u(kj)

    if method == "ula":

        def ula(xc, j):
            z, _ = draws(j)
            return xc + h * grad_log_prob(xc) + jnp.sqrt(2.0 * h) * z, None

        xs = jax.lax.scan(ula, x, jnp.arange(n_steps))[0]
        g = grad_log_prob(xs) if final_grad else None
        return {"x": xs, "grad": g, "accept": jnp.ones((n,), x.dtype)}

    if n_steps == 0 and not final_grad:
        return {"x": x, "grad": None, "accept": jnp.ones((n,), x.dtype)}

    def log_q(b, a, ga):  # log q(b | a) up to a constant, [n]
        return -jnp.sum((b - a - h * ga) ** 2, axis=-1) / (4.0 * h[:, 0])

    def mala(carry, j):
        xc, lp, g, acc = carry
        z, u = draws(j)
        y = xc + h * g + jnp.sqrt(2.0 * h) * z
        lpy, gy = log_prob(y), grad_log_prob(y)
        log_r = lpy - lp + log_q(xc, y, gy) - log_q(y, xc, g)
        take = jnp.log(u) < log_r  # False for a NaN ratio: the proposal is rejected
        keep = lambda new, old: jnp.where(take.reshape((n,) + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
        return (keep(y, xc), keep(lpy, lp), keep(gy, g), acc + take), None

    start = (x, log_prob(x), grad_log_prob(x), jnp.zeros((n,), x.dtype))
    xs, _, g, acc = jax.lax.scan(mala, start, jnp.arange(n_steps))[0]
    accept = acc / n_steps if n_steps else jnp.ones((n,), x.dtype)
    return {"x": xs, "grad": g if final_grad else None, "accept": accept}


def check_method(method: Any, field: str) -> str:
    """``method`` if it is ``"ula"`` or ``"mala"``; else ``ValueError`` naming ``field``."""
    return check_choice(method, field, METHODS)
