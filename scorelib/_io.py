"""Atomic file writes (a reader sees the old file or the new one, never half of one), and
paths as shared files record them (:func:`portable_path`: no machine's directories).

Write to a temporary file in the same directory, flush and ``fsync`` it, then
``os.replace`` it onto the target (atomic on POSIX within one file system). On any error
the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np


def _file_mode() -> int:
    """The mode ``open`` would give a new file: ``0o666`` less the process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


#: Read once at import (reading the umask sets it, which is not thread-safe).
_FILE_MODE = _file_mode()


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
        os.fchmod(fd, _FILE_MODE)  # mkstemp's 0600 would hide results from a shared group
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


#: An absolute path inside a text: a ``/`` at the start or after ``=``, ``[``, ``,``, a space,
#: a quote, ``(``, ``:`` or a backtick, then at least one more ``/``-separated component.
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[=\[,\s'\"(:`]))/[^\s,\]'\")`]+/[^\s,\]'\")`]+")


def portable_path(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """``path`` as files meant to be shared (committed results, recorded commands) hold it:
    relative to ``root`` (default: the working directory, where the commands are run) when
    inside it; an absolute path outside it becomes ``<outside>/<its last component>``, so no
    machine's directory layout is recorded; a relative path is returned as given."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    base = Path.cwd() if root is None else Path(root)
    try:
        return str(p.resolve().relative_to(base.resolve())) or "."
    except ValueError:
        return f"<outside>/{p.name}"


def portable_text(text: str, root: str | os.PathLike | None = None) -> str:
    """``text`` with every absolute path in it replaced by :func:`portable_path` (a recorded
    command line: ``table.model=/home/me/repo/outputs/run`` becomes
    ``table.model=outputs/run`` when run from ``/home/me/repo``)."""
    return _ABSOLUTE.sub(lambda m: portable_path(m.group(0), root), text)
