"""The GPU benchmark, prepared for a machine with NVIDIA GPUs (not yet run: no GPU so far).

On every local GPU together (data-parallel, ``scorelib.parallel``):

1. train steps/s and peak memory of the digits EDM (``MLP(data_shape=(8, 8, 1)`` as the
   CPU default: width 512, depth 4, batch 256) and of a CIFAR-10-shaped U-Net
   (``UNet(data_shape=(32, 32, 3), channels=128, channel_mult=[2, 2, 2],
   attn_resolutions=[16])``, batch 128) on synthetic data (uniform in [-1, 1]: no data set
   is needed; the step costs the same);
2. ``benchmarks/samplers.py``: each sampler's time per NFE over one denoiser forward.

    make install-cuda
    .venv/bin/python benchmarks/scaling_gpu.py [--steps 100] [--repeats 3]

Stops with a message when JAX sees no GPU (a CPU-only jaxlib: run ``make install-cuda``).
Record the output in BENCHMARKS.md with the GPU model, the driver and the command.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import jax
import numpy as np
from flax import nnx
from train_timing import best_block_seconds, edm_train_step

from scorelib import parallel
from scorelib.data import get_batch
from scorelib.nets import MLP, UNet
from scorelib.training import init_state, make_optimizer

CONFIGS = {
    "digits MLP 512x4, batch 256": (
        (8, 8, 1),
        256,
        lambda shape: MLP(shape, width=512, depth=4, rngs=nnx.Rngs(0)),
    ),
    "CIFAR-10-shaped U-Net 128 [2,2,2] attn 16, batch 128": (
        (32, 32, 3),
        128,
        lambda shape: UNet(
            shape, channels=128, channel_mult=[2, 2, 2], attn_resolutions=[16], rngs=nnx.Rngs(0)
        ),
    ),
}


def bench_train(name, shape, batch, make, steps, repeats) -> str:
    mesh = parallel.make_mesh()
    parallel.check_batch_size(batch, mesh, "batch")
    opt = make_optimizer(lr=1e-4)
    graphdef, state = init_state(make(shape), opt, seed=0)
    state = parallel.shard(state, mesh)
    data = np.random.default_rng(0).uniform(-1, 1, (50_000, *shape)).astype(np.float32)
    data = parallel.shard(data, mesh)
    batch_fn = lambda i: get_batch(data, batch, seed=0, step=i)
    step = edm_train_step(graphdef, opt, batch_fn, batch, 0.9999, mesh)
    _, best = best_block_seconds(step, state, steps, repeats)
    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use", float("nan")) / 2**30
    return (
        f"| {name} | {jax.device_count()} | {steps / best:.1f} | "
        f"{steps * batch / best:.0f} | {peak:.2f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if jax.default_backend() != "gpu":
        sys.exit(f"JAX sees no GPU (backend {jax.default_backend()}): run make install-cuda")
    print(f"# {jax.devices()[0].device_kind} x {jax.device_count()}, jax {jax.__version__}")
    print("| model | GPUs | train steps/s | images/s | peak GiB (GPU 0) |")
    print("|---|---|---|---|---|")
    for name, (shape, batch, make) in CONFIGS.items():
        print(bench_train(name, shape, batch, make, args.steps, args.repeats), flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    print("\n# benchmarks/samplers.py (time per NFE / one denoiser forward)", flush=True)
    subprocess.run(
        [sys.executable, os.path.join(here, "samplers.py"), "--batches", "256", "16384"],
        check=True,
    )


if __name__ == "__main__":
    main()
