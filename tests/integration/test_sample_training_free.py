"""Training-free sampling end to end: ``experiments.sample experiment=cfdm_*`` with no
checkpoint writes samples, a PNG and the evaluation; bad input fails naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from entry_helpers import run_inprocess


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_cfdm_moons_samples_and_evaluates_without_a_checkpoint(tmp_path):
    r = run_inprocess(
        "sample",
        "experiment=cfdm_moons",
        "sampler.num_samples=64",
        "sampler.batch_size=24",
        f"run_dir={tmp_path}",
    )
    assert r.code == 0, r.stderr
    out = tmp_path / "samples" / "cfdm_T0.95_S100_n64_seed0+n_train-50"
    for f in ("samples.npz", "samples.json", "samples.png", "eval_samples.json", "eval_samples.md"):
        assert (out / f).is_file(), f
    x = np.load(out / "samples.npz")["samples"]
    assert x.shape == (64, 2) and np.all(np.isfinite(x))
    ev = json.loads((out / "eval_samples.json").read_text())
    assert ev["energy_distance"] < ev["energy_distance_prior"]  # better than the prior
    meta = json.loads((out / "samples.json").read_text())
    assert meta["nfe"] == 5 and meta["n_train"] == 50


@pytest.mark.slow
def test_cfdm_digits_samples_and_evaluates_without_a_checkpoint(tmp_path):
    r = run_inprocess(
        "sample", "experiment=cfdm_digits", "sampler.num_samples=200", f"run_dir={tmp_path}"
    )
    assert r.code == 0, r.stderr
    out = tmp_path / "samples" / "cfdm_T0.95_S100_n200_seed0+sigma_s-1"
    ev = json.loads((out / "eval_samples.json").read_text())
    assert np.load(out / "samples.npz")["samples"].shape == (200, 8, 8, 1)
    assert ev["fd"] < ev["fd_gaussian"]
    assert (out / "samples.png").is_file()


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["score.estimator=nn", "score.k=51"], "score.k must be an integer in [1, 50]"),
        (["score.M=0"], "score.M must be an integer >= 1"),
        (["score.sigma_s=-0.1"], "score.sigma_s must be a number in [0.0"),
        (["sampler.T=1.0"], "sampler.T must be a number in [0.0, 1.0)"),
        (["score.k=3"], "score.k must be null with score.estimator=exact"),
        (["score.estimator=nn", "score.nprobe=3"], "score.nprobe must be unset"),
        (["score.n_train=0"], "score.n_train must be an integer >= 1"),
    ],
)
def test_bad_input_fails_before_compute_naming_the_field(overrides, expected, tmp_path):
    r = run_inprocess("sample", "experiment=cfdm_moons", f"run_dir={tmp_path}", *overrides)
    assert r.code == 2, r.stderr
    assert expected in r.stderr, r.stderr
    assert not (tmp_path / "samples").exists()
