"""Reverse diffusion Monte Carlo from the command line: ``experiments.sample
experiment=rdmc_gmm`` and ``rdmc_manywell`` (no training, no samples of the target) write
samples, their target-evaluation count and their evaluation against exact samples; any
registered sampler runs on the score; bad input fails in one line naming the field, before
anything is drawn."""

from __future__ import annotations

import json

import numpy as np
import pytest
from entry_helpers import run_inprocess

#: n chains of k MALA steps per query and m importance proposals, at tiny sizes
N_CHAINS, K_STEPS, M_PROPOSALS = 2, 2, 8
TINY = [
    "sampler.num_samples=48",
    "sampler.batch_size=20",  # three batches, the last short
    f"score.n_samples={N_CHAINS}",
    f"score.n_steps={K_STEPS}",
    f"score.n_proposals={M_PROPOSALS}",
]


def _mala_counts(nfe: int) -> dict:
    """Target evaluations per sample, counted by hand: each of the ``nfe`` score queries runs
    ``N_CHAINS`` MALA chains of ``K_STEPS`` steps (one gradient and one log-density at the
    start and at each proposal) after ``M_PROPOSALS`` importance log-densities."""
    per_chain = K_STEPS + 1
    return {
        "grad": nfe * N_CHAINS * per_chain,
        "density": nfe * (N_CHAINS * per_chain + M_PROPOSALS),
    }


def _only_samples_dir(run_dir):
    (out,) = (run_dir / "samples").iterdir()
    return out


@pytest.mark.slow
def test_rdmc_gmm_samples_counts_and_evaluates(tmp_path):
    r = run_inprocess(
        "sample", "experiment=rdmc_gmm", f"run_dir={tmp_path}", "sampler.steps=4", *TINY
    )
    assert r.code == 0, r.stderr[-3000:]
    out = _only_samples_dir(tmp_path)
    # the sampler's name as a trained run's, then each score/process field off its default
    assert out.name == (
        "euler_maruyama_4_n48_seed0+n_samples-2+n_steps-2+curvature-4+init-importance"
        "+n_proposals-8+horizon-2"
    )
    for f in ("samples.npz", "samples.json", "samples.png", "eval_samples.json", "eval_samples.md"):
        assert (out / f).is_file(), f
    x = np.load(out / "samples.npz")["samples"]
    assert x.shape == (48, 2) and np.all(np.isfinite(x))
    meta = json.loads((out / "samples.json").read_text())
    assert meta["nfe"] == 4  # Euler-Maruyama: one score query per step
    assert meta["target_evaluations"] == _mala_counts(4) == {"grad": 24, "density": 56}
    assert meta["process"]["horizon"] == 2.0 and meta["score"]["init"] == "importance"
    ev = json.loads((out / "eval_samples.json").read_text())
    assert ev["target_evaluations"] == meta["target_evaluations"]
    # the modes at distance 4 are found: far closer to the target than the OU prior is
    assert ev["energy_distance"] < 0.5 * ev["energy_distance_prior"], ev
    assert "energy_distance_floor" in ev
    assert "Target evaluations per sample: 24 gradients and 56 log-densities" in r.stdout


@pytest.mark.slow
def test_rdmc_manywell_runs_with_another_registered_sampler(tmp_path):
    r = run_inprocess(
        "sample",
        "experiment=rdmc_manywell",
        f"run_dir={tmp_path}",
        "sampler=heun",
        "sampler.grid=uniform_t",  # heun's EDM grid reaches sigma 80, past the OU process's 7.3
        "sampler.steps=3",
        *TINY,
    )
    assert r.code == 0, r.stderr[-3000:]
    out = _only_samples_dir(tmp_path)
    assert out.name.startswith("heun_3_n48_seed0+grid-uniform_t+")
    meta = json.loads((out / "samples.json").read_text())
    assert meta["nfe"] == 5  # Heun: 2 steps - 1
    assert meta["target_evaluations"] == _mala_counts(5)
    x = np.load(out / "samples.npz")["samples"]
    assert x.shape == (48, 4)
    assert json.loads((out / "eval_samples.json").read_text())["target_evaluations"]["grad"] == 30


@pytest.mark.parametrize(
    "overrides,expected",
    [
        # a target without a log-density: a toy is samples only
        (
            ["score=rdmc", "process=ou", "sampler=euler_maruyama", "data=toy", "name=x"],
            "error: data must be data=target, a target with a log-density",
        ),
        (
            ["experiment=rdmc_gmm", "score.k=3"],
            "error: score.k is not a field of score=rdmc",
        ),
        (
            ["experiment=rdmc_gmm", "score.init=scaled"],
            "error: score.n_proposals must be null with score.init=scaled; got 256",
        ),
        (
            ["experiment=rdmc_gmm", "score.step_size=2.5"],
            "error: score.step_size must be a number in (0.0, 2.0); got 2.5",
        ),
        (
            ["experiment=rdmc_gmm", "sampler=run"],
            "error: sampler must be a registered sampler with score=rdmc",
        ),
        (
            ["experiment=rdmc_gmm", "sampler=heun"],
            "error: sampler.sigma_max must be <= 7.32",
        ),
        (
            ["experiment=rdmc_gmm", "process.horizon=0"],
            "error: process.horizon must be a number in (0.0, inf); got 0.0",
        ),
        (
            ["experiment=cfdm_moons", "process=ou"],
            "error: process must be null with score=cfdm",
        ),
    ],
)
def test_bad_input_fails_in_one_line_before_anything_is_drawn(overrides, expected, tmp_path):
    r = run_inprocess("sample", f"run_dir={tmp_path}", *overrides)
    assert r.code == 2, r.stderr[-2000:]
    assert r.err_lines == [r.err_lines[0]] and r.err_lines[0].startswith(expected), r.stderr
    assert not (tmp_path / "samples").exists()
