"""End to end: ``python -m experiments.reproduce table=sure table.scale=smoke`` (a SURE-Score
model and DSM on noisy digits, DSM on clean digits, each an experiments.train run, judged
against the clean test digits; writer, figure), then ``table=sure_reconstruct`` on the same
trained priors (reconstructions of held-out digits through experiments.reconstruct), and
their one-line refusals."""

import numpy as np
import pytest
from entry_helpers import assert_table_refused, smoke_table
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow
LEVELS = "table.noise_levels must be a number in (0.0, inf)"


def test_sure_smoke(tmp_path):
    run_dir = tmp_path / "run"
    _, res = smoke_table("sure", ("summary", "denoisers"), run_dir)
    # the SURE models learned from the noisy digits at the table's noise level, one per variant
    authors = OmegaConf.load(run_dir / "runs/sure_authors_0.5_seed0/config.yaml")
    assert authors.objective._target_.endswith("SURE") and authors.data.noise_sigma == 0.5
    assert authors.objective.dsm_into_denoiser and authors.objective.dsm_ramp_steps == 20
    first = OmegaConf.load(run_dir / "runs/sure_first_0.5_seed0/config.yaml").objective
    assert not first.dsm_into_denoiser and not first.nonnegative_divergence
    guard = OmegaConf.load(run_dir / "runs/sure_guard_0.5_seed0/config.yaml").objective
    assert guard.nonnegative_divergence
    assert OmegaConf.load(run_dir / "runs/clean_seed0/config.yaml").data.noise_sigma is None
    rows = {(x["sigma_n"], x["label"]): x for x in res}
    variants = ("authors", "first", "guard", "first_global", "guard_global")
    sure_rows = [f"SURE-Score ({k}), noisy digits" for k in variants]
    assert set(rows) == {
        (None, "DSM, clean digits (reference)"),
        *((0.5, label) for label in sure_rows),
        (0.5, "DSM, noisy digits"),
        (0.5, "noisy training digits (no model)"),
    }
    for x in res:
        assert 0 <= x["c2st_pixels_samples"] <= 1 and 0 <= x["recall_pixels_samples"] <= 1
        assert x["two_sample_n"] == 100  # the smoke scale's samples, all against test digits
    for label in [*sure_rows, "DSM, noisy digits"]:
        x = rows[(0.5, label)]
        for split in ("train", "held_out"):
            # SURE = residual + divergence term - sigma_n^2, per pixel
            parts = x[f"residual_{split}"] + x[f"divergence_{split}"] - 0.25
            assert x[f"sure_{split}"] == pytest.approx(parts, abs=1e-5)
            assert x[f"mse_{split}"] > 0
        assert ("trace" in x) == label.startswith("SURE")
    # the guard's logged divergence term is never negative, on either model
    assert rows[(0.5, sure_rows[2])]["trace"]["div_min"] >= 0
    assert rows[(0.5, sure_rows[4])]["trace"]["div_min"] >= 0
    # noise at 0.5 on [-1, 1] images is told from clean digits by its pixels
    assert rows[(0.5, "noisy training digits (no model)")]["c2st_pixels_samples"] > 0.8
    summary = (run_dir / "sure_summary.md").read_text()
    assert "clean training digits (floor)" in summary and "competitive with clean" in summary
    assert "SURE, held-out digits" in (run_dir / "sure_denoisers.md").read_text()


def test_sure_reconstruct_smoke(tmp_path):
    run_dir = tmp_path / "run"
    _, rec = smoke_table("sure_reconstruct", ("psnr", "gap"), run_dir)
    # the committed recipe: x_hat through stop_gradient
    cfg = OmegaConf.load(run_dir / "runs/sure_0.5_seed0/config.yaml")
    assert not cfg.objective.dsm_into_denoiser
    rows = rec["rows"]
    assert {(r["task"], r["model"], r["method"]) for r in rows} == {
        (t, lab, m)
        for t in ("cs", "inpaint_box")
        for lab in (
            "DSM, clean digits (reference)",
            "SURE-Score, noisy digits",
            "DSM, noisy digits",
        )
        for m in ("pigdm", "dps")
    }
    for r in rows:
        assert len(r["psnr_per_example"]) == 4  # the smoke scale's task.num_images
        assert r["psnr"] == pytest.approx(sum(r["psnr_per_example"]) / 4)
        out = run_dir / r["reconstructions"]
        assert (out / f"reconstructions_{r['method']}.npz").is_file()
    # every prior reconstructed the same measurements of the same test digits
    ys = {
        r["task"]: [
            np.load(run_dir / q["reconstructions"] / "measurements.npz")["y"]
            for q in rows
            if q["task"] == r["task"]
        ]
        for r in rows
    }
    for task, arrays in ys.items():
        assert all(np.array_equal(a, arrays[0]) for a in arrays), task
    gap = (run_dir / "sure_reconstruct_gap.md").read_text()
    assert "gap share recovered" in gap and "trained naively on the noisy data" in gap


@pytest.mark.parametrize(
    "override,needle",
    [
        (
            "table.smoke.noise_levels=[0.5,0.0]",
            "table.noise_levels must be a number in (0.0, inf); got 0.0",
        ),
        (
            "table.smoke.noise_levels=[-0.2]",
            "table.noise_levels must be a number in (0.0, inf); got -0.2",
        ),
        ("table.smoke.seeds=[0,0]", "table.seeds must be distinct integers"),
        (
            "table.smoke.overrides=['experiment=digits_edm','data.dequantise=false']",
            "table.overrides must be a list that includes data.holdout=<fraction in (0, 1)>",
        ),
        ("table.scale=full", "table.scale must be 'small' or 'smoke'; got 'full'"),
    ],
)
def test_sure_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path, "sure", override, needle)


@pytest.mark.parametrize(
    "override,needle",
    [
        ("table.most=1.5", "table.most must be a number in (0.0, 1.0); got 1.5"),
        ('table.tasks.cs=["task=cs","task.m=100"]', "task.m must be an integer in [1, 64]"),
        ('table.tasks.cs=["task=nope"]', "table.tasks.cs (with table.reconstruct) must compose"),
        ('table.tasks.cs=["task=cs","method.eta=0.5"]', "method.eta is used only by method ddrm"),
    ],
)
def test_sure_reconstruct_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path, "sure_reconstruct", override, needle)
