"""Diverged samples are counted when drawn and refused, with the count, when evaluated."""

import numpy as np
import pytest

from experiments.build import Sampling
from experiments.evaluation import evaluate_points
from experiments.sampling import draw


def _diverging(source, key, shape, *, grid, first_index=0):
    """A stand-in sampler: global example i is NaN when i % 7 == 3, inf when i % 11 == 5."""
    idx = first_index + np.arange(shape[0])
    x = np.zeros(shape, np.float32)
    x[idx % 7 == 3, 0] = np.nan
    x[idx % 11 == 5, -1] = np.inf
    return x, {"nfe": 1}


def test_draw_counts_nonfinite_samples_across_batches():
    s = Sampling("stub", _diverging, np.array([1.0, 0.0]), {})
    x, info = draw(s, None, (2,), num_samples=50, batch_size=8, seed=0)
    i = np.arange(50)
    expected = int(np.sum((i % 7 == 3) | (i % 11 == 5)))  # counted once when both
    assert x.shape == (50, 2) and info["num_nonfinite"] == expected == 11


def test_evaluation_refuses_nonfinite_samples_with_the_count():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((100, 2))
    samples = rng.standard_normal((40, 2))
    assert np.isfinite(evaluate_points(samples, ref)["energy_distance"])
    samples[[3, 9], 1] = np.nan
    samples[20, 0] = -np.inf
    with pytest.raises(ValueError, match="3 of 40 samples are not finite"):
        evaluate_points(samples, ref)


def test_sampler_config_is_the_runs_own_unless_a_group_is_chosen():
    from omegaconf import OmegaConf

    from experiments.sample import sampler_config

    run_cfg = OmegaConf.create(
        {"sampler": {"name": "heun", "steps": 18, "num_samples": 10000, "seed": 0}}
    )
    cfg = OmegaConf.create(
        {"sampler": {"name": "heun", "steps": 18, "num_samples": 1000, "seed": 1}}
    )
    got = sampler_config(cfg, run_cfg, ["run_dir=x", "sampler.seed=1"])
    assert OmegaConf.to_container(got) == {
        "name": "heun",
        "steps": 18,
        "num_samples": 10000,
        "seed": 1,
    }
    assert run_cfg.sampler.seed == 0  # the run's config is not modified
    assert sampler_config(cfg, run_cfg, ["run_dir=x"]) == run_cfg.sampler
    # A chosen group keeps the run's sample count (comparable results) unless overridden.
    pc = OmegaConf.create({"sampler": {"name": "pc", "steps": 50, "num_samples": 500, "seed": 1}})
    got = sampler_config(pc, run_cfg, ["sampler=pc", "sampler.seed=1"])
    assert OmegaConf.to_container(got) == {
        "name": "pc",
        "steps": 50,
        "num_samples": 10000,
        "seed": 1,
    }
    got = sampler_config(pc, run_cfg, ["sampler=pc", "sampler.num_samples=500"])
    assert got.num_samples == 500


def test_samples_dir_never_overwrites_other_samples(tmp_path):
    import json

    from experiments.outputs import samples_dir

    heun = {
        "name": "heun",
        "steps": 18,
        "seed": 0,
        "num_samples": 100,
        "batch_size": 50,
        "S_churn": 0.0,
    }
    first = samples_dir(tmp_path, heun)
    assert first.name == "heun_18_seed0"
    first.mkdir()
    (first / "samples.json").write_text(json.dumps({"sampler": heun}))
    # the same config (batch size does not change the samples) finds the same directory
    assert samples_dir(tmp_path, {**heun, "batch_size": 100}) == first
    other = samples_dir(tmp_path, {**heun, "S_churn": 10.0})
    assert other.parent == tmp_path and other.name.startswith("heun_18_seed0_") and other != first
    assert samples_dir(tmp_path, {**heun, "S_churn": 10.0}) == other  # deterministic
    assert samples_dir(tmp_path, {**heun, "num_samples": 10}) not in (first, other)
