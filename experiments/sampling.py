"""Drawing many samples in batches with per-example keys (results do not depend on batch size)."""

from __future__ import annotations

import time

import jax
import numpy as np

from experiments.build import Sampling


def check_sampler(sampling: Sampling, source, data_shape) -> None:
    """Run the sampler's argument checks (and trace it once, without compiling or computing)."""
    jax.eval_shape(lambda: sampling(source, jax.random.key(0), (1, *data_shape))[0])


def draw(sampling: Sampling, source, data_shape, *, num_samples: int, batch_size: int, seed: int):
    """``num_samples`` samples ``[n, *data_shape]`` (numpy) and info (NFE, wall time, and
    ``num_nonfinite``: how many samples hold a NaN or inf, i.e. diverged).

    Example ``i`` always uses ``fold_in(key(seed), i)``, whatever ``batch_size`` is.
    """
    key = jax.random.key(seed)
    out, info = [], {}
    t0 = time.perf_counter()
    for start in range(0, num_samples, batch_size):
        b = min(batch_size, num_samples - start)
        x, info = sampling(source, key, (b, *data_shape), first_index=start)
        out.append(np.asarray(x))
    info = {k: v for k, v in info.items() if isinstance(v, (int, float, str))}
    info["wall_s"] = time.perf_counter() - t0
    x = np.concatenate(out)
    info["num_nonfinite"] = int(np.sum(~np.isfinite(x.reshape(num_samples, -1)).all(axis=1)))
    return x, info
