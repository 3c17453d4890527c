"""Two-dimensional toy distributions, sampled in ``jnp`` so they run on device.

Every distribution is defined per example: one example is a pure function of one
key, so a batch is ``vmap`` over per-example keys and never depends on the batch
size (see :mod:`scorelib.data.batching`). Units are arbitrary data units; all six
sets live within about ``[-4, 4]^2`` with a per-coordinate standard deviation
between about 1 and 1.8 (``np.std(toy_sample(name, n, seed))`` estimates it, e.g.
for EDM's ``sigma_data``). Output dtype is float32.

Names (as accepted by :func:`toy_sample` and :func:`toy_batch`):

* ``"8gaussians"``: equal mixture of 8 isotropic Gaussians, means on a circle of
  radius :data:`RING_RADIUS` at angles ``2 pi k / 8``, std :data:`RING_STD`.
* ``"checkerboard"``: uniform on the 8 dark unit squares of a 4x4 board on
  ``[-2, 2]^2`` (square ``(col, row)`` is dark when ``col + row`` is even,
  counting from the lower-left corner).
* ``"moons"``: two interleaving half circles (as ``sklearn.datasets.make_moons``)
  centred, scaled by 2, plus Gaussian noise of std 0.1.
* ``"swissroll"``: ``(t cos t, t sin t) / 5``, ``t = 1.5 pi (1 + 2 u)``, ``u ~ U(0, 1)``,
  plus Gaussian noise of std 0.1.
* ``"rings"``: four concentric circles of radii 0.5, 1, 1.5, 2 with probability
  proportional to the radius (uniform along arc length), plus noise of std 0.05.
* ``"pinwheel"``: five arms; radial coordinate ``1 + 0.3 z1``, tangential ``0.1 z2``,
  rotated by ``2 pi k / 5 + 0.25 exp(radial)``, scaled by 2 (after Johnson et al.
  2016, used in FFJORD's toy set).

Classes (``data.labels``; :data:`TOY_CLASSES`). A toy whose draw picks a discrete part
gives that part as each point's class, an int32 in ``[0, K)`` read from the same draw (the
points are the same whether or not their classes are asked):

* ``"8gaussians"``: the component ``k`` (its mean at angle ``2 pi k / 8``), ``K = 8``;
* ``"checkerboard"``: the dark square, ``2 col + b`` where the square is column ``col`` and
  row ``2 b + (col mod 2)`` (both from the lower-left corner), ``K = 8``;
* ``"moons"``: the moon, 0 the upper (``(cos th, sin th)``) and 1 the lower
  (``(1 - cos th, 0.5 - sin th)``), ``K = 2``;
* ``"rings"``: the ring, 0 (radius 0.5) to 3 (radius 2), ``K = 4``;
* ``"pinwheel"``: the arm ``k`` (rotated by ``2 pi k / 5``), ``K = 5``;
* ``"swissroll"``: no class (``None``): asking its classes raises ``ValueError``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_int, require
from scorelib.data.batching import batch_keys
from scorelib.keys import example_keys

Array = Any

RING_RADIUS = 2.0
RING_STD = 0.2
RING_COMPONENTS = 8


def ring_means() -> np.ndarray:
    """``[8, 2]`` float32 means of the ``"8gaussians"`` components (data units)."""
    a = 2.0 * np.pi * np.arange(RING_COMPONENTS) / RING_COMPONENTS
    return (RING_RADIUS * np.stack([np.cos(a), np.sin(a)], axis=-1)).astype(np.float32)


# Each sampler maps one key to ``(point [2], class)``; the class is the discrete part the
# draw picked (module docstring), ``None``-free: a toy without classes returns 0.


def _eight_gaussians(key):
    kc, kn = jax.random.split(key)
    k = jax.random.randint(kc, (), 0, RING_COMPONENTS)
    a = 2.0 * jnp.pi * k / RING_COMPONENTS
    mean = RING_RADIUS * jnp.stack([jnp.cos(a), jnp.sin(a)])
    return mean + RING_STD * jax.random.normal(kn, (2,)), k


def _checkerboard(key):
    kc, kb, ku = jax.random.split(key, 3)
    col = jax.random.randint(kc, (), 0, 4)
    # dark squares: (col + row) even -> row = 2 b + (col mod 2), b in {0, 1}
    b = jax.random.randint(kb, (), 0, 2)
    row = 2 * b + col % 2
    u = jax.random.uniform(ku, (2,))
    return jnp.stack([col, row]).astype(jnp.float32) - 2.0 + u, 2 * col + b


def _moons(key):
    kb, ka, kn = jax.random.split(key, 3)
    b = jax.random.bernoulli(kb)
    th = jax.random.uniform(ka, (), maxval=jnp.pi)
    upper = jnp.stack([jnp.cos(th), jnp.sin(th)])
    lower = jnp.stack([1.0 - jnp.cos(th), 0.5 - jnp.sin(th)])
    p = jnp.where(b, lower, upper) - jnp.array([0.5, 0.25])
    return 2.0 * p + 0.1 * jax.random.normal(kn, (2,)), b


def _swissroll(key):
    ku, kn = jax.random.split(key)
    t = 1.5 * jnp.pi * (1.0 + 2.0 * jax.random.uniform(ku, ()))
    x = jnp.stack([t * jnp.cos(t), t * jnp.sin(t)]) / 5.0 + 0.1 * jax.random.normal(kn, (2,))
    return x, 0  # no class (TOY_CLASSES["swissroll"] is None)


_RING_RADII = (0.5, 1.0, 1.5, 2.0)


def _rings(key):
    kr, ka, kn = jax.random.split(key, 3)
    radii = jnp.array(_RING_RADII)
    ring = jax.random.categorical(kr, jnp.log(radii))
    r = radii[ring]
    a = jax.random.uniform(ka, (), maxval=2.0 * jnp.pi)
    return r * jnp.stack([jnp.cos(a), jnp.sin(a)]) + 0.05 * jax.random.normal(kn, (2,)), ring


def _pinwheel(key):
    kc, kn = jax.random.split(key)
    k = jax.random.randint(kc, (), 0, 5)
    z = jax.random.normal(kn, (2,))
    feat = jnp.array([1.0, 0.0]) + jnp.array([0.3, 0.1]) * z
    a = 2.0 * jnp.pi * k / 5 + 0.25 * jnp.exp(feat[0])
    c, s = jnp.cos(a), jnp.sin(a)
    return 2.0 * jnp.stack([c * feat[0] - s * feat[1], s * feat[0] + c * feat[1]]), k


_SAMPLERS = {
    "8gaussians": _eight_gaussians,
    "checkerboard": _checkerboard,
    "moons": _moons,
    "swissroll": _swissroll,
    "rings": _rings,
    "pinwheel": _pinwheel,
}
TOY_NAMES: tuple[str, ...] = tuple(_SAMPLERS)

#: ``{name: K}``: the number of classes of each toy (module docstring), ``None`` for a toy
#: whose points have no class.
TOY_CLASSES: dict[str, int | None] = {
    "8gaussians": RING_COMPONENTS,
    "checkerboard": 8,
    "moons": 2,
    "swissroll": None,
    "rings": len(_RING_RADII),
    "pinwheel": 5,
}


def _sampler(name: str):
    try:
        return _SAMPLERS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown toy distribution {name!r}; expected one of {TOY_NAMES}"
        ) from None


def toy_classes(name: str, labels: bool = True) -> int | None:
    """``K``, the number of classes of toy ``name`` (:data:`TOY_CLASSES`), when ``labels``
    are asked; ``None`` when not.

    Raises:
      ValueError: for an unknown name, or naming ``data.labels`` when ``labels`` is true
        for a toy without classes.
    """
    _sampler(name)
    require(isinstance(labels, bool), "data.labels", "true or false", labels)
    if not labels:
        return None
    k = TOY_CLASSES[name]
    with_classes = [n for n, c in TOY_CLASSES.items() if c]
    require(
        k is not None,
        "data.labels",
        f"false for toy {name!r}: its points have no class (toys with classes: {with_classes})",
        labels,
    )
    return k


def toy_from_keys(name: str, keys: Array, *, labels: bool = False):
    """``[n, 2]`` float32 examples of ``name``, example ``i`` drawn from ``keys[i]``; with
    ``labels``, ``(x, y)`` and ``y: [n]`` int32 their classes (module docstring), from the
    same draws: ``x`` is the same either way.

    Raises:
      ValueError: for an unknown name (the message lists :data:`TOY_NAMES`), or naming
        ``data.labels`` for labels of a toy without classes.
    """
    toy_classes(name, labels)
    x, y = jax.vmap(_sampler(name))(keys)
    x = x.astype(jnp.float32)
    return (x, jnp.asarray(y).astype(jnp.int32)) if labels else x


def toy_sample(name: str, n: int, seed: int, *, labels: bool = False):
    """A fixed sample of ``n`` points: ``[n, 2]`` float32 numpy array; with ``labels``,
    ``(x, y)`` and ``y: [n]`` int32 their classes (the same points).

    Example ``i`` uses ``fold_in(key(seed), i)``, so ``toy_sample(name, n, s)`` is a
    prefix of ``toy_sample(name, n + k, s)``.

    Raises:
      ValueError: for an unknown name or ``n < 1``, or naming ``data.labels`` for labels of
        a toy without classes.
    """
    toy_classes(name, labels)
    check_int(n, "n", low=1)
    # fixed-size chunks: one compilation per name, whatever n is
    chunks = [_toy_chunk(name, seed, start, labels) for start in range(0, int(n), _CHUNK)]
    if not labels:
        return np.concatenate([np.asarray(c) for c in chunks])[:n]
    x = np.concatenate([np.asarray(c[0]) for c in chunks])[:n]
    return x, np.concatenate([np.asarray(c[1]) for c in chunks])[:n]


_CHUNK = 4096


@functools.partial(jax.jit, static_argnums=(0, 3))
def _toy_chunk(name, seed, start, labels=False):
    return toy_from_keys(name, example_keys(jax.random.key(seed), _CHUNK, start), labels=labels)


def toy_batch(name: str, batch_size: int, *, seed, step, process_index=0, labels: bool = False):
    """The infinite-data stream: the local batch ``[B, 2]`` (float32 ``jax.Array``); with
    ``labels``, ``(x, y)`` and ``y: [B]`` int32 the points' classes (the same points).

    A pure function of ``(seed, step, process_index)`` with the per-example keys of
    :func:`scorelib.data.batching.batch_keys`; jit-compatible (``name``, ``batch_size`` and
    ``labels`` static, the integers may be traced).

    Raises:
      ValueError: for an unknown name or ``batch_size < 1``, or naming ``data.labels`` for
        labels of a toy without classes.
    """
    toy_classes(name, labels)
    check_int(batch_size, "batch_size", low=1)
    return _toy_batch(name, int(batch_size), seed, step, process_index, labels)


@functools.partial(jax.jit, static_argnums=(0, 1, 5))
def _toy_batch(name, batch_size, seed, step, process_index, labels=False):
    keys = batch_keys(batch_size, seed=seed, step=step, process_index=process_index)
    return toy_from_keys(name, keys, labels=labels)


__all__ = [
    "RING_COMPONENTS",
    "RING_RADIUS",
    "RING_STD",
    "TOY_CLASSES",
    "TOY_NAMES",
    "ring_means",
    "toy_classes",
    "toy_batch",
    "toy_from_keys",
    "toy_sample",
]
