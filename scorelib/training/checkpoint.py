"""Checkpoints with orbax's ``CheckpointManager``.

A checkpoint at step ``n`` (the number of completed train steps) holds two items:

* ``state``: the whole :class:`TrainState` (params, EMA, optimizer state, step,
  key, counters) via ``ocp.args.StandardSave``;
* ``meta``: JSON with a fingerprint (the caller's model/config dict and the
  path, shape and dtype of every state leaf), checked before a restore so that
  restoring into a different architecture raises a ``ValueError`` naming the
  mismatch instead of a shape traceback.

Orbax writes each step to a temporary directory and renames it when complete,
so an interrupted save leaves no half-written checkpoint behind; this module
never writes inside a step directory itself. Saves are asynchronous: call
:meth:`Checkpointer.wait` (done by :meth:`close`) before the process exits;
it re-raises errors from the background save.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

FORMAT_VERSION = 1


def _tree_signature(tree: Any) -> dict[str, list]:
    """``{leaf path: [shape, dtype]}`` of a pytree of arrays or shape structs."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): [list(x.shape), str(x.dtype)] for path, x in leaves}


def _flatten_config(cfg: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(cfg, dict):
        out = {}
        for k, v in cfg.items():
            out.update(_flatten_config(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: cfg}


class Checkpointer:
    """Save every ``save_every`` steps (and when forced), keep the last ``keep_last``.

    Args:
      directory: the checkpoint directory (created if missing); use one per run.
      save_every: save interval in steps (>= 1).
      keep_last: number of checkpoints kept (>= 1); older ones are deleted by orbax.
      config: a JSON-serialisable dict describing the model (and anything else that
        must match on restore), e.g. ``{"model": {"width": 512, "depth": 4}}``.
      async_save: write in a background thread (default) or block.

    Raises:
      ValueError: ``checkpoint.save_every`` or ``checkpoint.keep_last`` < 1, or a
        ``config`` that is not JSON-serialisable.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        save_every: int,
        keep_last: int = 3,
        config: dict | None = None,
        async_save: bool = True,
    ):
        if not (isinstance(save_every, int) and save_every >= 1):
            raise ValueError(f"checkpoint.save_every must be an integer >= 1; got {save_every!r}")
        if not (isinstance(keep_last, int) and keep_last >= 1):
            raise ValueError(f"checkpoint.keep_last must be an integer >= 1; got {keep_last!r}")
        try:
            self.config = json.loads(json.dumps(config or {}))
        except TypeError as e:
            raise ValueError(f"checkpoint.config must be JSON-serialisable: {e}") from e
        self.directory = os.path.abspath(os.fspath(directory))
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep_last,
            save_interval_steps=save_every,
            create=True,
            enable_async_checkpointing=async_save,
        )
        self._mngr = ocp.CheckpointManager(self.directory, options=options)

    # --- queries ---------------------------------------------------------------
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or ``None``."""
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of the complete checkpoints on disk, ascending."""
        return sorted(self._mngr.all_steps())

    def should_save(self, step: int) -> bool:
        """True when ``step`` is a multiple of ``save_every`` and not saved yet."""
        return step % self.save_every == 0 and step not in self._mngr.all_steps()

    # --- save / restore --------------------------------------------------------
    def save(self, step: int, state: Any, *, force: bool = False) -> bool:
        """Start saving ``state`` as step ``step``; returns whether a save was started.

        Without ``force`` only steps that are multiples of ``save_every`` are saved.
        A step already on disk is never overwritten. The arrays are copied first, so
        the caller may donate ``state`` to the next train step right away.
        """
        if step in self._mngr.all_steps() or not (force or step % self.save_every == 0):
            return False
        state = jax.tree.map(lambda x: x.copy(), state)
        meta = {
            "format": FORMAT_VERSION,
            "config": self.config,
            "tree": _tree_signature(state),
        }
        return self._mngr.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )

    def check_compatible(self, step: int, abstract_state: Any) -> None:
        """Raise ``ValueError`` naming every config key or state leaf that differs.

        Args:
          step: a checkpoint step on disk.
          abstract_state: the pytree to restore into (arrays or ``ShapeDtypeStruct``).
        """
        meta = self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            "meta"
        ]
        problems = []
        saved_cfg = _flatten_config(meta.get("config", {}))
        cur_cfg = _flatten_config(self.config)
        for k in sorted(set(saved_cfg) | set(cur_cfg)):
            a, b = saved_cfg.get(k, "<absent>"), cur_cfg.get(k, "<absent>")
            if a != b:
                problems.append(f"config {k}: checkpoint {a!r}, current {b!r}")
        saved_tree = meta.get("tree", {})
        cur_tree = _tree_signature(abstract_state)
        for k in sorted(set(saved_tree) | set(cur_tree)):
            a, b = saved_tree.get(k), cur_tree.get(k)
            if a != b:
                fmt = lambda v: "<absent>" if v is None else f"shape {tuple(v[0])} {v[1]}"
                problems.append(f"state leaf {k}: checkpoint {fmt(a)}, current {fmt(b)}")
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise ValueError(
                f"checkpoint {self.directory} step {step} does not match the current "
                f"model/config ({len(problems)} differences):\n  {shown}{more}"
            )

    def restore(self, step: int, abstract_state: Any) -> Any:
        """Restore step ``step`` into the structure, dtypes and shardings of ``abstract_state``.

        Raises:
          ValueError: the checkpoint's fingerprint differs (see :meth:`check_compatible`).
        """
        self._mngr.wait_until_finished()
        self.check_compatible(step, abstract_state)
        out = self._mngr.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        )
        return out["state"]

    def restore_latest(self, abstract_state: Any) -> Any | None:
        """Restore the newest checkpoint (see :meth:`restore`), or ``None`` if there is none."""
        step = self.latest_step()
        return None if step is None else self.restore(step, abstract_state)

    def wait(self) -> None:
        """Block until pending saves are on disk; re-raises a background save's error."""
        self._mngr.wait_until_finished()

    def close(self) -> None:
        """:meth:`wait`, then release orbax's resources."""
        try:
            self.wait()
        finally:
            self._mngr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
