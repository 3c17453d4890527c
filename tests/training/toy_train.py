"""A tiny EDM training run used by the training tests, in-process or as a script.

``python tests/training/toy_train.py RUN_DIR --num-steps N [...]`` trains (or
resumes) the run in ``RUN_DIR``; the data are a pure function of the step. As a script it
behaves like an entry point: on SIGINT/SIGTERM/SIGUSR1 it prints the interruption's
message ("saved step N; rerun the same command to resume") and exits with its status.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib.nets.mlp import MLP
from scorelib.objectives import EDMLoss
from scorelib.processes import EDM
from scorelib.training import (
    EMA,
    Checkpointer,
    Interrupted,
    init_state,
    make_optimizer,
    make_train_step,
    network_source,
    train,
)

BATCH = 32
OPT = make_optimizer(lr=1e-2, warmup_steps=5, grad_clip=1.0)


def make_batch_fn(nan_at: int | None = None):
    def batch_fn(i):
        k = jax.random.fold_in(jax.random.key(1234), i)
        kc, kn = jax.random.split(k)
        centre = jnp.where(jax.random.bernoulli(kc, 0.5, (BATCH, 1)), 1.0, -1.0)
        x = centre * jnp.array([1.0, 0.5]) + 0.1 * jax.random.normal(kn, (BATCH, 2))
        if nan_at is not None:
            x = jnp.where(i == nan_at, jnp.nan, x)
        return x

    return batch_fn


def parser():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--num-steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=1000)
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--nan-at", type=int, default=None)
    p.add_argument("--nonfinite", default="stop")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds of host sleep per step")
    return p


@functools.cache
def _model(width):
    model = MLP((2,), width=width, depth=2, rngs=nnx.Rngs(0))
    return init_state(model, OPT, seed=7)


@functools.cache
def _step(width, nan_at):
    """Cached, so tests in one process compile each variant once."""
    graphdef, _ = _model(width)
    proc = EDM()
    return make_train_step(
        EDMLoss(process=proc),
        network_source(proc, graphdef, sigma_data=0.5),
        OPT,
        EMA(batch_size=BATCH, halflife_nimg=200.0, rampup_ratio=0.5),
        make_batch_fn(nan_at),
    )


def build(args):
    """``(state, step_fn, ckpt)`` for the parsed ``args`` (a fresh state: it gets donated)."""
    _, state0 = _model(args.width)
    state = jax.tree.map(lambda x: x.copy(), state0)
    step = _step(args.width, args.nan_at)
    if args.sleep:
        fast = step

        def step(s):
            time.sleep(args.sleep)
            return fast(s)

    ckpt = Checkpointer(
        os.path.join(args.run_dir, "ckpt"),
        save_every=args.save_every,
        keep_last=args.keep_last,
        config={"model": {"kind": "mlp", "width": args.width, "depth": 2}},
    )
    return state, step, ckpt


def run(argv):
    args = parser().parse_args(argv)
    state, step, ckpt = build(args)
    try:
        return train(
            state,
            step,
            num_steps=args.num_steps,
            ckpt=ckpt,
            log_dir=args.run_dir,
            log_every=args.log_every,
            nonfinite=args.nonfinite,
            progress=False,
        )
    finally:
        ckpt.close()


if __name__ == "__main__":
    try:
        run(sys.argv[1:])
    except Interrupted as e:
        print(e.message, flush=True)
        raise
    print("done", flush=True)
