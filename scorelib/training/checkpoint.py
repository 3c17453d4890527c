"""Checkpoints with orbax's ``CheckpointManager``: save, verify, keep, restore, fall back.

A checkpoint at step ``n`` (the number of completed train steps) is the directory
``<directory>/<n>`` holding two items:

* ``state``: the whole :class:`TrainState` (params, EMA, optimizer state, step, key,
  counters) via ``ocp.args.StandardSave``;
* ``meta``: JSON with a fingerprint (the caller's model/config dict and the path, shape
  and dtype of every state leaf), checked before a restore so that restoring into a
  different architecture raises :class:`IncompatibleCheckpoint` naming the difference
  instead of a shape traceback.

Guarantees:

* **Atomic.** Orbax writes each step into ``<n>.orbax-checkpoint-tmp`` and renames it
  when complete, so a process killed mid-save (even by SIGKILL) leaves the previous
  checkpoints as they were; a leftover temporary directory is never listed as a step.
* **Verified.** Saves are asynchronous; when one completes (at the next :meth:`save`,
  :meth:`wait`, :meth:`close` or restore) its metadata and the metadata of every array
  are read back, and a checkpoint that cannot be read back raises
  :class:`CheckpointError` naming its path. Errors of the background write are raised
  the same way, never only logged.
* **Fallback.** :meth:`Checkpointer.restore_latest` tries the newest checkpoint first; a
  corrupt or partial one (an item removed, array files truncated, metadata emptied) is
  skipped with a warning on the ``scorelib.training`` logger naming it and the reason,
  the previous one is used, and the skipped one is moved to ``<directory>/unreadable/``
  before this run saves again. Without any readable checkpoint the error lists what was
  tried.
* **Any directory name.** Names with ``[``, ``]``, ``*``, ``?``, ``=``, ``,``, spaces,
  ``+`` or quotes work. Orbax finds the per-process OCDBT files of a save with
  ``epath.Path.glob`` (``orbax/checkpoint/_src/serialization/ocdbt_utils.py``,
  ``merge_ocdbt_per_process_files``), and etils' ``glob`` (``etils/epath/gpath.py``)
  joins the directory into the pattern before calling ``glob.glob``, so a directory
  named ``run[1]`` is read as the character class ``run1``: nothing matches, the merge
  is skipped with only a warning, and the saved arrays can never be read back. The
  manager here gets a path whose ``glob`` matches below the directory taken literally.
  A backslash cannot be supported (TensorStore's file driver reads it as ``/`` and
  writes elsewhere) and is refused.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import io
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from etils.epath import gpath
from orbax.checkpoint import checkpoint_managers as ocp_managers

from scorelib._checks import check_int, require
from scorelib.training.state import TrainState

FORMAT_VERSION = 1
UNREADABLE_DIR = "unreadable"

log = logging.getLogger("scorelib.training")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read back, or none in a directory is readable."""


class IncompatibleCheckpoint(ValueError):
    """A checkpoint's model config or state layout differs from the current one."""


class _LiteralDirPath(gpath.PosixGPath):
    """A local ``epath`` path whose :meth:`glob` takes the path itself literally.

    ``etils``' ``glob`` passes ``join(path, pattern)`` to ``glob.glob``, so glob
    characters in the directory (``[1]``) act as patterns. Here only ``pattern`` is a
    pattern (``glob.glob(pattern, root_dir=path)``). Paths derived with ``/`` keep the class.
    """

    def glob(self, pattern: str) -> Iterator[_LiteralDirPath]:
        for name in sorted(glob.glob(pattern, root_dir=os.fspath(self))):
            yield self / name


