"""A tiny data-parallel EDM run, as a script: prints one JSON line of per-step losses.

``python tests/parallel/sharded_train.py --steps N [--coordinator H:P --num-processes P
--process-id I] [--ckpt DIR --save-every K] [--restore-only]``

The global batch is the same whatever the device or process count; run it under
``XLA_FLAGS=--xla_force_host_platform_device_count=D`` for D devices in one process.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from scorelib import parallel


def parser():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--coordinator", default=None)
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--process-id", type=int, default=None)
    p.add_argument("--ckpt", default=None)
    p.add_argument("--save-every", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=4)
    p.add_argument("--dump", default=None, help="write the final state's leaves to this .npz")
    p.add_argument(
        "--restore-only", action="store_true", help="restore --ckpt's latest step, no training"
    )
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    settings = parallel.process_settings(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )
    parallel.initialize(settings, timeout_s=60)
    parallel.check_devices(settings)

    from flax import nnx

    from scorelib.data import toy_batch
    from scorelib.nets.mlp import MLP
    from scorelib.objectives import EDMLoss
    from scorelib.processes import EDM
    from scorelib.training import (
        EMA,
        Checkpointer,
        abstract_state,
        init_state,
        make_optimizer,
        make_train_step,
        network_source,
        train,
    )

    jax.config.update("jax_default_matmul_precision", "highest")
    mesh = parallel.make_mesh()
    parallel.check_batch_size(args.batch, mesh)
    opt = make_optimizer(lr=1e-2, warmup_steps=2, grad_clip=1.0)
    graphdef, state = init_state(MLP((2,), width=32, depth=2, rngs=nnx.Rngs(0)), opt, seed=7)
    state = parallel.shard(state, mesh)
    proc = EDM()
    step = make_train_step(
        EDMLoss(process=proc),
        network_source(proc, graphdef, 0.5),
        opt,
        EMA(batch_size=args.batch, decay=0.9),
        lambda i: toy_batch("checkerboard", args.batch, seed=3, step=i),
        batch_sharding=parallel.batch_sharding(mesh),
    )
    hlo = step.lower(state).compile().as_text()
    losses = []

    def logged(s):
        s, m = step(s)
        losses.append(m["loss"])
        return s, m

    ckpt = Checkpointer(args.ckpt, save_every=args.save_every) if args.ckpt else None
    if args.restore_only:
        state = ckpt.restore(ckpt.latest_step(), abstract_state(state))
        ckpt.close()
        assert {x.sharding for x in jax.tree.leaves(state)} == {parallel.replicated(mesh)}
        _dump(args.dump, state)
        print(json.dumps({"devices": jax.device_count(), "step": int(state.step)}), flush=True)
        return
    try:
        state = train(
            state,
            logged,
            num_steps=args.steps,
            ckpt=ckpt,
            log_every=args.log_every,
            progress=False,
            tensorboard=False,
        )
        if ckpt is not None:
            restored = ckpt.restore(ckpt.latest_step(), abstract_state(state))
            assert restored.params is not None
    finally:
        if ckpt is not None:
            ckpt.close()
    host = parallel.to_host(state)
    _dump(args.dump, state)
    out = {
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "losses": [float(x) for x in parallel.to_host(losses)],
        "params": float(sum(np.sum(np.abs(x)) for x in jax.tree.leaves(host.params))),
        "all_reduce": "all-reduce" in hlo,
        "shardings": sorted({str(x.sharding.spec) for x in jax.tree.leaves(state)}),
    }
    if jax.process_index() == 0:
        print(json.dumps(out), flush=True)


def _dump(path, state):
    if path and jax.process_index() == 0:
        leaves = jax.tree_util.tree_leaves_with_path(parallel.to_host(state))
        np.savez(path, **{jax.tree_util.keystr(p): x for p, x in leaves})


if __name__ == "__main__":
    main()
