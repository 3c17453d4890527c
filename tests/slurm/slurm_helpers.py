"""Helpers of the Slurm tests: a real single-node Slurm with accounting for the session
(``slurm/local/up.sh``; :func:`start_local_slurm`), its commands, the reference run, outputs.

The fixture skips, with the reason, where Slurm cannot run: not root (the daemons need
it), or the Slurm packages are not installed (``.ci/run`` installs them: ``apt-get install
slurm-wlm slurmdbd munge mariadb-server``). (Not a ``conftest.py``: test directories that
import helpers from their own ``conftest`` would see this one when both are collected.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from scorelib.parallel import free_ports

ROOT = Path(__file__).resolve().parents[2]
BINARIES = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "sacct", "munged", "mariadbd")

# A tiny toy run; every override here is outside the run's identity but batch_size/width.
SMALL = [
    "experiment=toy_dsm",
    "trainer.log_every=10",
    "trainer.ckpt_every=100000",  # only the end and the signal save a checkpoint
    "trainer.batch_size=64",
    "model.width=32",
    "sampler.steps=10",
    "sampler.num_samples=64",
]
RUN = "model.width-32+trainer.batch_size-64"


def _unavailable() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return "needs root to start the Slurm daemons (munged, slurmdbd, slurmctld, slurmd)"
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return (
            f"Slurm is not installed (missing {', '.join(missing)}): apt-get install slurm-wlm "
            "slurmdbd munge mariadb-server (.ci/run does)"
        )
    return None


class Slurm:
    """The running local Slurm: its environment and a few commands."""

    def __init__(self, state_dir: Path, cache: Path):
        self.state_dir = state_dir
        self.env = {
            **os.environ,
            "SLURM_CONF": str(state_dir / "slurm.conf"),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "JAX_PLATFORMS": "cpu",
            "SCORELIB_PYTHON": sys.executable,
            # the suite's persistent compilation cache (tests/conftest.py), shared with the
            # other tests' processes; ``cache`` where the suite sets none
            "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR", str(cache)),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": os.environ.get(
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"
            ),
        }
        for k in list(self.env):
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SUBMITIT_")) and k != "SLURM_CONF":
                del self.env[k]
        self.env.pop("HYDRA_FULL_ERROR", None)
        # the jobs get the suite's XLA:CPU optimisation level (tests/conftest.py), not the
        # outer environment's other XLA flags (a test's device count)
        level = [
            f
            for f in os.environ.get("XLA_FLAGS", "").split()
            if f.startswith("--xla_backend_optimization_level=")
        ]
        self.env.pop("XLA_FLAGS", None)
        if level:
            self.env["XLA_FLAGS"] = level[-1]

    def cmd(self, *args, check=True, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            list(map(str, args)), env=self.env, capture_output=True, text=True, **kw
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{args} failed: {proc.stdout}\n{proc.stderr}")
        return proc

    def sbatch(self, *args, cwd: Path) -> str:
        return self.cmd("sbatch", "--parsable", *args, cwd=cwd).stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        out = self.cmd("squeue", "-h", "-j", job, "-o", "%T %r", check=False).stdout.strip()
        return out

    def wait(self, job: str, timeout: float = 240, release_requeued: bool = True) -> None:
        """Until ``job`` leaves the queue. A requeued job waits about 2 minutes for its
        begin time; ``release_requeued`` starts it at once."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            state = self.state(job)
            if not state:
                return
            if release_requeued and state.startswith("PENDING") and "BeginTime" in state:
                self.cmd("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
            time.sleep(0.5)
        self.cmd("scancel", job, check=False)
        raise TimeoutError(f"job {job} still queued after {timeout} s")

    def sacct(self, job: str) -> list[tuple[str, str, str]]:
        """``(job id, state, exit code)`` of every record of ``job`` (requeues included)."""
        for _ in range(50):  # the accounting database is written asynchronously
            out = self.cmd(
                "sacct", "-n", "-P", "-D", "-X", "-j", job, "-o", "JobID,State,ExitCode"
            ).stdout
            rows = [tuple(line.split("|")) for line in out.splitlines() if line]
            if rows and not any(r[1] in ("RUNNING", "PENDING") for r in rows):
                return rows
            time.sleep(0.2)
        return rows


def start_local_slurm(tmp_path_factory):
    """Generator of the ``slurm`` fixture: bring up the local Slurm, yield :class:`Slurm`,
    tear it down (skips with the reason where it cannot run)."""
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm") / "state"
    env = {**os.environ, "SLURM_LOCAL_PORT": str(free_ports(4))}
    up = subprocess.run(
        [str(ROOT / "slurm" / "local" / "up.sh"), str(state)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        if up.returncode != 0:
            logs = "\n".join(p.read_text()[-1500:] for p in sorted((state / "log").glob("*.log")))
            pytest.fail(f"slurm/local/up.sh failed:\n{up.stdout}\n{up.stderr}\n{logs}")
        yield Slurm(state, tmp_path_factory.mktemp("jax_cache"))
    finally:
        subprocess.run(
            [str(ROOT / "slurm" / "local" / "down.sh"), str(state)], timeout=120, check=False
        )


def train_locally(cwd: Path, *overrides: str, env: dict) -> subprocess.CompletedProcess:
    """``python -m experiments.train`` here, outside Slurm: the reference run."""
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.jsonl") as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def samples(run_dir: Path, steps: int) -> np.ndarray:
    (path,) = (run_dir / "samples" / f"step{steps}").glob("*/samples.npz")
    return np.load(path)["samples"]
