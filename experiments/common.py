"""Helpers shared by the entry points: run metadata, object construction, clean errors."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

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
    "scorelib",
)


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

    Written atomically (temp file + ``os.replace``); rewritten on every launch of the run,
    with the launch appended to ``launches`` so resumed runs keep their history.
    """
    import jax

    run_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    info_path = run_dir / "run_info.json"
    launches = []
    if info_path.exists():
        try:
            launches = json.loads(info_path.read_text()).get("launches", [])
        except (OSError, ValueError):
            launches = []
    launch = {
        "command": " ".join([Path(sys.executable).name, "-m", _module_name()] + sys.argv[1:]),
        "git": git_revision(),
        "versions": package_versions(),
        "host": platform.node(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
    }
    info = {"seed": seed, **(extra or {}), "launches": launches + [launch]}
    _atomic_write(info_path, json.dumps(info, indent=2, default=str))


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else (sys.argv[0] or "python")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def discard_unused_output_dir(output_dir: Path, top: Path) -> None:
    """Remove ``output_dir`` if it holds only what Hydra wrote there (``.hydra/``, ``*.log``),
    then its parents up to and including ``top`` while they are empty: a command that
    failed on its config leaves no directory behind."""
    if not output_dir.is_dir():
        return
    if any(p.name != ".hydra" and p.suffix != ".log" for p in output_dir.iterdir()):
        return
    shutil.rmtree(output_dir)
    top = top.resolve()
    parent = output_dir.resolve().parent
    while (parent == top or top in parent.parents) and parent.is_dir():
        if any(parent.iterdir()):
            break
        parent.rmdir()
        parent = parent.parent


def clean_errors(fn):
    """Turn configuration errors (ValueError, FileNotFoundError) into a one-line message and
    exit status 2, instead of a traceback. ``SCORELIB_TRACEBACK=1`` re-raises. The Hydra
    output directory of the failed command is removed if nothing but Hydra wrote to it
    (with its empty parents up to ``cfg.run_dir`` for apps that take one)."""

    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import InstantiationException

    @functools.wraps(fn)
    def wrapper(cfg, *args, **kwargs):
        try:
            return fn(cfg, *args, **kwargs)
        except (ValueError, FileNotFoundError, FloatingPointError, InstantiationException) as e:
            if os.environ.get("SCORELIB_TRACEBACK"):
                raise
            cause = e.__cause__ if isinstance(e, InstantiationException) and e.__cause__ else e
            print(f"error: {cause}", file=sys.stderr)
            if HydraConfig.initialized():
                out = Path(HydraConfig.get().runtime.output_dir)
                top = Path(cfg.run_dir) if cfg.get("run_dir") else out
                discard_unused_output_dir(out, top)
            sys.exit(2)

    return wrapper
