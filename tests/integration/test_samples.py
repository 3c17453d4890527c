"""Samples are named by everything that changes them and record what was used; evaluate
picks samples by an explicit rule (the arguments of the ``sample`` command that drew them).

The commands run through each module's ``main()`` (the same code path as ``python -m``; the
real processes are test_sample_devices.py's, test_edges.py's and test_errors.py's)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from entry_helpers import ROOT, TOY_SAMPLES, TOY_STEPS, run_inprocess
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow


def _load(path):
    return np.load(path / "samples.npz")["samples"]


def run(module, *overrides):
    """``experiments.<module> <overrides>`` in-process, checked to succeed."""
    r = run_inprocess(module, *overrides)
    assert r.code == 0, r.stderr[-3000:]
    return r


def test_use_ema_false_gets_its_own_directory_and_record(toy_run):
    ema_dir = toy_run / TOY_SAMPLES
    before = (ema_dir / "samples.npz").read_bytes()
    r = run("sample", f"run_dir={toy_run}", "use_ema=false")
    raw_dir = toy_run / (TOY_SAMPLES + "+use_ema-false")
    assert f"samples: {raw_dir}" in r.stdout
    assert (ema_dir / "samples.npz").read_bytes() == before  # the EMA samples are untouched
    meta = json.loads((raw_dir / "samples.json").read_text())
    assert meta["use_ema"] is False and meta["checkpoint_step"] == TOY_STEPS
    assert "raw params" in meta["title"]
    assert not np.array_equal(_load(raw_dir), _load(ema_dir))


def test_sampler_options_name_the_directory_and_only_used_fields_are_recorded(toy_run):
    run("sample", f"run_dir={toy_run}", "sampler=heun", "sampler.steps=8", "sampler.S_churn=40")
    out = toy_run / f"samples/step{TOY_STEPS}/heun_8_n1000_seed0+S_churn-40"
    meta = json.loads((out / "samples.json").read_text())
    assert meta["sampler"] == {
        "name": "heun",
        "steps": 8,
        "grid": "edm",
        "S_churn": 40.0,
        "S_min": 0.0,
        "S_max": float("inf"),
        "S_noise": 1.0,
        "num_samples": 1000,  # the run's, as sampler=<name> keeps it
        "seed": 0,
        "float64": False,
    }
    assert meta["nfe"] == 15 and len(meta["grid_ve_sigma"]) == 9
    assert "VP, heun 8 steps" in meta["title"]  # plot titles say process and sampler
    # the grid's options are recorded when given, and name the directory
    run("sample", f"run_dir={toy_run}", "sampler=heun", "sampler.steps=8", "sampler.rho=3")
    out = toy_run / f"samples/step{TOY_STEPS}/heun_8_n1000_seed0+rho-3"
    meta = json.loads((out / "samples.json").read_text())
    assert meta["sampler"]["rho"] == 3.0 and "sigma_min" not in meta["sampler"]


def test_evaluate_picks_the_samples_of_the_same_sample_arguments(toy_run):
    r = run("evaluate", f"run_dir={toy_run}")
    default = toy_run / TOY_SAMPLES
    assert str(default / "samples.npz") in r.stdout
    assert json.loads((default / "eval_samples.json").read_text())["samples"] == str(
        default / "samples.npz"
    )
    run("sample", f"run_dir={toy_run}", "sampler.seed=1")
    seed1 = toy_run / f"samples/step{TOY_STEPS}/euler_maruyama_100_n1000_seed1"
    r = run("evaluate", f"run_dir={toy_run}")
    assert str(default / "samples.npz") in r.stdout  # not the newest file
    r = run("evaluate", f"run_dir={toy_run}", "sampler.seed=1")
    assert str(seed1 / "samples.npz") in r.stdout and (seed1 / "eval_samples.json").is_file()
    result = json.loads((seed1 / "eval_samples.json").read_text())
    assert result["energy_distance"] < 0.3 * result["energy_distance_prior"], result


def test_image_evaluation_shows_progress_and_the_gaussian_baseline(tmp_path):
    from hydra import compose, initialize_config_dir

    from experiments.schema import register_configs
    from scorelib.data import load_digits

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=digits_edm"])
    run_dir = tmp_path / "digits"
    run_dir.mkdir()
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    train = load_digits().train
    np.savez(tmp_path / "train.npz", samples=train[:500])
    r = run("evaluate", f"run_dir={run_dir}", f"samples={tmp_path / 'train.npz'}")
    assert "evaluating" in r.stderr  # the progress bar over the stages
    result = json.loads((tmp_path / "eval_train.json").read_text())
    # training digits are far closer to the test digits than a Gaussian fit is
    assert result["fd"] < 0.2 * result["fd_gaussian"], result
    # copies of training digits pass the two-sample test (at the floor, far from the
    # Gaussian baseline); only the memorisation statistics beside it show the copying
    assert result["two_sample_n"] == 359 and result["two_sample_draws"] == 1
    se = result["c2st_pixels_se_floor"]
    assert abs(result["c2st_pixels_samples"] - result["c2st_pixels_floor"]) < 4 * se, result
    assert result["c2st_pixels_gaussian"] > 0.85, result
    assert result["mem_copy_rate"] == 1.0 and result["mem_nn_mean_ratio"] == 0.0
    assert "bpd" not in result  # no checkpoint in this run directory: no model to score
    table = (tmp_path / "eval_train.md").read_text()
    assert "| C2ST pixels |" in table and "(floor)" in table
