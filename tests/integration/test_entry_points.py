"""End-to-end tests of the Hydra entry points: a trained toy run (the session's ``toy_run``,
trained by a real ``python -m experiments.train``) beats the prior, and a training killed
by SIGKILL resumes, through the real command line, to the uninterrupted run's parameters.
(A checkpoint of another model refused clearly: test_run_identity.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from entry_helpers import ROOT, TOY, TOY_SAMPLES, TOY_STEPS, run, run_inprocess


def final_state(run_dir: Path):
    """Params, EMA params and optimizer state of the latest checkpoint, as numpy leaves."""
    import jax

    from experiments.runs import load_run

    _, state = load_run(run_dir)
    return [
        np.asarray(x) for x in jax.tree.leaves((state.params, state.ema_params, state.opt_state))
    ]


@pytest.mark.slow
def test_train_then_sample_beats_the_prior(toy_run):
    for name in ("config.yaml", "run_info.json", "metrics.jsonl"):
        assert (toy_run / name).is_file(), name
    assert (toy_run / TOY_SAMPLES / "samples.png").is_file()
    r = run_inprocess(
        "sample",
        f"run_dir={toy_run}",
        "sampler=dpmpp_2m",
        "sampler.steps=30",
        "sampler.num_samples=2000",
        "sampler.batch_size=2000",
    )
    assert r.code == 0, r.stderr[-3000:]
    out = toy_run / "samples" / f"step{TOY_STEPS}" / "dpmpp_2m_30_n2000_seed0"
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
    r = run_inprocess("sample", f"run_dir={toy_run}", "sampler.seed=2")
    assert r.code == 0, r.stderr[-3000:]
    x2 = np.load(toy_run / f"samples/step{TOY_STEPS}/euler_maruyama_100_n1000_seed2/samples.npz")
    x0 = np.load(toy_run / TOY_SAMPLES / "samples.npz")
    assert x2["samples"].shape == x0["samples"].shape == (1000, 2)
    assert not np.array_equal(x2["samples"], x0["samples"])


@pytest.mark.slow
def test_sigkill_and_rerun_gives_the_uninterrupted_params(toy_run, tmp_path):
    run_dir = tmp_path / "killed"
    args = [sys.executable, "-m", "experiments.train", *TOY, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = run_dir / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        done = [p for p in ckpts.glob("*") if p.name.isdigit()] if ckpts.exists() else []
        if done:  # killed after its first checkpoint, before its last
            break
        time.sleep(0.2)
    assert proc.poll() is None, "training finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run("train", *TOY, f"hydra.run.dir={run_dir}")  # the same command resumes
    for a, b in zip(final_state(run_dir), final_state(toy_run), strict=True):
        np.testing.assert_array_equal(a, b)
