"""Metrics to a JSONL file and to TensorBoard event files (tensorboardX).

``metrics.jsonl`` gets one JSON object per logged step, ``{"step": n, ...}``.
On resume from a checkpoint at step ``k`` the lines with ``step > k`` (written
by the interrupted run after its last checkpoint) are dropped first, by writing
a new file and renaming it over the old one, so the file never holds the same
step twice. TensorBoard events past ``k`` are hidden with ``purge_step``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from scorelib._io import atomic_write_text


def truncate_jsonl(path: str, max_step: int) -> None:
    """Keep only the lines of ``path`` with ``step <= max_step`` (atomic rename)."""
    if not os.path.exists(path):
        return
    keep = []
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            if rec.get("step", math.inf) <= max_step:
                keep.append(json.dumps(rec))
    atomic_write_text(path, "".join(line + "\n" for line in keep))


class MetricsWriter:
    """Append metrics to ``log_dir/metrics.jsonl`` and ``log_dir/tb`` (TensorBoard).

    Args:
      log_dir: directory (created).
      start_step: the step training starts from; records past it are removed.
      tensorboard: also write TensorBoard events.
    """

    def __init__(self, log_dir: str, start_step: int = 0, *, tensorboard: bool = True):
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, "metrics.jsonl")
        truncate_jsonl(self.path, start_step)
        self._f = open(self.path, "a")
        self._tb = None
        if tensorboard:
            # only with tensorboard=True
            from tensorboardX import SummaryWriter

            purge = start_step + 1 if start_step > 0 else None
            self._tb = SummaryWriter(os.path.join(log_dir, "tb"), purge_step=purge)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Log float metrics at ``step``."""
        rec = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()
        if self._tb is not None:
            for k, v in rec.items():
                if k != "step":
                    self._tb.add_scalar(f"train/{k}", v, int(step))

    def close(self) -> None:
        """Close the JSONL file and the TensorBoard writer (if any)."""
        self._f.close()
        if self._tb is not None:
            self._tb.close()
