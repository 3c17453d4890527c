"""Data-parallel overhead: train steps/s and samples/s on 1, 2, 4, 8 forced CPU devices and in
2 processes, against one device; and the time from SIGUSR1 to a saved checkpoint.

The workload is the digits-sized EDM of the CPU defaults: ``MLP(data_shape=(64,),
width=256, depth=4)``, global batch 256 (the same for every device count), Adam; sampling
is Heun with 18 steps on 1,024 samples split along the mesh's ``data`` axis. Each
configuration is a fresh subprocess (JAX fixes its device count at start-up,
``XLA_FLAGS=--xla_force_host_platform_device_count=D``); 2 processes are two subprocesses
joined by ``jax.distributed`` on localhost, one device each. Times are the minimum over
``--repeats`` timed blocks after a compile/warm-up block; the loop syncs every 10 steps as
the training loop does (more unsynced collective steps can deadlock XLA:CPU).

On a machine with C cores, D forced devices share the same C cores: this measures the
cost of splitting the batch and all-reducing the gradients (the overhead per step against
the single-device step), not a speed-up. On GPUs use ``benchmarks/scaling_gpu.py``.

SIGUSR1 -> checkpoint: a training run (``scorelib.training.train`` with a
``Checkpointer``) is sent SIGUSR1 after its first log line; the time is from the
``kill`` to the "saved step N" line, printed after the checkpoint is on disk.

    .venv/bin/python benchmarks/scaling.py [--devices 1 2 4 8] [--steps 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

D, WIDTH, DEPTH, BATCH, NUM_SAMPLES, HEUN_STEPS = 64, 256, 4, 256, 1024, 18


def child(args) -> None:
    """One configuration, in this process: prints a JSON line of timings (process 0)."""
    from scorelib import parallel

    settings = parallel.process_settings(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )
    parallel.initialize(settings)
    parallel.check_devices(settings)
    import jax
    import numpy as np
    from flax import nnx
    from train_timing import best_block_seconds, edm_train_step

    from scorelib.data import get_batch
    from scorelib.nets.mlp import MLP
    from scorelib.processes import EDM
    from scorelib.samplers import edm_grid, get_sampler
    from scorelib.training import init_state, make_optimizer, network_source

    mesh = parallel.make_mesh()
    opt = make_optimizer(lr=1e-3)
    model = MLP((D,), width=WIDTH, depth=DEPTH, rngs=nnx.Rngs(0))
    graphdef, state = init_state(model, opt, seed=0)
    state = parallel.shard(state, mesh)
    data = parallel.shard(np.random.default_rng(0).uniform(-1, 1, (1797, D)).astype("f4"), mesh)
    batch_fn = lambda i: get_batch(data, BATCH, seed=0, step=i)
    step = edm_train_step(graphdef, opt, batch_fn, BATCH, 0.999, mesh)
    state, seconds = best_block_seconds(step, state, args.steps, args.repeats)
    train_s = seconds / args.steps

    source = network_source(EDM(), graphdef, 0.5)(state.ema_params, None)
    heun = get_sampler("heun")
    grid = edm_grid(HEUN_STEPS)
    x_T = jax.random.normal(jax.random.key(1), (NUM_SAMPLES, D)) * 80.0
    x_T = parallel.shard(np.asarray(x_T), mesh, [(".*", parallel.batch_sharding(mesh).spec)])
    draw = jax.jit(lambda x: heun(source, jax.random.key(2), (NUM_SAMPLES, D), grid=grid, x_T=x)[0])
    jax.block_until_ready(draw(x_T))
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(draw(x_T))
        times.append(time.perf_counter() - t0)
    if jax.process_index() == 0:
        print(
            json.dumps(
                {
                    "devices": jax.device_count(),
                    "processes": jax.process_count(),
                    "step_ms": 1e3 * train_s,
                    "samples_per_s": NUM_SAMPLES / min(times),
                }
            ),
            flush=True,
        )


def signal_child(args) -> None:
    """A training run with a checkpointer; prints 'ready' after its first log line and the
    wall time at which its checkpoint was on disk."""
    import logging

    from flax import nnx
    from train_timing import edm_train_step

    from scorelib.data import toy_batch
    from scorelib.nets.mlp import MLP
    from scorelib.training import Checkpointer, Interrupted, init_state, make_optimizer, train

    class Ready(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("step "):
                print("ready", flush=True)
                logging.getLogger("scorelib.training").removeHandler(self)

    logging.getLogger("scorelib.training").addHandler(Ready())
    logging.getLogger("scorelib.training").setLevel(logging.INFO)
    opt = make_optimizer(lr=1e-3)
    graphdef, state = init_state(MLP((2,), width=WIDTH, depth=DEPTH, rngs=nnx.Rngs(0)), opt, 0)
    step = edm_train_step(
        graphdef, opt, lambda i: toy_batch("checkerboard", BATCH, seed=0, step=i), BATCH, 0.999
    )
    ckpt = Checkpointer(args.ckpt, save_every=10**9)
    try:
        train(state, step, num_steps=10**7, ckpt=ckpt, log_every=10, progress=False)
    except Interrupted as e:
        print(json.dumps({"saved_at": time.time(), "step": e.step}), flush=True)
    finally:
        ckpt.close()


def _env(devices: int) -> dict:
    from scorelib.parallel import forced_devices_env

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    return forced_devices_env(devices, PYTHONPATH=path)


def _child_cmd(args, *extra) -> list[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--steps",
        str(args.steps),
        "--repeats",
        str(args.repeats),
        *extra,
    ]


def run_devices(args, devices: int) -> dict:
    out = subprocess.run(
        _child_cmd(args), env=_env(devices), capture_output=True, text=True, timeout=1800
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_two_processes(args) -> dict:
    from scorelib.parallel import free_ports

    port = free_ports(2)  # the coordinator's and the roll call's
    procs = [
        subprocess.Popen(
            _child_cmd(args, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2")
            + ["--process-id", str(i)],
            env=_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(err[-3000:])
    return json.loads(outs[0][0].strip().splitlines()[-1])


def time_sigusr1(repeats: int) -> list[float]:
    """Seconds from SIGUSR1 to the checkpoint on disk, ``repeats`` times."""
    out = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            cmd = [sys.executable, os.path.abspath(__file__), "--signal-child", "--ckpt", d]
            p = subprocess.Popen(
                cmd, env=_env(1), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
            assert p.stdout.readline().strip() == "ready"
            time.sleep(0.5)
            t0 = time.time()
            p.send_signal(signal.SIGUSR1)
            line = p.stdout.readline()
            p.wait(timeout=120)
            out.append(json.loads(line)["saved_at"] - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-processes", action="store_true", help="skip the 2-process run")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--signal-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    p.add_argument("--num-processes", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.signal_child:
        return signal_child(args)

    print(f"# {platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"# MLP {WIDTH}x{DEPTH} on {D}-d data, global batch {BATCH}; Heun-{HEUN_STEPS}")
    rows = [(f"{d} device{'s' if d > 1 else ''}", run_devices(args, d)) for d in args.devices]
    if not args.no_processes:
        rows.append(("2 processes x 1 device", run_two_processes(args)))
    base = rows[0][1]
    print("| configuration | ms / train step | overhead vs 1 device | samples/s | vs 1 device |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {r['step_ms']:.2f} | {r['step_ms'] / base['step_ms']:.2f}x | "
            f"{r['samples_per_s']:.0f} | {r['samples_per_s'] / base['samples_per_s']:.2f}x |"
        )
    waits = time_sigusr1(args.repeats)
    print(
        f"\nSIGUSR1 -> checkpoint on disk: {1e3 * min(waits):.0f} ms (min), "
        f"{1e3 * max(waits):.0f} ms (max) over {len(waits)} runs"
    )


if __name__ == "__main__":
    main()
