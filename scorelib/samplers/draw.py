"""Drawing many samples in batches, with results that do not depend on the batch size."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import jax
import numpy as np
from tqdm.auto import tqdm

from scorelib._checks import check_int, require


def draw_samples(
    sample: Callable,
    source,
    key,
    data_shape,
    *,
    num_samples: int,
    batch_size: int,
    progress: bool = False,
    desc: str = "sampling",
    devices: Sequence | None = None,
    **kwargs,
) -> tuple[np.ndarray, dict]:
    """``num_samples`` samples drawn ``batch_size`` at a time, as one numpy array.

    Calls ``sample(source, key, (b, *data_shape), first_index=start, **kwargs)`` for
    ``start = 0, batch_size, 2 batch_size, ...`` (the last batch may be smaller). With
    the library's key scheme (``scorelib.keys``), example ``i`` uses ``fold_in(key, i)``
    whatever ``batch_size`` is, so the samples are the same for every batch size (up to
    float rounding of differently shaped compiled programs).

    Args:
      sample: anything with the sampler signature ``sample(source, key, shape, *,
        first_index, **kwargs) -> (x, info)``: a sampler (``get_sampler(name)``), or e.g.
        ``lambda src, key, shape, **kw: teleport(heun, src, gaussian, key, shape, skip=4,
        **kw)``.
      source: the score source.
      key: one PRNG key.
      data_shape: the shape of one sample.
      num_samples: how many samples (>= 1).
      batch_size: samples per call (>= 1).
      progress: show a tqdm progress bar (counted in samples).
      desc: the progress bar's label.
      devices: several devices (e.g. ``jax.local_devices()``) split every batch among
        them: device ``i`` draws examples ``start + i c .. start + (i + 1) c - 1`` with
        ``c = ceil(b / len(devices))``, from a copy of ``source`` and ``key`` placed on
        it; the calls are dispatched before any result is read, so the devices run at
        once. The samples are those of one device with ``batch_size = c`` (bit for bit
        where the compiled programs are the same). ``None`` or one device: JAX's default.
      **kwargs: passed to every call (``grid``, ``float64``, the sampler's options).

    Returns:
      ``(x, info)``: ``x`` ``[num_samples, *data_shape]`` numpy; ``info`` the sampler's
      ``info`` of the first batch (its scalars: ``nfe``, ``steps``, ...; the same for every
      batch) plus ``num_samples``, ``num_nonfinite`` (samples holding a NaN or an inf,
      i.e. diverged) and ``wall_s`` (wall time of all the calls, seconds).

    Raises:
      ValueError: naming ``sampler.num_samples``, ``sampler.batch_size`` or ``progress``;
        or as the sampler, on its first call (before anything is compiled).
    """
    num_samples = check_int(num_samples, "sampler.num_samples", low=1)
    batch_size = check_int(batch_size, "sampler.batch_size", low=1)
    require(isinstance(progress, bool), "progress", "a bool", progress)
    data_shape = tuple(data_shape)
    out, info = [], None
    t0 = time.perf_counter()
    devices = list(devices or [])
    placed = [(jax.device_put(source, d), jax.device_put(key, d), d) for d in devices]
    if len(placed) < 2:
        placed = [(source, key, None)]
    with tqdm(total=num_samples, desc=desc, unit="sample", disable=not progress) as bar:
        for start in range(0, num_samples, batch_size):
            b = min(batch_size, num_samples - start)
            chunk = -(-b // len(placed))
            pending = []
            for i, (src, k, device) in enumerate(placed):
                first, m = start + i * chunk, min(chunk, b - i * chunk)
                if m <= 0:
                    break
                with jax.default_device(device) if device is not None else nullcontext():
                    x, batch_info = sample(src, k, (m, *data_shape), first_index=first, **kwargs)
                pending.append(x)
                if info is None:
                    info = {
                        name: v
                        for name, v in batch_info.items()
                        if isinstance(v, (bool, int, float, str))
                    }
            out.extend(np.asarray(x) for x in pending)
            bar.update(b)
    x = np.concatenate(out)
    finite = np.isfinite(x.reshape(num_samples, -1)).all(axis=1)
    info.update(
        num_samples=num_samples, num_nonfinite=int(np.sum(~finite)), wall_s=time.perf_counter() - t0
    )
    return x, info
