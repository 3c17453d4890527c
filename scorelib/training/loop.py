"""The training loop: resume, step, log, checkpoint, handle preemption.

``train`` calls a jitted step from Python (on XLA:CPU a loop inside ``lax.scan``
was 11-14x slower, see ``shared/notes/infrastructure.md``) and syncs with the
host only every ``log_every`` steps, before a checkpoint, and on preemption.
With several devices in one process keep ``log_every`` small (about 10): many
unsynced collective steps can deadlock XLA:CPU's all-reduce.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable

import jax
import numpy as np
from tqdm.auto import tqdm

from scorelib.training.checkpoint import Checkpointer
from scorelib.training.metrics_log import MetricsWriter
from scorelib.training.state import TrainState, abstract_state

NONFINITE_MODES = ("stop", "skip")

#: Exit status of a run stopped by SIGTERM after saving its checkpoint: 128 + SIGTERM,
#: the conventional "terminated by signal 15", so a scheduler does not mistake the run
#: for a finished one. Running the same command again resumes it.
PREEMPTED_EXIT_CODE = 143


class Preempted(SystemExit):
    """Raised by :func:`train` after a SIGTERM once the checkpoint is saved.

    A ``SystemExit`` (code :data:`PREEMPTED_EXIT_CODE`): uncaught, the process exits
    cleanly with that status and no traceback. ``.step`` is the saved step.
    """

    def __init__(self, step: int):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step = step


class _SigtermFlag:
    """Sets a flag on SIGTERM while active (main thread only; elsewhere a no-op)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.flag = False
        self._old = None

    def __enter__(self):
        if self.enabled:
            self._old = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        self.flag = True

    def __exit__(self, *exc):
        if self.enabled:
            signal.signal(signal.SIGTERM, self._old)


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
    handle_sigterm: bool = True,
    tensorboard: bool = True,
    desc: str = "train",
) -> TrainState:
    """Run ``step_fn`` until ``state.step == num_steps``, resuming from ``ckpt`` if it has one.

    Args:
      state: the initial state (its structure is the restore target; its buffers
        may be donated).
      step_fn: ``state -> (state, metrics)``, e.g. from :func:`make_train_step`.
      num_steps: total number of steps of the run (not the number left).
      ckpt: a :class:`Checkpointer`; the latest checkpoint in it is restored first, one
        is saved every ``ckpt.save_every`` steps and at the end.
      log_dir: where ``metrics.jsonl`` and TensorBoard events go (``None``: no files).
      log_every: host-sync and logging interval in steps (>= 1). Logged values are
        means over the applied steps since the previous log line, plus
        ``steps_per_s``, ``n_skipped`` and the wall time ``time_s``.
      nonfinite: ``'stop'`` raises ``FloatingPointError("non-finite loss at step N")``
        (``N`` the 0-based index of the first bad step) at the next sync, before any
        later checkpoint is written; ``'skip'`` continues (the step already discarded
        the update and counted it in ``state.n_skipped``).
      progress: show a tqdm bar with steps/s and the loss.
      handle_sigterm: on SIGTERM finish the current step, save a checkpoint, and raise
        :class:`Preempted` (exit status 143 if uncaught).
      tensorboard: also write TensorBoard events under ``log_dir/tb``.

    Returns:
      The final state (also saved to ``ckpt``; pending saves are waited for).

    Raises:
      ValueError: bad arguments (naming ``trainer.*``), or a checkpoint that does not
        match the model (see :meth:`Checkpointer.restore`).
      FloatingPointError: see ``nonfinite``.
      Preempted: see ``handle_sigterm``.
    """
    if not (isinstance(num_steps, int) and num_steps >= 0):
        raise ValueError(f"trainer.num_steps must be an integer >= 0; got {num_steps!r}")
    if not (isinstance(log_every, int) and log_every >= 1):
        raise ValueError(f"trainer.log_every must be an integer >= 1; got {log_every!r}")
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(
            f"trainer.nonfinite must be one of {list(NONFINITE_MODES)}; got {nonfinite!r}"
        )

    if ckpt is not None:
        restored = ckpt.restore_latest(abstract_state(state))
        if restored is not None:
            state = restored
    start = int(state.step)
    if start > num_steps:
        raise ValueError(f"trainer.num_steps = {num_steps} is behind the restored step {start}")

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
        with _SigtermFlag(handle_sigterm) as sigterm:
            for i in range(start, num_steps):
                state, metrics = step_fn(state)
                pending.append(metrics)
                s = i + 1
                last = s == num_steps
                do_log = s % log_every == 0 or last
                do_save = ckpt is not None and (ckpt.should_save(s) or last or sigterm.flag)
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
                if do_save:
                    check_finite()  # never save a state past a non-finite step in 'stop' mode
                    ckpt.save(s, state, force=True)
                if sigterm.flag:
                    if ckpt is not None:
                        ckpt.wait()
                    raise Preempted(s)
        if ckpt is not None:
            ckpt.wait()
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    return state
