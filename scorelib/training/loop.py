"""The training loop: resume, step, log, checkpoint, stop cleanly on a signal.

``train`` calls a jitted step from Python (on XLA:CPU a loop inside ``lax.scan`` was
11-14x slower in our measurements) and syncs with the host only every ``log_every``
steps, before a checkpoint, and on a signal. With several devices in one process keep
``log_every`` small (about 10): many unsynced collective steps can deadlock XLA:CPU's
all-reduce.

Signals. While :func:`train` runs (and only then: the previous handlers are put back
when it returns or raises) SIGINT (Ctrl-C), SIGTERM and SIGUSR1 (and any other
``stop_signals``) make the loop finish the current step, save a checkpoint of it, wait
until the checkpoint is on disk and raise :class:`Interrupted`, a ``SystemExit`` whose
status is ``128 + signal number``: 130 for SIGINT, 143 for SIGTERM, 138 for SIGUSR1 (on
Linux), the statuses a shell reports for a process killed by that signal, so a scheduler
never takes the run for a finished one. Running the same command again resumes from the
saved step, bit for bit (in a Slurm job, ``scorelib.parallel.requeue_after_stop`` then
requeues the job).
A second Ctrl-C *before* the step ends raises ``KeyboardInterrupt`` at once (nothing new
is saved; the checkpoints already on disk are untouched); Ctrl-C *during* the save is
ignored, so the save completes. Orbax writes every checkpoint into a temporary directory
renamed when complete, so even SIGKILL mid-save leaves the previous checkpoint readable.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from scorelib._checks import check_choice, check_int
from scorelib.training.checkpoint import Checkpointer
from scorelib.training.metrics_log import MetricsWriter
from scorelib.training.state import TrainState, abstract_state

NONFINITE_MODES = ("stop", "skip")

#: The signals that stop :func:`train` at a step boundary with a checkpoint.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

log = logging.getLogger("scorelib.training")


def exit_status(signum: int) -> int:
    """``128 + signum``: the exit status of a run stopped by signal ``signum`` (SIGINT: 130)."""
    return 128 + int(signum)


class Interrupted(SystemExit):
    """Raised by :func:`train` after SIGINT, SIGTERM or SIGUSR1, once the checkpoint is saved.

    A ``SystemExit``: uncaught, the process exits with status ``code`` and no traceback.

    Attributes:
      signum: the signal received (``signal.Signals``).
      step: the step saved to the checkpointer (the number of completed steps), or
        ``None`` when :func:`train` had no checkpointer.
      code: the exit status, :func:`exit_status` of ``signum`` (130, 143, 138).
      message: the line to show the user, ``"saved step N; rerun the same command to
        resume"`` (or, without a checkpointer, ``"stopped by SIGINT at step N; nothing
        saved"``). :func:`train` logs that a signal arrived but does not print this line:
        the entry point does.
    """

    def __init__(self, signum: int, step: int | None, *, at_step: int | None = None):
        self.signum = signal.Signals(signum)
        self.step = step
        super().__init__(exit_status(signum))
        if step is not None:
            self.message = f"saved step {step}; rerun the same command to resume"
        else:
            self.message = f"stopped by {self.signum.name} at step {at_step}; nothing saved"

    def __str__(self) -> str:
        return self.message


class _StopSignals:
    """While active (main thread only), record the stop signals instead of dying."""

    def __init__(self, enabled: bool, signals=STOP_SIGNALS):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signals = tuple(dict.fromkeys(signals))
        self.signum: int | None = None
        self.saving = False
        self._old: dict[int, object] = {}

    def __enter__(self):
        if self.enabled:
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
        elif signum == signal.SIGINT and not self.saving:
            raise KeyboardInterrupt  # second Ctrl-C before the step boundary: stop at once

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}


#: Steps dispatched without a host sync when a process drives several devices: more than
#: about 30 unsynced collective steps can deadlock XLA:CPU's all-reduce.
MAX_UNSYNCED_MULTI_DEVICE = 10


def _agreed_signal(signum: int | None) -> int | None:
    """The signal of the lowest-numbered process that received one (a collective: every
    process calls it at the same step), or ``None``."""
    got = np.asarray(multihost_utils.process_allgather(np.int32(signum or 0)))
    got = got[got > 0]
    return int(got[0]) if got.size else None


def _mean_metrics(pending: list[dict]) -> dict[str, float]:
    """Per-key means over steps whose update was applied (all steps if none was)."""
    host = jax.device_get(pending)
    finite = np.array([m["finite"] for m in host]) > 0
    rows = [m for m, ok in zip(host, finite, strict=True) if ok] or host
    return {k: float(np.mean([m[k] for m in rows])) for k in host[0] if k != "finite"}


def train(
    state: TrainState,
    step_fn: Callable[[TrainState], tuple[TrainState, dict]],
    *,
    num_steps: int,
    ckpt: Checkpointer | None = None,
    log_dir: str | None = None,
    log_every: int = 100,
    nonfinite: str = "stop",
    progress: bool = True,
    handle_signals: bool = True,
    tensorboard: bool = True,
    desc: str = "train",
    stop_signals: tuple[int, ...] = STOP_SIGNALS,
    sync_every: int | None = None,
    resume: bool = True,
) -> TrainState:
    """Run ``step_fn`` until ``state.step == num_steps``, resuming from ``ckpt`` if it has one.

    Args:
      state: the initial state (its structure is the restore target; its buffers
        may be donated).
      step_fn: ``state -> (state, metrics)``, e.g. from :func:`make_train_step`; one
        with ``takes_step = True`` (``scorelib.distill.DistillStep``) is called as
        ``step_fn(state, i)`` with the host's copy ``i`` of ``state.step``.
      num_steps: total number of steps of the run (not the number left).
      ckpt: a :class:`Checkpointer`; its newest readable checkpoint is restored first
        (see :meth:`Checkpointer.restore_latest`), one is saved every
        ``ckpt.save_every`` steps and at the end.
      log_dir: where ``metrics.jsonl`` and TensorBoard events go (``None``: no files).
      log_every: host-sync and logging interval in steps (>= 1). Logged values are
        means over the applied steps since the previous log line, plus
        ``steps_per_s``, ``n_skipped`` and the wall time ``time_s``. Each log step also
        emits ``step N/total  loss L  R steps/s`` at INFO on the ``scorelib.training``
        logger (Hydra writes it to ``train.log``).
      nonfinite: ``'stop'`` raises ``FloatingPointError("non-finite loss at step N")``
        (``N`` the 0-based index of the first bad step) at the next sync, before any
        later checkpoint is written; ``'skip'`` continues (the step already discarded
        the update and counted it in ``state.n_skipped``).
      progress: show a tqdm bar with steps/s and the loss.
      handle_signals: on SIGINT, SIGTERM or SIGUSR1 finish the current step, save it,
        and raise :class:`Interrupted` (see the module docstring). The handlers are
        installed only while ``train`` runs, and only in the main thread.
      tensorboard: also write TensorBoard events under ``log_dir/tb``.
      desc: the progress bar's label.
      stop_signals: the signals that stop the loop at a step boundary with a checkpoint
        (default :data:`STOP_SIGNALS`; add e.g. submitit's SIGUSR2 from
        ``scorelib.parallel.preempt_signals()``). The exit status is always
        ``128 + signum``.
      sync_every: wait for the device every this many steps (>= 1). ``None``: every
        :data:`MAX_UNSYNCED_MULTI_DEVICE` steps when this process drives several devices
        (more unsynced collective steps can deadlock XLA:CPU), else only at log steps.
      resume: restore ``ckpt``'s newest readable checkpoint first; ``False`` when the
        caller passes the state to continue from (one it restored itself).

    Several processes (``jax.distributed``): every process runs this loop with the same
    arguments; a signal seen by any process stops all of them at the next log step
    (they agree there, by an all-gather, so that they save the same step).

    Returns:
      The final state (also saved to ``ckpt``; pending saves are waited for).

    Raises:
      ValueError: bad arguments (naming ``trainer.*``), or a checkpoint that does not
        match the model (:class:`IncompatibleCheckpoint`).
      CheckpointError: a save failed or cannot be read back, or no checkpoint on disk
        is readable.
      FloatingPointError: see ``nonfinite``.
      Interrupted: see ``handle_signals``.
    """
    check_int(num_steps, "trainer.num_steps", low=0)
    check_int(log_every, "trainer.log_every", low=1)
    check_choice(nonfinite, "trainer.nonfinite", NONFINITE_MODES)
    if sync_every is None:
        sync_every = MAX_UNSYNCED_MULTI_DEVICE if jax.local_device_count() > 1 else num_steps + 1
    check_int(sync_every, "sync_every", low=1)
    multi_process = jax.process_count() > 1

    if ckpt is not None and resume:
        restored = ckpt.restore_latest(abstract_state(state))
        if restored is not None:
            state = restored
    start = int(state.step)
    if start > num_steps:
        raise ValueError(f"trainer.num_steps = {num_steps} is behind the restored step {start}")
    if start > 0:
        log.info("resumed from step %d of %d", start, num_steps)

    writer = MetricsWriter(log_dir, start, tensorboard=tensorboard) if log_dir else None
    bar = tqdm(total=num_steps, initial=start, desc=desc, disable=not progress, dynamic_ncols=True)
    pending: list[dict] = []
    t_last, s_last, t0 = time.perf_counter(), start, time.perf_counter()

    def check_finite():
        if nonfinite == "stop":
            bad = int(state.first_nonfinite)
            if bad >= 0:
                raise FloatingPointError(f"non-finite loss at step {bad}")

    try:
        with _StopSignals(handle_signals, stop_signals) as signals:
            for i in range(start, num_steps):
                if getattr(step_fn, "takes_step", False):  # e.g. scorelib.distill.DistillStep
                    state, metrics = step_fn(state, i)
                else:
                    state, metrics = step_fn(state)
                pending.append(metrics)
                s = i + 1
                last = s == num_steps
                do_log = s % log_every == 0 or last
                if multi_process:  # the processes agree on a stop at log steps only
                    if do_log:
                        signals.signum = _agreed_signal(signals.signum)
                    stop = do_log and signals.signum is not None
                else:
                    stop = signals.signum is not None
                if not do_log and s % sync_every == 0:
                    jax.block_until_ready(metrics["loss"])
                do_save = ckpt is not None and (ckpt.should_save(s) or last or stop)
                if do_log:
                    check_finite()
                    means = _mean_metrics(pending)
                    pending = []
                    now = time.perf_counter()
                    rate = (s - s_last) / max(now - t_last, 1e-9)
                    t_last, s_last = now, s
                    means.update(steps_per_s=rate, n_skipped=int(state.n_skipped), time_s=now - t0)
                    if writer is not None:
                        writer.write(s, means)
                    bar.update(s - bar.n)
                    loss = means.get("loss", math.nan)
                    bar.set_postfix(loss=f"{loss:.4g}", steps_per_s=f"{rate:.1f}")
                    log.info("step %d/%d  loss %.4g  %.1f steps/s", s, num_steps, loss, rate)
                if stop:
                    signals.saving = True
                    log.warning(
                        "%s received: stopping after step %d%s",
                        signal.Signals(signals.signum).name,
                        s,
                        " and saving it" if ckpt is not None else " (no checkpointer)",
                    )
                if do_save:
                    check_finite()  # never save a state past a non-finite step in 'stop' mode
                    ckpt.save(s, state, force=True)
                if stop:
                    if ckpt is not None:
                        ckpt.wait()
                    raise Interrupted(signals.signum, s if ckpt is not None else None, at_step=s)
            signals.saving = True
            if ckpt is not None:
                ckpt.wait()
            if multi_process:
                signals.signum = _agreed_signal(signals.signum)
            if signals.signum is not None:  # arrived during the final save: the run is done
                saved = num_steps if ckpt is not None else None
                raise Interrupted(signals.signum, saved, at_step=num_steps)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    return state
