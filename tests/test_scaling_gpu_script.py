"""benchmarks/scaling_gpu.py (make bench-gpu) refuses a real run without a GPU in one line
and checks its arguments, before it builds or compiles anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "scaling_gpu.py"


def run(*args):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # no GPU, whatever the machine has
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_a_real_run_without_a_gpu_stops_with_one_line():
    proc = run()
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("scaling_gpu.py: JAX sees no GPU (backend cpu)"), proc.stderr
    assert "--cpu-smoke" in lines[-1] and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_bad_counts_are_refused_naming_the_flag():
    proc = run("--repeats", "0")
    assert proc.returncode == 2
    assert "--repeats must be >= 1; got 0" in proc.stderr
