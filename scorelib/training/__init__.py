"""Training: state, optimizer, EMA, the jitted step, checkpoints and the loop.

Wiring (see ``tests/training`` for a runnable example)::

    model = MLP((2,), width=32, depth=2, rngs=nnx.Rngs(0))
    opt = make_optimizer(lr=1e-3, warmup_steps=100, grad_clip=1.0)
    graphdef, state = init_state(model, opt, seed=0)
    step = make_train_step(
        EDMLoss(process=EDM()), network_source(EDM(), graphdef, 0.5), opt,
        EMA(batch_size=256, halflife_nimg=50_000, rampup_ratio=0.05),
        batch_fn,                                  # step index -> x0, traceable
    )
    ckpt = Checkpointer(run_dir / "ckpt", save_every=1000, keep_last=3, keep_every=10_000,
                        config={"model": model_cfg})
    try:
        state = train(state, step, num_steps=20_000, ckpt=ckpt, log_dir=run_dir)
    except Interrupted as e:       # SIGINT / SIGTERM / SIGUSR1: the step is saved
        print(e.message)           # "saved step N; rerun the same command to resume"
        raise                      # exits with e.code (130 / 143 / 138)
    finally:
        ckpt.close()

Running the same code again resumes from the newest readable checkpoint in ``run_dir``.
To start a new run from another run's weights (fine-tuning), replace the fresh state's
``params`` and ``ema_params`` with :func:`restore_params` of that run's checkpoints.

A step of another kind of training (``scorelib.distill``) builds on the same pieces: a
``TrainState`` of several parts with one optimizer each (``TrainState.create``), the
update that skips non-finite steps (:func:`apply_update`) and the step counters
(:func:`advance`); the loop and the checkpoints take it as they are.
"""

from scorelib.training.checkpoint import (
    Checkpointer,
    CheckpointError,
    ClosedLoopTracebackFilter,
    IncompatibleCheckpoint,
    RestoredParams,
    filter_closed_loop_tracebacks,
    quiet_closed_loop_tracebacks,
    restore_params,
)
from scorelib.training.ema import EMA, ema_decay, ema_update
from scorelib.training.loop import STOP_SIGNALS, Interrupted, exit_status, train
from scorelib.training.metrics_log import MetricsWriter
from scorelib.training.multi_seed import stack, train_seeds, unstack
from scorelib.training.optim import make_optimizer, warmup_schedule
from scorelib.training.state import TrainState, abstract_state, create_state, init_state
from scorelib.training.step import advance, apply_update, make_train_step, network_source

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "IncompatibleCheckpoint",
    "RestoredParams",
    "restore_params",
    "ClosedLoopTracebackFilter",
    "filter_closed_loop_tracebacks",
    "quiet_closed_loop_tracebacks",
    "EMA",
    "ema_decay",
    "ema_update",
    "STOP_SIGNALS",
    "Interrupted",
    "exit_status",
    "train",
    "MetricsWriter",
    "stack",
    "train_seeds",
    "unstack",
    "make_optimizer",
    "warmup_schedule",
    "TrainState",
    "abstract_state",
    "create_state",
    "init_state",
    "advance",
    "apply_update",
    "make_train_step",
    "network_source",
]
