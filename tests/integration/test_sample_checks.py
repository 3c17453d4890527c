"""Diverged samples are counted when drawn and refused, with the count, when evaluated."""

import jax
import numpy as np
import pytest

from experiments.build import Sampling
from experiments.runs.evaluation import evaluate_points
from scorelib.samplers import draw_samples


def _diverging(source, key, shape, *, grid, first_index=0):
    """A stand-in sampler: global example i is NaN when i % 7 == 3, inf when i % 11 == 5."""
    idx = first_index + np.arange(shape[0])
    x = np.zeros(shape, np.float32)
    x[idx % 7 == 3, 0] = np.nan
    x[idx % 11 == 5, -1] = np.inf
    return x, {"nfe": 1}


def test_draw_counts_nonfinite_samples_across_batches():
    s = Sampling("stub", _diverging, np.array([1.0, 0.0]), {})
    x, info = draw_samples(s, None, jax.random.key(0), (2,), num_samples=50, batch_size=8)
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

    from experiments.runs import ScoreRun
    from experiments.schema import register_configs, run_sampler_schema, sampler_schema

    register_configs()
    run_cfg = OmegaConf.create(
        {"sampler": {"name": "heun", "steps": 18, "num_samples": 10000, "seed": 0}}
    )
    given = OmegaConf.structured(run_sampler_schema())  # sampler=run: every field null
    cfg = OmegaConf.create({"sampler": given})
    cfg.sampler.seed = 1
    got = ScoreRun.sampler_config(cfg, run_cfg, ["run_dir=x", "sampler.seed=1"])
    assert OmegaConf.get_type(got) is sampler_schema("heun")
    assert (got.name, got.steps, got.num_samples, got.seed) == ("heun", 18, 10000, 1)
    assert got.S_churn == 0.0  # the library's default, typed by heun's schema
    assert run_cfg.sampler.seed == 0  # the run's config is not modified
    same = ScoreRun.sampler_config(
        OmegaConf.create({"sampler": given.copy()}), run_cfg, ["run_dir=x"]
    )
    assert same.seed == 0 and same.num_samples == 10000
    # A chosen group keeps the run's sample count (comparable results) unless overridden.
    pc = OmegaConf.create({"sampler": OmegaConf.structured(sampler_schema("pc"))})
    pc.sampler.steps, pc.sampler.num_samples, pc.sampler.seed = 50, 500, 1
    got = ScoreRun.sampler_config(pc, run_cfg, ["sampler=pc", "sampler.seed=1"])
    assert (got.name, got.steps, got.num_samples, got.seed) == ("pc", 50, 10000, 1)
    got = ScoreRun.sampler_config(pc, run_cfg, ["sampler=pc", "sampler.num_samples=500"])
    assert got.num_samples == 500


def test_samples_dir_names_every_field_that_changes_the_samples(tmp_path):
    from experiments.runs import ScoreRun
    from experiments.runs.layout import samples_dir as layout_dir

    def samples_dir(run_dir, record, *, step, use_ema=True):
        sampling = Sampling(record["name"], None, np.zeros(2), {}, record)
        return layout_dir(run_dir, ScoreRun.samples_name(sampling, use_ema), step)

    heun = {
        "name": "heun",
        "steps": 18,
        "grid": "edm",
        "S_churn": 0.0,
        "S_min": 0.0,
        "S_max": float("inf"),
        "S_noise": 1.0,
        "num_samples": 100,
        "seed": 0,
        "float64": False,
    }
    first = samples_dir(tmp_path, heun, step=500)
    assert first == tmp_path / "samples" / "step500" / "heun_18_n100_seed0"
    assert samples_dir(tmp_path, {**heun, "batch_size": 7}, step=500) == first
    names = {
        samples_dir(tmp_path, {**heun, "S_churn": 10.0}, step=500).name,
        samples_dir(tmp_path, {**heun, "num_samples": 10}, step=500).name,
        samples_dir(tmp_path, {**heun, "seed": 1}, step=500).name,
        samples_dir(tmp_path, {**heun, "grid": "log_snr"}, step=500).name,
        samples_dir(tmp_path, {**heun, "rho": 3.0}, step=500).name,
        samples_dir(tmp_path, {**heun, "float64": True}, step=500).name,
        samples_dir(tmp_path, heun, use_ema=False, step=500).name,
        first.name,
    }
    assert len(names) == 8, names
    assert "heun_18_n100_seed0+S_churn-10" in names and "heun_18_n100_seed0+use_ema-false" in names
    assert samples_dir(tmp_path, heun, step=400).parent.name == "step400"


def test_a_refining_students_samples_and_header_state_its_nfe(tmp_path):
    """A student with a refining stage (``distill.sigma_refine``) takes two network
    evaluations: its samples are ``onestep_nfe2_...`` and ``evaluate``'s first line says
    ``NFE 2``; a plain student keeps ``onestep_1_...`` (issue 39, item 7)."""
    import json

    from omegaconf import OmegaConf

    from experiments.runs.distill import DistillRun
    from experiments.runs.evaluation import describe_samples

    sampler = {"num_samples": 200, "batch_size": 100, "seed": 0}
    for refine, name in ((None, "onestep_1_n200_seed0"), (0.1, "onestep_nfe2_n200_seed0")):
        cfg = OmegaConf.create({"sampler": sampler, "distill": {"sigma_refine": refine}})
        sampling = DistillRun.sampling_of(cfg)
        assert DistillRun.samples_name(sampling) == name
    assert sampling.record["nfe"] == 2 and sampling.record["steps"] == 1
    meta = {"sampler": sampling.record, "nfe": 2, "checkpoint_step": 20, "use_ema": True}
    (tmp_path / "samples.json").write_text(json.dumps(meta))
    described = describe_samples(tmp_path / "samples.npz")
    assert described.endswith("(onestep, 1 step, NFE 2, checkpoint step 20, EMA weights)")
