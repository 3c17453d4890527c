"""Training data corrupted by known Gaussian noise, ``y = x + noise_sigma n``, ``n ~ N(0, I)``.

The setting of learning a score from noisy data (Aali, Arvinte, Kumar and Tamir, "Solving
inverse problems with score-based generative priors learned from noisy data", arXiv
2305.01166, 2023): only one noisy copy of each training example exists, so the
corruption is drawn *once* per example and held fixed (every epoch sees the same ``y_i``),
not redrawn per batch. Example ``i`` draws its noise from ``fold_in(key(seed), i)``
(:func:`scorelib.keys.example_keys`), so its noisy copy depends only on ``(seed, i)``: not on
the size of the set, nor on the chunks it is corrupted in.

The noisy values are not clipped to the data range nor quantised: Stein's unbiased risk
estimate (:mod:`scorelib.objectives.sure`) holds for exactly Gaussian noise only.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from scorelib._checks import check_int, check_real, require
from scorelib.data.images import ImageDataset
from scorelib.keys import example_keys


def check_noise_sigma(noise_sigma) -> float:
    """``noise_sigma`` as a float, required finite and > 0 (data units).

    Raises:
      ValueError: ``data.noise_sigma must be a number in (0.0, inf); got <value>``.
    """
    return check_real(noise_sigma, "data.noise_sigma", low=0.0, low_open=True)


def corrupt(x, noise_sigma: float, *, seed: int, first_index: int = 0, chunk: int = 4096):
    """``x + noise_sigma n`` with example ``i``'s ``n ~ N(0, I)`` from ``fold_in(key(seed),
    first_index + i)``.

    Args:
      x: ``[n, *data_shape]`` clean examples (data units; numpy or jax array).
      noise_sigma: the noise standard deviation (data units, > 0).
      seed: the corruption's seed (an int >= 0); the same seed gives the same noisy set.
      first_index: the global index of ``x[0]`` (an int >= 0): a set corrupted in parts,
        each with its offset, equals the set corrupted at once.
      chunk: examples per device call (an int >= 1; memory only, not the result).

    Returns:
      ``[n, *data_shape]`` float32 numpy array, neither clipped nor quantised.

    Raises:
      ValueError: naming ``data.noise_sigma`` (not finite and > 0), ``seed``,
        ``first_index``, ``chunk`` or ``x`` (no leading example axis, or empty).
    """
    noise_sigma = check_noise_sigma(noise_sigma)
    seed = check_int(seed, "seed", low=0)
    first_index = check_int(first_index, "first_index", low=0)
    chunk = check_int(chunk, "chunk", low=1)
    x = np.asarray(x, np.float32)
    require(x.ndim >= 1 and x.shape[0] >= 1, "x", "[n, *data_shape] with n >= 1", x.shape)
    key = jax.random.key(seed)
    draw = jax.jit(
        lambda keys: jax.vmap(lambda k: jax.random.normal(k, x.shape[1:], np.float32))(keys)
    )
    out = np.empty_like(x)
    for start in range(0, x.shape[0], chunk):
        stop = min(start + chunk, x.shape[0])
        n = np.asarray(draw(example_keys(key, stop - start, first_index + start)))
        out[start:stop] = x[start:stop] + np.float32(noise_sigma) * n
    return out


def noisy_dataset(ds: ImageDataset, noise_sigma: float, *, seed: int = 0) -> ImageDataset:
    """``ds`` with its training split corrupted by :func:`corrupt` (its test split stays
    clean: the held-out reference of a model of the clean data).

    Args:
      ds: an image data set (clean: ``ds.noise_sigma == 0``).
      noise_sigma: the noise standard deviation (data units, > 0).
      seed: the corruption's seed (an int >= 0).

    Returns:
      a new :class:`ImageDataset` with ``train`` noisy (and ``held_out``, part of the
      training data, whose example ``j`` takes index ``n_train + j``), ``noise_sigma`` set,
      and ``name``, ``test``, the labels and ``levels`` (those of the clean images)
      unchanged.

    Raises:
      ValueError: as :func:`corrupt`, or naming ``data.noise_sigma`` when ``ds`` is already
        noisy (corrupting twice would make the noise level ``sqrt(s1^2 + s2^2)``).
    """
    noise_sigma = check_noise_sigma(noise_sigma)
    if ds.noise_sigma != 0.0:
        raise ValueError(
            f"data.noise_sigma: {ds.name} is already noisy (noise_sigma={ds.noise_sigma}); "
            "corrupt the clean set once"
        )
    train = corrupt(ds.train, noise_sigma, seed=seed)
    held = ds.held_out
    if held is not None:
        held = corrupt(held, noise_sigma, seed=seed, first_index=len(ds.train))
    return dataclasses.replace(ds, train=train, held_out=held, noise_sigma=noise_sigma)
