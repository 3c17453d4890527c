"""The one-command GPU benchmark (``make bench-gpu``): the CIFAR-10 presets on one accelerator.

On one GPU (``CUDA_VISIBLE_DEVICES=0`` unless set), with synthetic 32x32x3 images (uniform
uint8 in a temporary ``.npz``: no data set is needed, a step costs the same):

1. **train**: steps/s and images/s of the CIFAR-10 EDM U-Net recipe (``docs/clusters.md``,
   "CIFAR-10 recipes": ``experiment=mnist_edm`` with ``data=npz model.channels=128
   model.channel_mult=[2,2,2] model.attn_resolutions=[16]``; batch 128), the fastest of
   ``--repeats`` blocks of ``--train-steps`` steps after a compile block;
2. **sample**: samples/s of the run's sampler (EDM Heun, 18 steps, NFE 35) on that U-Net at
   batch ``--sample-batch``, the fastest of ``--repeats`` calls after a compile call;
3. **distill**: steps/s of the ``experiment=fdistill_cifar10`` preset (one-step forward-KL
   student, fake score and discriminator heads on the teacher U-Net's features; the
   teacher is the U-Net of 1, saved after one step) at batch ``--distill-batch`` (the
   preset's 2048 is the global batch of 8 GPUs), timed over whole cycles of
   ``distill.student_every`` steps (one student, the rest critic steps);

each with its FLOP rate (XLA's cost analysis of the lowered step, and of one network
evaluation times the NFE for sampling; none for the distillation, whose student and critic
steps are two programs of different cost) and the device's peak memory after it
(``memory_stats()["peak_bytes_in_use"]``, a running peak). Printed as a markdown table with
the device, jax version, matmul precision, revision and wall time. The defaults are sized
from the first run on a GPU (an H200, BENCHMARKS.md, "GPU"): most of the time is XLA
compiling the three programs (at ``highest`` 120 s for the train step alone), and at TF32
the whole script took 223 s with smaller blocks.

    make install-cuda && make bench-gpu        # = .venv/bin/python benchmarks/scaling_gpu.py
    .venv/bin/python benchmarks/scaling_gpu.py [--train-steps 30] [--sample-batch 512]
        [--distill-batch 256] [--distill-cycles 2] [--repeats 2]
        [--precision {highest,tensorfloat32,bfloat16}]
    .venv/bin/python benchmarks/scaling_gpu.py --cpu-smoke    # every path, tiny, on CPU

Without a GPU it stops with a one-line message (a CPU-only jaxlib: ``make install-cuda``).
``--cpu-smoke`` runs every path at tiny sizes (a U-Net of 8 channels, batch 8, one
repeat) on whatever JAX sees, to check the script end to end; its figures mean nothing.
Record the output in BENCHMARKS.md with the GPU model, the driver and the command.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from hydra import compose, initialize_config_dir
from train_timing import best_block_seconds

from experiments.build import MATMUL_PRECISION, MATMUL_PRECISIONS
from experiments.runs import DistillRun, ScoreRun, configure_jax, train_run
from experiments.schema import register_configs

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

# The CIFAR-10 EDM U-Net recipe (docs/clusters.md) and the fdistill preset.
TEACHER = [
    "experiment=mnist_edm",
    "name=cifar10_edm",
    "data=npz",
    "model.channels=128",
    "model.channel_mult=[2,2,2]",
    "model.attn_resolutions=[16]",
]
DISTILL = ["experiment=fdistill_cifar10"]
# --cpu-smoke: the sizes of tests/slurm's tiny CIFAR-shaped teacher and distillation.
SMOKE_TEACHER = [
    "model.channels=8",
    "model.channel_mult=[1,2,2]",
    "model.num_res_blocks=1",
    "model.emb_dim=16",
    "model.attn_resolutions=[]",
    "trainer.batch_size=8",
]
SMOKE_DISTILL = ["distill.disc_width=8"]


def peak_gib() -> float | None:
    """The first device's running peak of memory in use, GiB (None where not reported)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**30


def flops(fn, *args) -> float | None:
    """XLA's count of the floating-point operations of one call ``fn(*args)`` (its cost
    analysis of the lowered program; nothing runs), or None where the backend gives none.

    A GPU gives none (jax 0.11.2 on an H200): its client analyses compiled programs only,
    and there the convolutions and matmuls are cuDNN/cuBLAS calls that the analysis does
    not count (1.4 of the 67.8 GFLOP per image of the U-Net train step). The column is
    then left blank rather than wrong; BENCHMARKS.md gives the CPU's count beside it."""
    cost = jax.jit(fn).lower(*args).cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost  # older jax: one per device
    value = (cost or {}).get("flops")
    return None if value is None or value <= 0 else float(value)


