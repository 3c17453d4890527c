"""Posterior sampling: time per denoiser call of each measurement-conditioned method / the
unconditional sampler's, on the same network (issue 37, item 7).

Network: the digits network (``configs/model/local_digits.yaml``: ``scorelib.nets.LocalMLP``;
its output layers made non-zero so nothing is trivially zero), behind EDM preconditioning
(``NetworkScore``, EDM process). Sampler: EDM Heun, 18 steps on the EDM grid down to
sigma_min 0.1 (the main job's; NFE 35); DDRM runs its own update on the same grid (NFE 18).
Measurements (``scorelib.operators``, ``sigma_y = 0.05``): inpainting of 50% random pixels
and a Gaussian blur (std 1, 5 x 5), each with its closed-form SVD (``A^+`` and ``S^{-1}``
in closed form), and the same blur as a ``Stacked`` operator without an SVD (``A^+`` and
``S^{-1}`` by conjugate gradients, per example), one measurement per example.

Rows, each timed in the same run as the reference (the unconditional sampler):

* projection (``D + A^+ (y - A D)``): one network call and ``A^+`` per denoiser call;
* DPS and PiGDM: a forward and a vector-Jacobian product through the network per call
  (predicted about 3x: the backward pass costs about two forwards), PiGDM plus ``S^{-1}``;
* DDRM: one network call and the spectral update per step.

Timings: every row compiled and run once, then ``--repeats`` interleaved rounds, each
running every row once (a slow spell of a shared machine hits every row alike); each row's
minimum over the rounds, each run ended by ``block_until_ready``; wall clock.

    .venv/bin/python benchmarks/posterior.py [--batch 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time

import jax
import numpy as np
from flax import nnx

from scorelib.nets import LocalMLP
from scorelib.operators import GaussianBlur, Inpainting, Measurement, Stacked
from scorelib.processes import EDM
from scorelib.samplers import ddrm, edm_grid, heun
from scorelib.scores import NetworkScore
from scorelib.scores.measured import posterior_source

SHAPE = (8, 8, 1)
#: configs/model/local_digits.yaml
NET = dict(
    sigma_local=0.25, radius=2, local_width=32, local_depth=3, width=256, depth=3, emb_dim=64
)


def _randomise_outputs(model):
    """Non-zero output layers (zero-initialised at construction)."""
    for i, lin in enumerate([model.glob.out, model.local.out]):
        key = jax.random.key(10 + i)
        lin.kernel.value = 0.01 * jax.random.normal(key, lin.kernel.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=18)
    args = ap.parse_args()
    process = EDM()
    model = LocalMLP(SHAPE, **NET, rngs=nnx.Rngs(0))
    _randomise_outputs(model)
    g, params = nnx.split(model, nnx.Param)
    net = NetworkScore(process=process, graphdef=g, params=params, sigma_data=0.5)
    grid = edm_grid(args.steps, 0.1, 80.0)
    key = jax.random.key(0)
    x0 = np.asarray(jax.random.uniform(key, (args.batch, *SHAPE), minval=-1, maxval=1))
    ops = {
        "inpainting 50%": Inpainting.random(jax.random.key(1), SHAPE, 0.5),
        "blur (SVD)": GaussianBlur.create(SHAPE, 1.0, 5),
        "blur, no SVD (CG)": Stacked.create([GaussianBlur.create(SHAPE, 1.0, 5)]),
    }
    rows = {"unconditional (reference)": (heun, net)}
    for name, op in ops.items():
        meas = Measurement.create(op, 0.05)
        y = np.asarray(meas.measure(x0, jax.random.key(2)))
        rows[f"projection, {name}"] = (heun, posterior_source("projection", net, meas, y))
        rows[f"DPS, {name}"] = (heun, posterior_source("dps", net, meas, y, zeta=1.0))
        rows[f"PiGDM, {name}"] = (heun, posterior_source("pigdm", net, meas, y, sigma_data=0.5))
        if op.svd() is not None:
            rows[f"DDRM, {name}"] = (ddrm, posterior_source("ddrm", net, meas, y))
    print(
        f"# jax {jax.__version__}, backend {jax.default_backend()}, {jax.devices()[0]}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"load avg {os.getloadavg()[0]:.1f}, batch {args.batch}, Heun {args.steps} steps"
    )
    shape = (args.batch, *SHAPE)
    runs, nfes = {}, {}
    for label, (sampler, src) in rows.items():  # compile and warm up every row first
        runs[label] = functools.partial(sampler, src, key, shape, grid=grid)
        nfes[label] = jax.block_until_ready(runs[label]())[1]["nfe"]
    best = dict.fromkeys(rows, np.inf)
    for _ in range(args.repeats):
        for label, fn in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn()[0])
            best[label] = min(best[label], (time.perf_counter() - t0) / nfes[label])
    ref = best[next(iter(rows))]
    print("\n| method, operator | NFE | ms / denoiser call | ratio to unconditional |")
    print("|---|---:|---:|---:|")
    for label, t in best.items():
        print(f"| {label} | {nfes[label]} | {t * 1e3:.3f} | {t / ref:.2f} |")


if __name__ == "__main__":
    main()
