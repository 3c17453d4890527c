"""``experiments.sample`` on 4 (forced CPU) devices draws the samples of one device: each
batch is split over the devices (``draw_samples(devices=...)``) with per-example keys."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from entry_helpers import ROOT, TOY_STEPS, copy_run

from scorelib.parallel import forced_devices_env


def _sample(run_dir, devices: int, batch_size: int) -> np.ndarray:
    args = [f"run_dir={run_dir}", "sampler.num_samples=40", f"sampler.batch_size={batch_size}"]
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.sample", *args, "sampler.steps=20"],
        cwd=run_dir.parent,
        env=forced_devices_env(devices, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = run_dir.glob(f"samples/step{TOY_STEPS}/euler_maruyama_20_n40_seed0/samples.npz")
    with np.load(path) as z:
        return z["samples"]


@pytest.mark.slow
def test_samples_on_4_devices_equal_one_device(toy_run, tmp_path):
    run_dir = copy_run(toy_run, tmp_path / "run")
    many = _sample(run_dir, 4, batch_size=40)  # chunks of 10 on each device
    one = _sample(run_dir, 1, batch_size=10)
    assert many.shape == (40, 2) and np.ptp(many) > 0.5
    assert np.array_equal(many, one)
