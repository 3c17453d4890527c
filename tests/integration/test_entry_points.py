"""End-to-end tests of the Hydra entry points through the real command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
# A short toy_dsm run (VP process, DSM, 8 Gaussians on a ring of radius 2; Euler-Maruyama).
TOY = [
    "experiment=toy_dsm",
    "trainer.steps=1500",
    "trainer.log_every=50",
    "trainer.ckpt_every=250",
    "sampler.steps=100",
    "sampler.num_samples=1000",
    "sampler.batch_size=1000",
]


def run(module: str, *overrides: str, timeout: float = 600, check: bool = True):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", f"experiments.{module}", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{module} {overrides} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return proc


def final_state(run_dir: Path):
    """Params, EMA params and optimizer state of the latest checkpoint, as numpy leaves."""
    import jax

    from experiments.sample import load_run

    _, state = load_run(run_dir)
    return [
        np.asarray(x) for x in jax.tree.leaves((state.params, state.ema_params, state.opt_state))
    ]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("toy") / "run"
    run("train", *TOY, f"hydra.run.dir={run_dir}")
    return run_dir


@pytest.mark.slow
def test_train_then_sample_beats_the_prior(toy_run):
    for name in ("config.yaml", "run_info.json", "metrics.jsonl"):
        assert (toy_run / name).is_file(), name
    assert list((toy_run / "samples").glob("*/samples.png"))
    run(
        "sample",
        f"run_dir={toy_run}",
        "sampler=dpmpp_2m",
        "sampler.steps=30",
        "sampler.num_samples=2000",
        "sampler.batch_size=2000",
    )
    out = toy_run / "samples" / "dpmpp_2m_30_seed0"
    x = np.load(out / "samples.npz")["samples"]
    assert x.shape == (2000, 2) and np.all(np.isfinite(x))

    from scorelib.data import toy_sample
    from scorelib.metrics import energy_distance

    target = toy_sample("8gaussians", 2000, seed=99)
    prior = np.random.default_rng(0).standard_normal((2000, 2))  # the VP prior N(0, I)
    e_samples, e_prior = energy_distance(x, target), energy_distance(prior, target)
    assert e_samples < 0.3 * e_prior, (e_samples, e_prior)

    # Without `sampler=<name>`, the run's own sampler (Euler-Maruyama, 100 steps, 1,000
    # samples) is used, with the `sampler.<field>=` overrides on top.
    run("sample", f"run_dir={toy_run}", "sampler.seed=1")
    x1 = np.load(toy_run / "samples" / "euler_maruyama_100_seed1" / "samples.npz")["samples"]
    x0 = np.load(toy_run / "samples" / "euler_maruyama_100_seed0" / "samples.npz")["samples"]
    assert x1.shape == x0.shape == (1000, 2) and not np.array_equal(x1, x0)


@pytest.mark.slow
def test_sigkill_and_rerun_gives_the_uninterrupted_params(toy_run, tmp_path):
    run_dir = tmp_path / "killed"
    args = [sys.executable, "-m", "experiments.train", *TOY, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = run_dir / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        done = [p for p in ckpts.glob("*") if p.name.isdigit()] if ckpts.exists() else []
        if any(int(p.name) >= 500 for p in done):
            break
        time.sleep(0.2)
    assert proc.poll() is None, "training finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run("train", *TOY, f"hydra.run.dir={run_dir}")  # the same command resumes
    for a, b in zip(final_state(run_dir), final_state(toy_run), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_checkpoint_of_another_model_is_refused_clearly(toy_run, tmp_path):
    other = [*TOY, "model.width=64"]
    proc = run("train", *other, f"hydra.run.dir={toy_run}", check=False)
    assert proc.returncode != 0
    assert "model" in proc.stderr and "width" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["sampler.steps=0"], "sampler.steps"),
        (["process.sigma_min=-1"], "process.sigma_min"),
        (["process.sigma_min=100"], "process.sigma_max"),
        (["experiment=toy_dsm", "process.beta_min=-1"], "process.beta_min"),
        (["sampler.rho=0"], "sampler.rho"),
        (["sampler.name=nope"], "sampler.name"),
        (["trainer.batch_size=0"], "trainer.batch_size"),
        (["optim.lr=-1"], "optim.lr"),
        (["sampler.steps=abc"], "sampler.steps"),
        (["experiment=nope"], "digits_edm"),  # the error lists the available presets
        (["data=npz", "data.path=/nonexistent/images.npz"], "/nonexistent/images.npz"),
    ],
)
def test_bad_overrides_fail_before_training_with_a_clear_message(overrides, expected, tmp_path):
    run_dir = tmp_path / "run"
    proc = run("train", *overrides, f"hydra.run.dir={run_dir}", check=False, timeout=300)
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr[-2000:]
    assert not (run_dir / "checkpoints").exists()
    if proc.returncode == 2:  # our config errors (Hydra's own fail before creating it)
        assert not run_dir.exists(), list(run_dir.rglob("*"))


def test_sampling_a_missing_run_fails_clearly_and_leaves_nothing(tmp_path):
    missing = tmp_path / "no_such_run"
    for module in ("sample", "evaluate"):
        proc = run(module, f"run_dir={missing}", check=False, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "config.yaml" in proc.stderr and "Traceback" not in proc.stderr
        assert not missing.exists(), list(missing.rglob("*"))
