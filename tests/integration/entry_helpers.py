"""Helpers of the entry-point tests: the real command line, in a subprocess or in-process.

A module of its own (not ``conftest.py``): two ``conftest`` modules in different test
directories share one import name, so ``from entry_helpers import ...`` picks whichever was
imported first."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A short toy_dsm run (VP process, DSM, 8 Gaussians on a ring of radius 2; Euler-Maruyama).
# Every override is outside the run's identity, so it trains into outputs/toy_dsm.
TOY_STEPS = 500
TOY = [
    "experiment=toy_dsm",
    f"trainer.steps={TOY_STEPS}",
    "trainer.log_every=50",
    "trainer.ckpt_every=250",
    "sampler.steps=100",
    "sampler.num_samples=1000",
    "sampler.batch_size=1000",
]
TOY_SAMPLES = f"samples/step{TOY_STEPS}/euler_maruyama_100_n1000_seed0"
# A 2-step digits score run: the digits_edm preset (Heun, sigma_min 0.1) with a tiny MLP and a
# 2-step sampler (conftest.tiny_digits_run).
TINY_DIGITS = [
    "experiment=digits_edm",
    "model=mlp",
    "model.width=16",
    "model.depth=1",
    "model.emb_dim=8",
    "trainer.steps=2",
    "trainer.batch_size=16",
    "trainer.ckpt_every=2",
    "sampler.steps=2",
    "sampler.num_samples=4",
    "sampler.batch_size=4",
]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run(
    module: str,
    *overrides: str,
    cwd: Path = ROOT,
    timeout: float = 600,
    check=True,
    env: dict[str, str] | None = None,
):
    """``python -m experiments.<module> <overrides>`` in a subprocess (``cwd``: where
    ``outputs/`` goes; ``env``: variables added to this process's environment)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop("SCORELIB_TRACEBACK", None)
    proc = subprocess.run(
        [sys.executable, "-m", f"experiments.{module}", *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{module} {overrides} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def reproduce(*overrides: str, timeout: float) -> Result:
    """``python -m experiments.reproduce <overrides>`` in a subprocess on the CPU
    (``JAX_PLATFORMS=cpu``), its exit status not checked: the tables' command-line tests."""
    return run("reproduce", *overrides, timeout=timeout, check=False, env={"JAX_PLATFORMS": "cpu"})


def run_inprocess(module: str, *overrides: str) -> Result:
    """The same command through the module's ``main()`` in this process (no JAX start-up
    per command): its exit status, stdout and stderr. Hydra's logging set-up is left out
    (``hydra/job_logging=none``): it would replace the test runner's log handlers."""
    main = importlib.import_module(f"experiments.{module}").main
    out, err = io.StringIO(), io.StringIO()
    argv, code = sys.argv, 0
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    sys.argv = [f"experiments.{module}", *overrides, *quiet]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
    return Result(code, out.getvalue(), err.getvalue())


def smoke_table(name: str, stems: tuple[str, ...], run_dir: Path) -> tuple[dict, dict]:
    """``python -m experiments.reproduce table=<name> table.scale=smoke`` in-process into
    ``run_dir``; checks that it succeeded and wrote ``<name>_<stem>.md/.csv/.tex`` for each
    of ``stems``, ``figure.png`` and ``metadata.json`` (with the command); returns
    ``(metadata, results.json)``."""
    r = run_inprocess("reproduce", f"table={name}", "table.scale=smoke", f"hydra.run.dir={run_dir}")
    assert r.code == 0, r.stderr[-3000:]
    for stem in stems:
        for ext in (".md", ".csv", ".tex"):
            assert (run_dir / f"{name}_{stem}{ext}").is_file(), (stem, ext)
    assert (run_dir / "figure.png").stat().st_size > 5_000
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert f"table={name}" in meta["command"] and meta["git"]
    return meta, json.loads((run_dir / "results.json").read_text())


def assert_table_refused(run_dir: Path, table: str, override: str, needle: str) -> None:
    """``experiments.reproduce table=<table> table.scale=smoke <override>`` exits with status 2
    and one line of stderr holding ``needle``, having trained nothing under ``run_dir``."""
    r = run_inprocess(
        "reproduce", f"table={table}", "table.scale=smoke", override, f"hydra.run.dir={run_dir}"
    )
    assert r.code == 2, (override, r.stderr[-1500:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr[-1500:]
    assert not (run_dir / "runs").exists()  # refused before any training


def copy_run(run_dir: Path, dest: Path) -> Path:
    """A copy of a run directory (to continue or break it without touching the original)."""
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns(".lock"))
    return dest
