"""Guided sampling: time per NFE of each guidance / the unguided conditional sampler's.

Network: the class-conditional digits network (``configs/experiment/digits_edm_cond.yaml``:
``scorelib.nets.LocalMLP`` of ``configs/model/local_digits.yaml`` with ``num_classes=10``; its
output layers made non-zero so nothing is trivially zero), behind EDM preconditioning
(``NetworkScore``, EDM process). Sampler: EDM Heun, 18 steps on the EDM grid down to
sigma_min 0.1 (the preset's; NFE 35), the classes balanced (``Labels.balanced(10)``).

Rows, each timed in the same run as the reference (the conditional sampler without
guidance, ``w = 1`` as a plain conditioned source):

* CFG, the model's own null label as the guide: the conditional and unconditional
  denoisers in one batched call of ``2 * batch`` (``ClassifierFreeGuidance``);
* CFG with a separate guide source (the same network as an unconditioned source): two
  calls of ``batch`` (what one batched call saves);
* TCFG (``filter="tangential"``): CFG plus a 2 x 2 eigendecomposition per example;
* interval CFG on ``(grid[k_lo], grid[k_hi]]``: guided only at the levels inside, where a
  call costs one network evaluation outside; the predicted ratio is
  ``1 + f (r_cfg - 1)`` with ``f`` the share of denoiser calls inside the interval;
* classifier guidance with a noise-conditional classifier MLP
  (``scorelib.nets.classifier``, when installed): prior + the classifier's forward and
  backward.

Timings: every row compiled and run once, then ``--repeats`` interleaved rounds, each
running every row once (so a slow spell of a shared machine hits all rows alike); each
row's minimum over the rounds, each run ended by ``block_until_ready``; wall clock
(process CPU time with ``--cpu-time``). The sampler's CPU blocks hold ``CPU_CHUNK /
source.batch_multiple()`` examples (512 for CFG's batched call), so the network's batch is
the same in every row. Target (issue 36):
CFG at most 2.1x the unguided time per NFE; interval CFG cheaper in proportion to the
levels it skips.

    .venv/bin/python benchmarks/guidance.py [--batches 1000 10000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from scorelib.nets import LocalMLP
from scorelib.processes import EDM
from scorelib.samplers import edm_grid, heun
from scorelib.scores import Labels, NetworkScore, ScoreSource
from scorelib.scores.guidance import ClassifierFreeGuidance, ClassifierGuidance

K = 10
CFG_ROW = "CFG w=2, one batched call"
SHAPE = (8, 8, 1)
#: configs/model/local_digits.yaml
NET = dict(
    sigma_local=0.25, radius=2, local_width=32, local_depth=3, width=256, depth=3, emb_dim=64
)


class NullLabel(ScoreSource):
    """A conditional source at its null label, as a separate (unconditional) source."""

    inner: Any = None

    def denoiser(self, x, t):
        return self.inner.denoiser_given(x, t, self.inner.null_labels(x.shape[0]))


def _randomise_outputs(model):
    """Non-zero output layers (zero-initialised at construction)."""
    for i, lin in enumerate([model.glob.out, model.local.out]):
        key = jax.random.key(10 + i)
        lin.kernel.value = 0.01 * jax.random.normal(key, lin.kernel.shape)


def _classifier(process):
    """A noise-conditional classifier of the digits size, or ``None`` when the library has
    none installed."""
    try:
        from scorelib.nets.classifier import ClassifierMLP  # noqa: PLC0415
        from scorelib.scores.classifier import NoisyClassifier  # noqa: PLC0415
    except ImportError:
        return None
    net = ClassifierMLP(SHAPE, num_classes=K, rngs=nnx.Rngs(3))
    g, p = nnx.split(net, nnx.Param)
    return NoisyClassifier(process=process, graphdef=g, params=p, sigma_data=0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=18)
    ap.add_argument("--cpu-time", action="store_true", help="time by process CPU time")
    args = ap.parse_args()
    process = EDM()
    model = LocalMLP(SHAPE, **NET, num_classes=K, rngs=nnx.Rngs(0))
    _randomise_outputs(model)
    g, params = nnx.split(model, nnx.Param)
    net = NetworkScore(process=process, graphdef=g, params=params, sigma_data=0.5)
    grid = edm_grid(args.steps, 0.1, 80.0)
    labels = Labels.balanced(K)
    n = args.steps
    k_hi, k_lo = n // 4, n // 4 + n // 2  # interval (grid[k_lo], grid[k_hi]]: half the steps
    interval = (float(grid[k_lo]), float(grid[k_hi]))
    # Heun: step i evaluates at grid[i] and (second order) grid[i + 1] > 0
    evals = list(grid[:-1]) + [s for s in grid[1:] if s > 0]
    inside = sum(interval[0] < s <= interval[1] for s in evals) / len(evals)
    sources = {
        "conditional, unguided (reference)": net.conditioned(labels),
        CFG_ROW: ClassifierFreeGuidance.create(net, scale=2.0).conditioned(labels),
        "CFG w=2, separate guide call": ClassifierFreeGuidance.create(
            net, scale=2.0, guide=NullLabel(process=process, inner=net)
        ).conditioned(labels),
        "TCFG w=2": ClassifierFreeGuidance.create(net, scale=2.0, filter="tangential").conditioned(
            labels
        ),
        f"CFG w=2 on (grid[{k_lo}], grid[{k_hi}]] = ({interval[0]:.3g}, {interval[1]:.3g}]": (
            ClassifierFreeGuidance.create(net, scale=2.0, interval=interval).conditioned(labels)
        ),
    }
    clf = _classifier(process)
    if clf is not None:
        sources["classifier guidance s=2"] = ClassifierGuidance.create(
            net, clf, scale=2.0
        ).conditioned(labels)
    print(
        f"# jax {jax.__version__}, backend {jax.default_backend()}, {jax.devices()[0]}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"load avg {os.getloadavg()[0]:.1f}, clock {'process CPU' if args.cpu_time else 'wall'}; "
        f"interval share of denoiser calls {inside:.3f}"
    )
    rows = []
    key = jax.random.key(0)
    clock = time.process_time if args.cpu_time else time.perf_counter
    for batch in args.batches:
        shape = (batch, *SHAPE)
        runs, nfes = {}, {}
        for label, src in sources.items():  # compile and warm up every row first
            runs[label] = functools.partial(heun, src, key, shape, grid=grid)
            nfes[label] = jax.block_until_ready(runs[label]())[1]["nfe"]
        # interleaved rounds, each timing every row once: a slow spell of a shared machine
        # hits every row alike; each row's minimum over the rounds
        best = dict.fromkeys(sources, np.inf)
        for _ in range(args.repeats):
            for label, fn in runs.items():
                t0 = clock()
                jax.block_until_ready(fn()[0])
                best[label] = min(best[label], (clock() - t0) / nfes[label])
        ref = best[next(iter(sources))]
        r_cfg = best[CFG_ROW] / ref
        for label, t in best.items():
            ratio = t / ref
            pred = 1 + inside * (r_cfg - 1) if "grid[" in label else None
            rows.append((batch, label, nfes[label], t * 1e3, ratio, pred))
            extra = f"  predicted {pred:.3f}" if pred else ""
            print(
                f"batch {batch}: {label:<60} NFE {nfes[label]:3d} {t * 1e3:8.3f} ms/NFE "
                f"ratio {ratio:.3f}{extra}",
                flush=True,
            )
    print("\n| batch | source | NFE | ms / NFE | ratio to unguided | predicted |")
    print("|---:|---|---:|---:|---:|---:|")
    for b, label, nfe, ms, r, pred in rows:
        p = "" if pred is None else f"{pred:.2f}"
        print(f"| {b} | {label} | {nfe} | {ms:.3f} | {r:.2f} | {p} |")


if __name__ == "__main__":
    main()
