"""Helpers shared by the entry points: the Hydra app wrapper (one-line errors and exit
statuses), run metadata, and the clean-up of failed commands.

Exit statuses: 0 done; 2 a usage or configuration error, printed as one line naming the
field (Hydra's own errors included); 130 interrupted (Ctrl-C), 143 terminated (SIGTERM),
with the saved step when the training loop saved one.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
import typing
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import hydra
import jax
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import (
    HydraException,
    InstantiationException,
    MissingConfigException,
    OverrideParseException,
)
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from experiments.schema import SamplerConfig, describe_schema
from scorelib import training
from scorelib._io import atomic_write_text

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
USAGE_ERROR = 2
INTERRUPTED = 130  # 128 + SIGINT

PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "hydra-core",
    "omegaconf",
    "numpy",
    "scipy",
    "scikit-learn",
    "scikit-image",
    "scorelib",
)


# --------------------------------------------------------------------------- metadata


def git_revision(repo: Path | None = None) -> dict[str, Any]:
    """The git commit of the code and whether the work tree had changes (``None`` outside git)."""
    repo = repo or Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return {"commit": rev, "dirty": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def write_run_info(run_dir: Path, cfg: DictConfig, *, seed: int, extra: dict | None = None) -> None:
    """Write ``config.yaml`` (resolved) and ``run_info.json`` (seed, versions, git, command).

    Written atomically; rewritten on every launch of the run, with the launch appended to
    ``launches`` so resumed runs keep their history.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    info_path = run_dir / "run_info.json"
    launches = []
    if info_path.exists():
        try:
            launches = json.loads(info_path.read_text()).get("launches", [])
        except (OSError, ValueError):
            launches = []
    launch = {
        "command": command_line(),
        "git": git_revision(),
        "versions": package_versions(),
        "host": platform.node(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
    }
    info = {"seed": seed, **(extra or {}), "launches": launches + [launch]}
    atomic_write_text(info_path, json.dumps(info, indent=2, default=str))


def command_line() -> str:
    """``python -m <module> <args>``: the command of this process."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    module = spec.name if spec is not None else (sys.argv[0] or "python")
    return " ".join([Path(sys.executable).name, "-m", module] + sys.argv[1:])


# --------------------------------------------------------------------------- errors


def one_line(message: str) -> str:
    """A message's lines joined into one: ``first: second; third``."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0] + ("" if len(lines) == 1 else " " + "; ".join(lines[1:]))


#: The longest error line printed: a longer message keeps its head (the field) and its tail
#: (the advice) around " ... ".
MAX_ERROR_LINE = 300


def shorten(line: str, limit: int = MAX_ERROR_LINE) -> str:
    """``line`` if it fits in ``limit`` characters, else its head and tail around ``...``."""
    if len(line) <= limit:
        return line
    head = (2 * limit) // 3
    return f"{line[:head]} ... {line[-(limit - head - 5) :]}"


def _type_name(typ) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if args and len(args) < len(typing.get_args(typ)):
        return f"{_type_name(args[0])} or null"
    return names.get(typ, getattr(typ, "__name__", str(typ)))


def config_error_line(e: BaseException) -> str:
    """One line for an OmegaConf or Hydra error, naming the config field (and, for an
    unknown field or group option, what is allowed)."""
    if isinstance(e, MissingConfigException):
        group, _, option = str(e.missing_cfg_file or "").rpartition("/")
        options = [o for o in (e.options or []) if not o.startswith("_")]
        if group and options:
            return f"{group}={option}: no such option; {group} must be one of {options}"
        return one_line(str(e).split("Config search path")[0])
    if isinstance(e, OverrideParseException):
        bad = _unparsable_overrides()
        return f"cannot parse the override {bad[0] if bad else ''!r}: {one_line(str(e))}"
    cause, seen = e, set()
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        seen.add(id(cause))
        nxt = cause.__cause__ or cause.__context__
        cause = None if nxt is None or id(nxt) in seen else nxt
    if cause is None:
        return one_line(str(e).split("full_key:")[0])
    key = getattr(cause, "full_key", None) or getattr(cause, "key", None) or "<config>"
    message = str(getattr(cause, "msg", cause)).split("\n")[0]
    typ = getattr(cause, "object_type", None)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and " not in " in message:
        if getattr(typ, "__dataclass_fields__", None):
            return unknown_field_line(str(key), typ)
        return f"{key} is not a field of this config; a new argument is written +{key}=<value>"
    if isinstance(cause, ValidationError) and typ is not None and dataclass_field(typ, key):
        allowed = _type_name(dataclass_field(typ, key))
        return f"{key} must be {allowed}; got {getattr(cause, 'value', None)!r}"
    if isinstance(cause, MissingMandatoryValue) or "Missing mandatory value" in message:
        missing = message.rsplit(":", 1)[-1].strip() if "Missing mandatory" in message else key
        return f"{missing} is required: give {missing}=<value> on the command line"
    return f"{key}: {message}"


def unknown_field_line(key: str, typ: type) -> str:
    """``<key> is not a field of <group=option> (its fields: ...); did you mean <f>?`` for
    a key that the dataclass schema ``typ`` of its node does not have."""
    fields = list(typ.__dataclass_fields__)
    where = describe_schema(typ) if isinstance(typ, type) else None
    if isinstance(typ, type) and issubclass(typ, SamplerConfig):
        common = SamplerConfig.__dataclass_fields__
        own = ", ".join(f for f in fields if f not in common) or "none"
        return (
            f"{key} is not an option of {where} (its options: {own}; every sampler's: "
            f"{', '.join(common)}){did_you_mean(key, fields)}"
        )
    return unknown_key_line(key, fields, where or "this config")


def did_you_mean(key: str, fields) -> str:
    """``'; did you mean <f>?'`` for the field of ``fields`` closest to ``key``'s last
    part, or ``''``."""
    hint = difflib.get_close_matches(key.rpartition(".")[2], list(fields), n=1)
    return f"; did you mean {hint[0]}?" if hint else ""


def unknown_key_line(key: str, fields, where: str) -> str:
    """``<key> is not a field of <where> (its fields: ...); did you mean <f>?``."""
    what = "a config field or group" if "." not in key else "a field"
    listed = ", ".join(f for f in fields if not f.startswith("_"))
    return f"{key} is not {what} of {where} (its fields: {listed}){did_you_mean(key, fields)}"


def check_added_fields(cfg) -> None:
    """Refuse a field that the schema of its node does not have.

    Hydra's ``+key=value`` adds a key even to a node backed by a dataclass schema
    (``experiments.schema``), so ``+trainer.stpes=5`` would otherwise be carried along and
    ignored.

    Raises:
      ValueError: ``trainer.stpes is not a field of trainer (its fields: ...); did you
        mean steps?``.
    """

    def walk(node, path):
        typ = OmegaConf.get_type(node)
        names = list(node.keys())
        if dataclasses.is_dataclass(typ):
            fields = {f.name for f in dataclasses.fields(typ)}
            for k in names:
                if k not in fields:
                    raise ValueError(unknown_field_line(f"{path}{k}", typ))
        for k in names:
            child = node._get_node(k)
            if isinstance(child, DictConfig) and not child._is_none():
                walk(child, f"{path}{k}.")

    walk(cfg, "")


def dataclass_field(typ, full_key) -> Any:
    """The annotation of the last part of ``full_key`` in dataclass ``typ`` (or None)."""
    try:
        return typing.get_type_hints(typ).get(str(full_key).rpartition(".")[2])
    except (TypeError, NameError):
        return None


def _unparsable_overrides() -> list[str]:
    parser, bad = OverridesParser.create(), []
    for arg in sys.argv[1:]:
        if arg.startswith("-"):
            continue
        try:
            parser.parse_overrides([arg])
        except (OverrideParseException, HydraException):
            bad.append(arg)
    return bad


def hydra_app(config_name: str, check=None):
    """``@hydra_app("train")`` on ``task(cfg)``: the module's ``main()``.

    Runs ``task`` under ``hydra.main`` with ``configs/<config_name>.yaml`` and turns every
    error a user can cause into one line on stderr: Hydra's own (an unknown group option,
    field or value type, an unparsable override, a missing mandatory value) exit with
    status 2, like the task's configuration errors (:func:`clean_errors`). Ctrl-C prints
    one line and exits 130; a training run stopped by a signal after saving prints the
    saved step. ``SCORELIB_TRACEBACK=1`` (or ``HYDRA_FULL_ERROR=1``) shows tracebacks.

    ``check(cfg)``, when given, runs the checks ``task`` runs before it computes or writes
    anything (``HydraConfig`` holds the job's config, as in the task) and raises as the
    task does (``ValueError``, ``FileNotFoundError``, naming the field): a ``-m`` sweep
    runs it on every job's config before any job starts, and refuses the sweep if one
    fails (``hydra/sweeper=checked``, ``hydra_plugins/scorelib_sweeps.py``).
    """

    def deco(task):
        task.check_config = check  # read by the sweeper (hydra_plugins/scorelib_sweeps.py)
        hydra_main = hydra.main(
            config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3"
        )(task)

        @functools.wraps(task)
        def main() -> None:
            traceback = bool(os.environ.get("SCORELIB_TRACEBACK"))
            traceback = traceback or bool(os.environ.get("HYDRA_FULL_ERROR"))
            saved = os.environ.get("HYDRA_FULL_ERROR")
            os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises; we report
            started = _COMMAND_STARTED.set(time.time())
            stderr = training.filter_closed_loop_tracebacks()  # orbax's noise on damaged files
            try:
                hydra_main()
            except (HydraException, OmegaConfBaseException) as e:
                if traceback:
                    raise
                print(f"error: {shorten(config_error_line(e))}", file=sys.stderr)
                sys.exit(USAGE_ERROR)
            except training.Interrupted as e:  # a signal stopped training after saving a step
                print(e.message, file=sys.stderr)
                sys.exit(e.code)
            except KeyboardInterrupt:
                if traceback:
                    raise
                print("interrupted; rerun the same command to resume", file=sys.stderr)
                sys.exit(INTERRUPTED)
            finally:
                stderr.close_filter()
                _COMMAND_STARTED.reset(started)
                if saved is None:
                    os.environ.pop("HYDRA_FULL_ERROR", None)
                else:
                    os.environ["HYDRA_FULL_ERROR"] = saved

        return main

    return deco


# --------------------------------------------------------------------------- clean-up


# When the running command started (set by :func:`hydra_app` before Hydra makes its output
# directory), and which directories above its output directory existed then (set by
# :class:`RecordOutputDirs`): a failed command removes the directories it made, and only
# those. (Read through functions: a task function that submitit pickles by value must not
# reference a ContextVar itself, which cannot be pickled.)
_COMMAND_STARTED: ContextVar[float | None] = ContextVar("command_started", default=None)
_EXISTED: ContextVar[frozenset | None] = ContextVar("existed", default=None)


def _command_started() -> float | None:
    return _COMMAND_STARTED.get()


def _existed() -> frozenset | None:
    return _EXISTED.get()


class RecordOutputDirs(Callback):
    """A Hydra callback (``hydra.callbacks.output_dirs`` of every primary config): before
    Hydra makes a run's output directory, record which of it and its parents exist, so
    that a command refused on its config removes exactly the directories it made
    (``outputs/foo/`` of ``experiments.evaluate run_dir=outputs/foo/bar``, say)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        HydraConfig.instance().set_config(config)  # as run_job does next: hydra.run.dir resolves
        try:
            out = Path(str(OmegaConf.select(config, "hydra.run.dir"))).resolve()
        except OmegaConfBaseException:  # e.g. run_dir missing: the task reports it in one line
            return
        # and what it held: a refused command removes the log it added there
        held = out.iterdir() if out.is_dir() else ()
        _EXISTED.set(frozenset([*(p for p in (out, *out.parents) if p.exists()), *held]))


def discard_unused_output_dir(
    output_dir: Path, top: Path, started: float | None = None, existed: frozenset | None = None
) -> None:
    """Remove ``output_dir`` if it holds only what Hydra wrote there (``.hydra/``, ``*.log``),
    then its parents while they are empty: a command that failed on its config leaves no
    directory behind.

    With ``existed`` (the directories that existed when the command started,
    :class:`RecordOutputDirs`), every directory it made is removed and none of the others.
    Without it, the parents up to and including ``top`` are, and a directory that existed
    before the command (``started``, a ``time.time()``; the directory's ctime is older: no
    entry was added since) is kept: it holds the logs of earlier commands
    (``<run>/eval_logs`` is shared by every ``evaluate`` of a run)."""
    if not output_dir.is_dir():
        return
    output_dir = output_dir.resolve()
    if existed is not None and output_dir in existed:
        # an existing directory (sample_logs/ of earlier commands) keeps what it held; the
        # log this command added to it goes, if nothing but Hydra wrote beside it
        added = [p for p in output_dir.iterdir() if p not in existed]
        if all(p.name == ".hydra" or p.suffix == ".log" for p in added):
            for p in added:
                if p.suffix == ".log" and p.is_file():
                    p.unlink()
        return
    # File-system clocks are coarse (a jiffy, up to 10 ms behind time.time()).
    if existed is None and started is not None and output_dir.stat().st_ctime < started - 0.02:
        return
    if any(p.name != ".hydra" and p.suffix != ".log" for p in output_dir.iterdir()):
        return
    shutil.rmtree(output_dir)
    top = top.resolve()
    parent = output_dir.parent
    while parent.is_dir() and not any(parent.iterdir()):
        if existed is not None and parent in existed:
            break
        if existed is None and not (parent == top or top in parent.parents):
            break
        parent.rmdir()
        parent = parent.parent


def _output_top(cfg) -> tuple[Path, Path] | None:
    """``(output_dir, top)`` of this Hydra job: ``top`` is ``cfg.run_dir`` for apps that
    take one, else the part of the output directory above the override names, up to its
    first directory below the working directory (for ``outputs/<name>/data.path-/abs/x.npz``
    that is ``outputs``: removed only if the failed command left it empty)."""
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    if cfg.get("run_dir"):
        return out, Path(cfg.run_dir)
    name = str(hc.job.override_dirname or "")
    text = str(out)
    top = Path(text[: -len(name)] or ".") if name and text.endswith(name) else out
    top = top.resolve()
    cwd = Path.cwd().resolve()
    if cwd in top.parents:  # outputs/<name>/...: up to outputs/, if this command made it
        top = cwd / top.relative_to(cwd).parts[0]
    return out, top


#: The errors a user's command or config can cause: one line and exit status 2, no traceback.
CONFIG_ERRORS = (
    ValueError,
    FileNotFoundError,
    FloatingPointError,
    InstantiationException,
    OmegaConfBaseException,
)


def error_line(e: BaseException) -> str:
    """The one line (at most :data:`MAX_ERROR_LINE` characters, without ``error:``) that
    reports ``e``: a config or Hydra error names the field (:func:`config_error_line`); an
    instantiation error reports its cause; any other error its message."""
    if isinstance(e, (OmegaConfBaseException, HydraException)) and not isinstance(
        e, InstantiationException
    ):
        return shorten(config_error_line(e))
    cause = e.__cause__ if isinstance(e, InstantiationException) and e.__cause__ else e
    return shorten(one_line(str(cause)))


class CommandError(SystemExit):
    """A command that failed on its input, after printing ``error: <line>`` on stderr
    (:func:`clean_errors`). A ``SystemExit``: uncaught, the process exits with ``code``
    (2: the config or a usage error; 1: damaged files) and no traceback; a sweep's job
    (``hydra_plugins/scorelib_sweeps.py``) reports ``line``.

    Attributes:
      line: the error line, without ``error:``.
    """

    def __init__(self, line: str, code: int = USAGE_ERROR):
        super().__init__(code)
        self.line = line

    def __str__(self) -> str:
        return self.line


def clean_errors(fn):
    """Turn configuration errors (ValueError, FileNotFoundError, config and instantiation
    errors) into a one-line message and exit status 2, instead of a traceback (a
    :class:`CommandError`; damaged checkpoints: status 1). ``SCORELIB_TRACEBACK=1``
    re-raises. The Hydra output directory of the failed command is
    removed if nothing but Hydra wrote to it, with its empty parents up to ``cfg.run_dir``
    for apps that take one (else up to the directory above the override names)."""

    @functools.wraps(fn)
    def wrapper(cfg, *args, **kwargs):
        try:
            check_added_fields(cfg)
            return fn(cfg, *args, **kwargs)
        except CONFIG_ERRORS as e:
            if os.environ.get("SCORELIB_TRACEBACK"):
                raise
            line = error_line(e)
            print(f"error: {line}", file=sys.stderr)
            where = _output_top(cfg)
            if where is not None:
                discard_unused_output_dir(*where, _command_started(), _existed())
            raise CommandError(line) from None
        except training.CheckpointError as e:  # damaged files, not a config error: status 1
            if os.environ.get("SCORELIB_TRACEBACK"):
                raise
            line = error_line(e)
            print(f"error: {line}", file=sys.stderr)
            raise CommandError(line, 1) from None

    return wrapper


# --------------------------------------------------------------------------- logs


class _ConsoleAndLog:
    """A text stream that writes to the console stream and appends to a log file; the
    log's first write is preceded by ``header`` (a refused command that printed nothing
    adds nothing to the log)."""

    def __init__(self, console, log_path: Path, header: str):
        self._console, self._log_path, self._header, self._log = console, log_path, header, None

    def write(self, text: str) -> int:
        n = self._console.write(text)
        if text:
            if self._log is None:
                self._log = open(self._log_path, "a", encoding="utf-8")  # noqa: SIM115
                self._log.write(self._header)
            self._log.write(text)
            self._log.flush()
        return n

    def flush(self) -> None:
        self._console.flush()

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()

    def __getattr__(self, name):  # isatty, fileno, encoding ...: the console's
        return getattr(self._console, name)


def _job_log() -> Path | None:
    """The log file of Hydra's job logging for this job (``<output dir>/<job name>.log``)
    when a handler of the root logger writes it (``hydra/job_logging=none``: ``None``)."""
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    path = (Path(hc.runtime.output_dir) / f"{hc.job.name}.log").resolve()
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).resolve() == path:
            return path
    return None


def console_to_log(task):
    """``@console_to_log`` on a Hydra task: what it prints on stdout (the tables, the paths
    it writes) also goes to its job's log file (``sample_logs/.../sample.log``,
    ``eval_logs/evaluate.log``), after a line with the time and the command; progress bars
    and errors go to stderr only. Several commands that share a log append to it."""

    @functools.wraps(task)
    def wrapper(cfg, *args, **kwargs):
        log = _job_log()
        if log is None:
            return task(cfg, *args, **kwargs)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        tee = _ConsoleAndLog(sys.stdout, log, f"== {stamp} {command_line()}\n")
        saved, sys.stdout = sys.stdout, tee
        try:
            return task(cfg, *args, **kwargs)
        finally:
            sys.stdout = saved
            tee.close_log()

    return wrapper
