"""Sampler overhead: time per NFE of each sampler / time of one jitted denoiser call.

Network: ``scorelib.nets.mlp.MLP(data_shape=(64,), width=256, depth=4)`` behind EDM
preconditioning (``NetworkScore``, VP process for the SDE samplers' coefficients,
EDM process for the ODE samplers). The reference "forward" is one jitted
``source.denoiser(x, t)`` (network + preconditioning = exactly what one NFE is),
measured in the same run. Also reported: the raw network ``net(x, c_noise)`` and K
denoiser calls inside one ``lax.scan`` (does the loop itself cost anything?).

Timings: minimum of ``--repeats`` runs after a warm-up (compile) run, each ended by
``block_until_ready``; wall clock, or process CPU time with ``--cpu-time``. Target
ratio <= 1.03.

With ``--hlo`` nothing is timed: each configuration's compiled program (XLA's optimised
HLO) is summarised by its instruction count and a hash of its opcode histogram, so that
two revisions can be compared (run this file with ``PYTHONPATH`` at each checkout; it
uses only the public sampler API).

    .venv/bin/python benchmarks/samplers.py [--batches 256 16384] [--repeats 5] [--cpu-time]
    .venv/bin/python benchmarks/samplers.py --hlo [--batches 256]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import platform
import re
import time

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib.nets.mlp import MLP
from scorelib.processes import EDM, VP
from scorelib.samplers import SAMPLERS, edm_grid, uniform_t_grid
from scorelib.scores import NetworkScore

D = 64


def timeit(fn, repeats):
    """Minimum wall time over ``repeats`` runs after a warm-up (the least-disturbed run).

    With ``--cpu-time`` the process CPU time (all threads) is used instead: on a shared,
    oversubscribed machine it measures the work done rather than the waiting.
    """
    jax.block_until_ready(fn())  # warm-up / compile
    clock = time.process_time if CPU_TIME else time.perf_counter
    ts = []
    for _ in range(repeats):
        t0 = clock()
        jax.block_until_ready(fn())
        ts.append(clock() - t0)
    return min(ts)


CPU_TIME = False


def _scanned_denoiser(s, x, k):
    """``k`` denoiser calls chained inside one ``lax.scan``."""

    def body(x, _):
        return s.denoiser(x, jnp.float32(1.0)), None

    return jax.lax.scan(body, x, None, length=k)[0]


def _configs(src_edm, src_vp, n):
    """(sampler, source, grid, options): about 20 NFE each."""
    return [
        ("heun", src_edm, edm_grid(n), {}),
        ("heun", src_edm, edm_grid(n), dict(unroll=2)),
        ("heun", src_edm, edm_grid(n), dict(S_churn=40.0, S_min=0.05, S_max=50.0)),
        ("dpmpp_2m", src_edm, edm_grid(2 * n), {}),
        ("pf_ode_euler", src_vp, uniform_t_grid(VP(), 2 * n), {}),
        ("euler_maruyama", src_vp, uniform_t_grid(VP(), 2 * n), {}),
        ("pc", src_vp, uniform_t_grid(VP(), n), dict(n_corrector=1)),
        ("annealed_langevin", src_edm, edm_grid(n // 2), dict(n_steps_each=4)),
    ]


def _label(name, opts):
    return name + ("" if not opts else " " + ",".join(f"{a}={b}" for a, b in opts.items()))


def hlo_summary(f, src, shape, grid, opts) -> tuple[int, str]:
    """Instruction count and opcode-histogram hash of the compiled sampler program."""
    text = (
        jax.jit(lambda s, k: f(s, k, shape, grid=grid, **opts)[0])
        .lower(src, jax.random.key(0))
        .compile()
        .as_text()
    )
    ops = collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", text))
    digest = hashlib.sha1(repr(sorted(ops.items())).encode()).hexdigest()[:10]
    return sum(ops.values()), digest


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 16384])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cpu-time", action="store_true", help="time by process CPU time")
    ap.add_argument("--hlo", action="store_true", help="compiled program sizes, no timing")
    args = ap.parse_args()
    global CPU_TIME
    CPU_TIME = args.cpu_time

    model = MLP((D,), width=256, depth=4, rngs=nnx.Rngs(0))
    # Non-zero last layer so the network output is not trivially zero.
    model.out.kernel.value = 0.01 * jax.random.normal(jax.random.key(1), model.out.kernel.shape)
    g, params = nnx.split(model, nnx.Param)
    n = args.steps
    key = jax.random.key(0)
    print(
        f"# jax {jax.__version__}, backend {jax.default_backend()}, {jax.devices()[0]}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"load avg {os.getloadavg()[0]:.1f}, clock {'process CPU' if CPU_TIME else 'wall'}"
    )
    rows = []
    for batch in args.batches:
        x = jax.random.normal(jax.random.key(2), (batch, D))
        per = {}
        for pname, proc in [("edm", EDM()), ("vp", VP())]:
            src = NetworkScore(process=proc, graphdef=g, params=params, sigma_data=0.5)
            t = jnp.float32(proc.t_of_ve_sigma(1.0))
            fwd = jax.jit(lambda s, x, t: s.denoiser(x, t))
            if args.hlo:
                per[pname] = (src, None)
                continue
            per[pname] = (src, timeit(lambda f=fwd, s=src, x=x, t=t: f(s, x, t), args.repeats * 4))
        src_edm, t_fwd = per["edm"]
        src_vp, t_fwd_vp = per["vp"]
        if args.hlo:
            print(f"\nbatch {batch}: compiled programs")
            for name, src, grid, opts in _configs(src_edm, src_vp, n):
                count, digest = hlo_summary(SAMPLERS[name], src, (batch, D), grid, opts)
                print(f"  {_label(name, opts):<55} {count:5d} HLO instructions, opcodes {digest}")
            continue
        raw = jax.jit(lambda p, x, c: nnx.merge(g, p)(x, c))
        c = jnp.zeros((batch,))
        t_raw = timeit(lambda f=raw, x=x, c=c: f(params, x, c), args.repeats * 4)
        k = 2 * n - 1

        scanned = jax.jit(_scanned_denoiser, static_argnames="k")
        t_scan = timeit(lambda f=scanned, s=src_edm, x=x, k=k: f(s, x, k=k), args.repeats) / k
        print(
            f"\nbatch {batch}: denoiser forward {t_fwd * 1e3:.3f} ms (EDM), "
            f"{t_fwd_vp * 1e3:.3f} ms (VP); raw net {t_raw * 1e3:.3f} ms; "
            f"denoiser inside lax.scan {t_scan * 1e3:.3f} ms/call "
            f"(ratio {t_scan / t_fwd:.3f})"
        )
        for name, src, grid, opts in _configs(src_edm, src_vp, n):
            ref = t_fwd if src is src_edm else t_fwd_vp
            f = SAMPLERS[name]
            nfe = f(src, key, (batch, D), grid=grid, **opts)[1]["nfe"]
            t = timeit(
                lambda f=f, src=src, grid=grid, opts=opts, shape=(batch, D): f(
                    src, key, shape, grid=grid, **opts
                )[0],
                args.repeats,
            )
            label = _label(name, opts)
            rows.append((batch, label, nfe, t / nfe * 1e3, t / nfe / ref))
            print(
                f"  {label:<55} NFE {nfe:4d}  {t / nfe * 1e3:8.3f} ms/NFE  "
                f"ratio {t / nfe / ref:.3f}",
                flush=True,
            )
    if args.hlo:
        return
    print("\n| batch | sampler | NFE | ms / NFE | ratio to one denoiser forward |")
    print("|---:|---|---:|---:|---:|")
    for b, label, nfe, ms, r in rows:
        print(f"| {b} | {label} | {nfe} | {ms:.3f} | {r:.3f} |")


if __name__ == "__main__":
    main()
