"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Write to a temporary file in the same directory, flush and ``fsync`` it, then
``os.replace`` it onto the target (atomic on POSIX within one file system). On any error
the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on a clean exit it replaces ``path``.

    Args:
      path: the target file; its parent directories are created.
      mode: ``"w"`` (text) or ``"wb"`` (bytes).

    Raises:
      ValueError: for a mode other than ``"w"`` or ``"wb"``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb'; got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_savez(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """``np.savez(path, **arrays)`` atomically (``path`` is used as given: no ``.npz`` added)."""
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)