def _tree_signature(tree: Any) -> dict[str, list]:
    """``{leaf path: [shape, dtype]}`` of a pytree of arrays or shape structs."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): [list(x.shape), str(x.dtype)] for path, x in leaves}


def flatten_config(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": v}`` for nested dicts ``{"a": {"b": v}}`` (lists and other values are leaves)."""
    if isinstance(cfg, dict):
        out = {}
        for k, v in cfg.items():
            out.update(flatten_config(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: cfg}


def _differences(saved: dict, current: dict, label: str, fmt=repr, added=None) -> list[str]:
    """One line per key whose value differs; a key ``saved`` lacks is no difference when
    ``added`` (key -> value) holds the current value (a field added since, at the value
    that reproduces the old behaviour)."""
    out = []
    added = added or {}
    for k in sorted(set(saved) | set(current)):
        a, b = saved.get(k), current.get(k)
        if k not in saved and k in added and b == added[k]:
            continue
        if a != b:
            sa = "<absent>" if k not in saved else fmt(a)
            sb = "<absent>" if k not in current else fmt(b)
            out.append(f"{label} {k}: checkpoint {sa}, current {sb}")
    return out


def _reason(e: BaseException) -> str:
    """``Type: first line of the message`` (TensorStore messages carry a long JSON spec)."""
    first = (str(e).strip().splitlines() or [""])[0]
    if len(first) > 120:
        first = first[:120] + "..."
    return f"{type(e).__name__}: {first}"


#: The lines of the traceback orbax's reads print, one per array still in flight, once a
#: read of a damaged checkpoint has failed and closed their event loop (tensorstore's threads
#: call ``loop.call_soon_threadsafe`` on it).
_CLOSED_LOOP_LINES = re.compile(
    r'  File ".*asyncio/base_events\.py", line \d+, in (call_soon_threadsafe|_check_closed)'
    r"|    self\._check_closed\(\)"
    r"|    raise RuntimeError\('Event loop is closed'\)"
    r"|RuntimeError: Event loop is closed"
)
_TRACEBACK = "Traceback (most recent call last):"


class ClosedLoopTracebackFilter(io.TextIOBase):
    """A text stream (for ``sys.stderr``) that drops the ``RuntimeError: Event loop is
    closed`` tracebacks orbax's reads print once a read of a damaged checkpoint has failed:
    hundreds of lines for a checkpoint whose files are all damaged, written piecewise by
    several threads at once, some after the failed call has returned. Each thread's text
    is assembled into lines of its own; every line that is not part of such a traceback is
    written through to ``stream`` unchanged, and a ``Traceback`` header is held until the
    thread's next line shows whose it is. A line being redrawn (a progress bar's ``\\r``)
    is written at once.
    """

    def __init__(self, stream):
        self.stream = stream
        self._lock = threading.Lock()
        self._partial: dict[int, str] = {}  # thread -> its line in progress
        self._headers: dict[int, int] = {}  # thread -> "Traceback" lines held

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        me = threading.get_ident()
        with self._lock:
            *lines, rest = (self._partial.pop(me, "") + text).split("\n")
            for line in lines:
                self._line(me, line)
            if "\r" in rest:  # a progress bar redraws its line: show it now
                self._release(me)
                self.stream.write(rest)
            elif rest:
                self._partial[me] = rest
        return len(text)

    def _line(self, me: int, line: str) -> None:
        if line == _TRACEBACK:
            self._headers[me] = self._headers.get(me, 0) + 1
        elif _CLOSED_LOOP_LINES.fullmatch(line):
            if "in call_soon_threadsafe" in line:  # the first frame: its header goes too
                self._headers[me] = max(self._headers.get(me, 0) - 1, 0)
        else:
            self._release(me)
            self.stream.write(line + "\n")

    def _release(self, me: int) -> None:
        self.stream.write((_TRACEBACK + "\n") * self._headers.pop(me, 0))

    def flush(self) -> None:
        self.stream.flush()

    def close_filter(self) -> None:
        """Write out what is held (headers, a last line without its newline); the filter
        stays usable. A stream closed meanwhile (at interpreter exit) is left alone."""
        with self._lock:
            if getattr(self.stream, "closed", False):
                return
            for me in list(self._headers):
                self._release(me)
            self.stream.write("".join(self._partial.values()))
            self._partial.clear()
        self.stream.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding ... of the wrapped stream
        return getattr(self.stream, name)


@contextlib.contextmanager
def quiet_closed_loop_tracebacks():
    """``sys.stderr`` wrapped in a :class:`ClosedLoopTracebackFilter` meanwhile."""
    real = sys.stderr
    sys.stderr = ClosedLoopTracebackFilter(real)
    try:
        yield
    finally:
        sys.stderr = real


def filter_closed_loop_tracebacks() -> ClosedLoopTracebackFilter:
    """Wrap ``sys.stderr`` in a :class:`ClosedLoopTracebackFilter` for the rest of the process.

    For a command's entry point: orbax's threads may print their tracebacks after the failed
    read has returned, even while the interpreter exits, so a filter that is removed when
    the command returns lets them through. Installing twice keeps the first filter; what it
    holds is written out at exit.
    """
    if isinstance(sys.stderr, ClosedLoopTracebackFilter):
        return sys.stderr
    sys.stderr = ClosedLoopTracebackFilter(sys.stderr)
    atexit.register(sys.stderr.close_filter)
    return sys.stderr


class RestoredParams(NamedTuple):
    """The parameters of another run's checkpoint (see :func:`restore_params`)."""

    params: Any
    ema_params: Any
    step: int


class Checkpointer:
    """Save every ``save_every`` steps (or when forced); keep the last ``keep_last`` and milestones.

    Constructing one writes nothing: the directory is created by the first save.

    Args:
      directory: the checkpoint directory; use one per run. Any name works except one
        containing a backslash.
      save_every: save interval in steps (>= 1); :meth:`should_save` uses it.
      keep_last: number of newest checkpoints kept (>= 1); older ones are deleted by
        orbax when a save completes, except milestones.
      keep_every: if given (>= 1), also keep every checkpoint whose step is a multiple
        of it (orbax's ``EveryNSteps`` preservation policy beside ``LatestN``).
      config: a JSON-serialisable dict describing the model (and anything else that
        must match on restore), e.g. ``{"model": {"width": 512, "depth": 4}}``.
      config_defaults: dotted key -> value, e.g. ``{"model.norm": "none"}``: a key of
        ``config`` that a checkpoint's config lacks (written before the field existed) is
        no difference while it holds this value.
      async_save: write in a background thread (default) or block in :meth:`save`.

    Raises:
      ValueError: ``checkpoint.save_every``, ``checkpoint.keep_last`` or
        ``checkpoint.keep_every`` out of range, a ``config`` that is not
        JSON-serialisable, or a directory name with a backslash.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        save_every: int,
        keep_last: int = 3,
        keep_every: int | None = None,
        config: dict | None = None,
        config_defaults: dict | None = None,
        async_save: bool = True,
    ):
        self.save_every = check_int(save_every, "checkpoint.save_every", low=1)
        self.keep_last = check_int(keep_last, "checkpoint.keep_last", low=1)
        self.keep_every = (
            None if keep_every is None else check_int(keep_every, "checkpoint.keep_every", low=1)
        )
        try:
            self.config = json.loads(json.dumps(config or {}))
            self.config_defaults = json.loads(json.dumps(config_defaults or {}))
        except TypeError as e:
            raise ValueError(f"checkpoint.config must be JSON-serialisable: {e}") from e
        self.directory = os.path.abspath(os.fspath(directory))
        require(
            "\\" not in self.directory,
            "checkpoint directory",
            "a path without a backslash (TensorStore's file driver reads it as '/')",
            self.directory,
        )
        policies = [ocp_managers.LatestN(n=self.keep_last)]
        if self.keep_every is not None:
            policies.append(ocp_managers.EveryNSteps(self.keep_every))
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=self.save_every,
            preservation_policy=ocp_managers.AnyPreservationPolicy(policies),
            create=False,
            enable_async_checkpointing=async_save,
        )
        self._mngr = ocp.CheckpointManager(_LiteralDirPath(self.directory), options=options)
        self._async = bool(async_save)
        self._pending: int | None = None  # step of a save not yet verified
        self._unreadable: set[int] = set()  # steps a restore found unreadable

    # --- queries ---------------------------------------------------------------
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (readable or not), or ``None``."""
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of the complete checkpoints on disk, ascending."""
        return sorted(self._mngr.all_steps())

    def _saved(self, step: int) -> bool:
        return step in self._mngr.all_steps() and step not in self._unreadable

    def should_save(self, step: int) -> bool:
        """True when ``step`` is a multiple of ``save_every`` and not saved (readably) yet."""
        return step % self.save_every == 0 and not self._saved(step)

    def step_dir(self, step: int) -> str:
        """The directory of checkpoint ``step``."""
        return os.path.join(self.directory, str(step))

    # --- save ------------------------------------------------------------------
    def save(self, step: int, state: Any, *, force: bool = False) -> bool:
        """Start saving ``state`` as step ``step``; returns whether a save was started.

        Without ``force`` only steps that are multiples of ``save_every`` are saved. A
        readable step already on disk is never overwritten; one that a restore found
        unreadable is moved to ``<directory>/unreadable/`` first. The arrays are copied
        first, so the caller may donate ``state`` to the next train step right away.

        Raises:
          CheckpointError: the previous save failed or cannot be read back (see
            :meth:`wait`), or this one could not be started.
        """
        self.wait()
        if self._saved(step) or not (force or step % self.save_every == 0):
            return False
        self._move_unreadable_aside()
        os.makedirs(self.directory, exist_ok=True)
        state = jax.tree.map(lambda x: x.copy(), state)
        meta = {"format": FORMAT_VERSION, "config": self.config, "tree": _tree_signature(state)}
        try:
            started = self._mngr.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                ),
                force=True,
            )
        except Exception as e:
            raise CheckpointError(
                f"checkpoint {self.step_dir(step)}: the save failed ({_reason(e)})"
            ) from e
        if started:
            self._pending = step
            if not self._async:
                self.wait()
        return started

    def wait(self) -> None:
        """Block until a pending save is on disk, then check that it can be read back.

        Raises:
          CheckpointError: the background write failed (orbax's error chained), or the
            written checkpoint's metadata or array metadata cannot be read; the message
            names the checkpoint directory.
        """
        step, self._pending = self._pending, None
        try:
            self._mngr.wait_until_finished()
        except Exception as e:
            where = self.directory if step is None else self.step_dir(step)
            raise CheckpointError(f"checkpoint {where}: the save failed ({_reason(e)})") from e
        if step is None:
            return
        try:
            self._read_meta(step)
            if self._mngr.item_metadata(step)["state"] is None:
                raise KeyError("no metadata for item 'state'")
        except Exception as e:
            raise CheckpointError(
                f"checkpoint {self.step_dir(step)} was written but cannot be read back "
                f"({_reason(e)})"
            ) from e

    def _move_unreadable_aside(self) -> None:
        on_disk = self._unreadable & set(self._mngr.all_steps())
        for step in sorted(on_disk):
            dest = os.path.join(self.directory, UNREADABLE_DIR, str(step))
            n = 1
            while os.path.exists(dest):
                dest = os.path.join(self.directory, UNREADABLE_DIR, f"{step}.{n}")
                n += 1
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.replace(self.step_dir(step), dest)
            log.warning("moved the unreadable checkpoint %s to %s", self.step_dir(step), dest)
        if on_disk:
            self._mngr.reload()
        self._unreadable.clear()

    # --- restore ---------------------------------------------------------------
    def _read_meta(self, step: int) -> dict:
        out = self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = out["meta"]
        if not isinstance(meta, dict):
            raise ValueError(f"meta is {type(meta).__name__}, not a JSON object")
        return meta

    def _check_meta(
        self, step: int, meta: dict, signature: dict, prefixes=None, check_config=True
    ) -> None:
        problems = []
        if check_config:
            saved_cfg = flatten_config(meta.get("config", {}))
            current = flatten_config(self.config)
            problems += _differences(saved_cfg, current, "config", added=self.config_defaults)
        saved_tree = meta.get("tree", {})
        if prefixes is not None:
            saved_tree = {k: v for k, v in saved_tree.items() if k.startswith(prefixes)}

        def fmt(v):
            return f"shape {tuple(v[0])} {v[1]}"

        problems += _differences(saved_tree, signature, "state leaf", fmt)
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise IncompatibleCheckpoint(
                f"checkpoint {self.directory} step {step} does not match the current "
                f"model/config ({len(problems)} differences):\n  {shown}{more}"
            )

    def check_compatible(self, step: int, abstract_state: Any) -> None:
        """Raise :class:`IncompatibleCheckpoint` naming every config key or state leaf that differs.

        Args:
          step: a checkpoint step on disk.
          abstract_state: the pytree to restore into (arrays or ``ShapeDtypeStruct``).

        Raises:
          IncompatibleCheckpoint (a ``ValueError``): one line per difference, e.g.
            ``config model.width: checkpoint 32, current 16``.
          CheckpointError: the checkpoint's metadata cannot be read.
        """
        meta = self._guarded(step, lambda: self._read_meta(step))
        self._check_meta(step, meta, _tree_signature(abstract_state))

    def _require_step(self, step: int) -> None:
        steps = self.all_steps()
        if step not in steps:
            raise FileNotFoundError(f"step={step}: no checkpoint in {self.directory}; have {steps}")

    def _guarded(self, step: int, fn: Callable[[], Any]) -> Any:
        """``fn()``, with any error but a mismatch raised as :class:`CheckpointError`."""
        try:
            with quiet_closed_loop_tracebacks():
                return fn()
        except IncompatibleCheckpoint:
            raise
        except Exception as e:
            err = CheckpointError(f"checkpoint {self.step_dir(step)} cannot be read ({_reason(e)})")
            err.reason = _reason(e)
            raise err from e

    def restore(self, step: int, abstract_state: Any) -> Any:
        """Restore step ``step`` into the structure, dtypes and shardings of ``abstract_state``.

        Args:
          step: a step of :meth:`all_steps`.
          abstract_state: a pytree of arrays or ``jax.ShapeDtypeStruct`` (e.g.
            :func:`scorelib.training.abstract_state` of a fresh state).

        Raises:
          FileNotFoundError: no checkpoint at ``step``.
          IncompatibleCheckpoint: the checkpoint's fingerprint differs (see
            :meth:`check_compatible`).
          CheckpointError: the checkpoint is corrupt or partial (the message names its
            directory and the underlying error).
        """
        self.wait()
        self._require_step(step)

        def load():
            self._check_meta(step, self._read_meta(step), _tree_signature(abstract_state))
            args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
            return self._mngr.restore(step, args=args)["state"]

        return self._guarded(step, load)

    def _restore_newest(self, load: Callable[[int], Any]) -> tuple[Any, int] | None:
        """``(load(step), step)`` for the newest step that loads, skipping unreadable ones."""
        self.wait()
        steps = self.all_steps()
        tried = []
        for step in reversed(steps):
            try:
                out = load(step)
            except CheckpointError as e:
                tried.append(f"step {step} ({getattr(e, 'reason', e)})")
                self._unreadable.add(step)
                older = [s for s in steps if s < step]
                log.warning(
                    "%s; skipping it, %s",
                    e,
                    f"trying step {older[-1]}" if older else "no older checkpoint",
                )
                continue
            return out, step
        if tried:
            raise CheckpointError(
                f"no readable checkpoint in {self.directory}; tried: {'; '.join(tried)}; move "
                "the directory aside to train the run again from step 0"
            )
        return None

    def restore_latest(self, abstract_state: Any) -> Any | None:
        """Restore the newest readable checkpoint (see :meth:`restore`); ``None`` if there is none.

        A corrupt or partial checkpoint is skipped with a warning naming it and the
        reason, and the previous one is tried; the skipped ones are moved to
        ``<directory>/unreadable/`` when this checkpointer next saves.

        Raises:
          IncompatibleCheckpoint: the newest readable checkpoint does not match (an older
            one is not tried: it would silently train another model).
          CheckpointError: checkpoints exist but none is readable; lists each with its error.
        """
        found = self._restore_newest(lambda step: self.restore(step, abstract_state))
        return None if found is None else found[0]

    def restore_params(
        self, abstract_params: Any, *, step: int | None = None, check_config: bool = True
    ) -> RestoredParams:
        """Restore only ``params`` and ``ema_params`` of step ``step`` (default: newest readable).

        The optimizer state, step and key of the checkpoint are not read, so the current
        optimizer may differ. The config fingerprint and the params' leaf shapes are
        checked as in :meth:`restore`.

        Args:
          abstract_params: the parameter pytree (arrays or ``ShapeDtypeStruct``) to restore
            into, or a whole ``TrainState`` (its ``.params`` is used).
          step: a checkpoint step, or ``None`` for the newest readable one.
          check_config: compare this checkpointer's ``config`` with the checkpoint's
            (the parameter shapes are always compared).

        Returns:
          :class:`RestoredParams` ``(params, ema_params, step)``.

        Raises:
          FileNotFoundError: no checkpoint at ``step``, or none at all.
          IncompatibleCheckpoint: the config or a parameter's shape differs.
          CheckpointError: the checkpoint (every checkpoint when ``step`` is ``None``) is
            unreadable.
        """
        if isinstance(abstract_params, TrainState):
            abstract_params = abstract_params.params
        abstract_params = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
            abstract_params,
        )
        target = {"params": abstract_params, "ema_params": abstract_params}
        signature = {
            f".{name}{k}": v for name in target for k, v in _tree_signature(abstract_params).items()
        }
        restore_args = jax.tree.map(
            lambda x: ocp.ArrayRestoreArgs(
                sharding=x.sharding, global_shape=x.shape, dtype=x.dtype
            ),
            target,
        )

        def load(s):
            def go():
                prefixes = (".params", ".ema_params")
                self._check_meta(s, self._read_meta(s), signature, prefixes, check_config)
                args = ocp.args.PyTreeRestore(
                    item=target, restore_args=restore_args, partial_restore=True
                )
                # a checkpointer of its own: the manager's handler for 'state' is the
                # standard (whole-tree) one
                with ocp.PyTreeCheckpointer() as reader:
                    out = reader.restore(_LiteralDirPath(self.step_dir(s)) / "state", args=args)
                return RestoredParams(out["params"], out["ema_params"], s)

            return self._guarded(s, go)

        if step is not None:
            self.wait()
            self._require_step(step)
            return load(step)
        found = self._restore_newest(load)
        if found is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to restore parameters from")
        return found[0]

    # --- lifetime --------------------------------------------------------------
    def close(self) -> None:
        """:meth:`wait`, then release orbax's resources (also when ``wait`` raises)."""
        try:
            self.wait()
        finally:
            self._mngr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def restore_params(
    checkpoint_dir: str | os.PathLike,
    abstract_params: Any,
    *,
    step: int | None = None,
    expected_fingerprint: dict | None = None,
    fingerprint_defaults: dict | None = None,
) -> RestoredParams:
    """The parameters and EMA parameters of another run's checkpoint, to initialise a new run.

    For fine-tuning or warm starts (``init_from=<run_dir>[@step]``): build the new run's
    fresh state, then replace its ``params`` and ``ema_params`` with these; its
    optimizer state and step stay new. Nothing is written.

    Args:
      checkpoint_dir: the other run's checkpoint directory (``<run_dir>/checkpoints``).
      abstract_params: the new run's parameter pytree, or its whole ``TrainState``.
      step: the checkpoint step; ``None`` for the newest readable one.
      expected_fingerprint: the new run's model fingerprint (the ``config`` it passes to
        :class:`Checkpointer`); every key must equal the checkpoint's. ``None``: only
        the parameter shapes and dtypes are compared.
      fingerprint_defaults: the ``config_defaults`` of :class:`Checkpointer`.

    Returns:
      :class:`RestoredParams` ``(params, ema_params, step)`` with the structure, dtypes
      and shardings of ``abstract_params``.

    Raises:
      FileNotFoundError: no checkpoint (at ``step``) in ``checkpoint_dir``.
      IncompatibleCheckpoint: a difference, one line each, e.g.
        ``config model.width: checkpoint 32, current 16``.
      CheckpointError: the checkpoint cannot be read.
    """
    ckpt = Checkpointer(
        checkpoint_dir,
        save_every=1,
        config=expected_fingerprint,
        config_defaults=fingerprint_defaults,
    )
    try:
        return ckpt.restore_params(
            abstract_params, step=step, check_config=expected_fingerprint is not None
        )
    finally:
        ckpt.close()