def tflops(count: float | None, per_s: float) -> str:
    """``count`` FLOPs ``per_s`` times a second, in TFLOP/s for the table ("" if unknown)."""
    return "" if count is None else f"{count * per_s / 1e12:.3g}"


def revision() -> str:
    here = Path(__file__).resolve().parent

    def git(*c):  # "" where there is no git or no repository (a copied tree)
        try:
            return subprocess.run(["git", *c], cwd=here, capture_output=True, text=True).stdout
        except OSError:
            return ""

    rev = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return rev + (" (dirty)" if git("status", "--porcelain").strip() else "")


def bench_train(over: list[str], run_dir: Path, steps: int, repeats: int) -> tuple[dict, object]:
    """Train steps/s of the U-Net run of ``over``; the run is saved in ``run_dir`` after
    its first step (the distillation's teacher). Returns ``(row, (run, state))``."""
    cfg = compose("train", overrides=[*over, "trainer.steps=1", "trainer.log_every=1"])
    t0 = time.perf_counter()
    run, state = train_run(ScoreRun, cfg, run_dir, progress=False, tensorboard=False)
    compile_s = time.perf_counter() - t0
    state, best = best_block_seconds(run.step_fn, state, steps, repeats)  # donates its input
    batch = cfg.trainer.batch_size
    params = sum(x.size for x in jax.tree.leaves(state.params))
    row = {
        "what": f"train: EDM U-Net {cfg.model.channels} ch {list(cfg.model.channel_mult)}, "
        f"{params / 1e6:.1f}M params, batch {batch}",
        "rate": f"{steps / best:.2f} steps/s ({steps * batch / best:.0f} images/s)",
        "tflops": tflops(flops(run.step_fn, state), steps / best),
        "first_s": compile_s,
        "peak": peak_gib(),
    }
    return row, (run, state)


def bench_sample(run, state, batch: int, repeats: int) -> dict:
    """Samples/s of the run's sampler (Heun-18 for the preset) at ``batch``."""
    source, shape = run.source(state.ema_params), run.data.data_shape
    key = jax.random.key(0)

    def draw():
        x, info = run.sampling(source, key, (batch, *shape))
        return jax.block_until_ready(x), info

    t0 = time.perf_counter()
    _, info = draw()
    first = time.perf_counter() - t0
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        draw()
        best = min(best, time.perf_counter() - t0)
    # one network evaluation (network and preconditioning) of the whole batch
    x, sigma = jax.numpy.zeros((batch, *shape)), jax.numpy.ones((batch,))
    forward = flops(lambda p, x, s: run.source(p).denoiser(x, s), state.ema_params, x, sigma)
    nfe = info.get("nfe")
    return {
        "what": f"sample: {run.sampling.name} {run.sampling.record.get('steps')} steps "
        f"(NFE {nfe}), batch {batch}",
        "rate": f"{batch / best:.1f} samples/s",
        "tflops": tflops(None if forward is None or nfe is None else forward * nfe, 1 / best),
        "first_s": first,
        "peak": peak_gib(),
    }


def bench_distill(over: list[str], cycles: int, repeats: int) -> dict:
    """Steps/s of the distillation of ``over`` over ``cycles`` whole student/critic cycles."""
    cfg = compose("distill", overrides=over)
    run = DistillRun.build(cfg)
    configure_jax(cfg.trainer.matmul_precision)  # as train_run does after building
    step, state = run.step_fn, run.state
    every = int(cfg.distill.student_every)
    t0 = time.perf_counter()
    for i in range(every):  # compiles the student and the critic branch
        state, m = step(state, i)
    jax.block_until_ready(state)
    first = time.perf_counter() - t0
    n, best, i = cycles * every, np.inf, every
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            state, m = step(state, i)
            i += 1
        jax.block_until_ready(state)
        best = min(best, time.perf_counter() - t0)
    loss = {k: float(v) for k, v in m.items() if np.ndim(v) == 0}
    if not all(np.isfinite(v) for v in loss.values()):
        raise FloatingPointError(f"non-finite distillation metrics: {loss}")
    batch = cfg.trainer.batch_size
    return {
        "what": f"distill: fdistill_cifar10 ({cfg.distill.divergence}, disc_width "
        f"{cfg.distill.disc_width}, student every {every}), batch {batch}",
        "rate": f"{n / best:.2f} steps/s ({n * batch / best:.0f} images/s)",
        "tflops": "",  # student and critic steps differ: not one count
        "first_s": first,
        "peak": peak_gib(),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train-steps", type=int, default=30, help="steps per timed block")
    p.add_argument("--sample-batch", type=int, default=512)
    p.add_argument("--distill-batch", type=int, default=256)
    p.add_argument("--distill-cycles", type=int, default=2, help="student/critic cycles timed")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--precision",
        choices=MATMUL_PRECISIONS,
        default=MATMUL_PRECISION,
        help="trainer.matmul_precision of the benchmark's runs (default: "
        f"{MATMUL_PRECISION!r}, full float32; tensorfloat32: TF32 tensor cores on NVIDIA "
        "GPUs; bfloat16: JAX's DEFAULT, one bfloat16 pass)",
    )
    p.add_argument(
        "--cpu-smoke", action="store_true", help="every path at tiny sizes on any backend"
    )
    a = p.parse_args(argv)
    for name in ("train_steps", "sample_batch", "distill_batch", "distill_cycles", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(a, name)}")
    if a.cpu_smoke:
        a.train_steps, a.sample_batch, a.distill_batch = 2, 8, 8
        a.distill_cycles, a.repeats = 1, 1
    return a


def refusal(backend: str, smoke: bool) -> str | None:
    """The one-line message that stops a real run on a machine without a GPU, or None."""
    if backend == "gpu" or smoke:
        return None
    return (
        f"scaling_gpu.py: JAX sees no GPU (backend {backend}); run make install-cuda on a GPU "
        "machine, or --cpu-smoke to check the script at tiny sizes"
    )


def print_row(r: dict) -> None:
    """One row of the markdown table (``r``: a ``bench_*`` result)."""
    peak = "n/a" if r["peak"] is None else f"{r['peak']:.2f}"
    cells = (r["what"], r["rate"], r["tflops"], f"{r['first_s']:.0f}", peak)
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def main(argv=None) -> None:
    a = parse_args(argv)
    # one accelerator: the first GPU unless the caller chose (read when JAX starts its
    # backends, at jax.default_backend() below; nothing imported above has started them)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    msg = refusal(jax.default_backend(), a.cpu_smoke)
    if msg:
        sys.exit(msg)
    register_configs()
    t_all = time.perf_counter()
    dev = jax.local_devices()[0]
    print(
        f"# {dev.device_kind} ({dev.platform}, 1 of {jax.device_count()} devices), "
        f"jax {jax.__version__}, revision {revision()}, {platform.node()}, "
        f"matmul precision {a.precision}"
        + (", --cpu-smoke (tiny sizes: the figures mean nothing)" if a.cpu_smoke else ""),
        flush=True,
    )
    # the table's rows as each benchmark finishes (a run cut short keeps the rows it has)
    print(
        "\n| benchmark | rate | TFLOP/s (XLA's count) | first call (compile) s "
        "| peak GiB (device 0, running) |"
    )
    print("|---|---|---:|---:|---:|", flush=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        initialize_config_dir(config_dir=str(CONFIGS), version_base=None),
    ):
        data = Path(tmp) / "cifar10.npz"  # the layout data=npz reads (docs/clusters.md)
        rng = np.random.default_rng(0)
        np.savez(data, images=rng.integers(0, 256, (1024, 32, 32, 3), dtype=np.uint8))
        precision = f"trainer.matmul_precision={a.precision}"
        teacher = [*TEACHER, f"data.path={data}", precision]
        teacher += SMOKE_TEACHER if a.cpu_smoke else []
        row, (run, state) = bench_train(teacher, Path(tmp) / "teacher", a.train_steps, a.repeats)
        print_row(row)
        print_row(bench_sample(run, state, a.sample_batch, a.repeats))
        del run, state
        over = [
            *DISTILL,
            f"teacher.run_dir={Path(tmp) / 'teacher'}",
            f"trainer.batch_size={a.distill_batch}",
            precision,
            *(SMOKE_DISTILL if a.cpu_smoke else []),
        ]
        print_row(bench_distill(over, a.distill_cycles, a.repeats))
    print(f"\ntotal wall time {time.perf_counter() - t_all:.0f} s; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
