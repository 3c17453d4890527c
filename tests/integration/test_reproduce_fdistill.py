"""End to end: ``python -m experiments.reproduce table=fdistill_gmm table.scale=smoke``
(students through experiments.distill, mode statistics, energy distance, writer, figure)."""

import json
from pathlib import Path

import numpy as np
import pytest
from compose_train import compose_train
from entry_helpers import run_inprocess
from omegaconf import OmegaConf

from experiments.common import CONFIG_DIR

pytestmark = pytest.mark.slow


def test_fdistill_gmm_smoke(tmp_path):
    run_dir = tmp_path / "run"
    r = run_inprocess(
        "reproduce", "table=fdistill_gmm", "table.scale=smoke", f"hydra.run.dir={run_dir}"
    )
    assert r.code == 0, r.stderr[-3000:]
    for stem in ("summary", "mass"):
        for ext in (".md", ".csv", ".tex"):
            assert (run_dir / f"fdistill_gmm_{stem}{ext}").is_file(), (stem, ext)
    assert (run_dir / "figure.png").stat().st_size > 5_000
    res = json.loads((run_dir / "results.json").read_text())
    assert set(res["students"]) == {"kl"}  # the smoke scale's divergences
    exact = res["exact"][0]
    assert exact["n_covered"] == 8 and exact["off_mode"] < 0.05  # the ceiling is measured
    for rows in res["students"].values():
        assert len(rows[0]["mass"]) == 8 and rows[0]["energy"] >= 0
    assert (run_dir / "runs/kl_seed0/checkpoints").is_dir()
    summary = (run_dir / "fdistill_gmm_summary.md").read_text()
    assert "forward-KL" in summary and "exact samples" in summary


def test_fdistill_digits_smoke(tmp_path):
    """A tiny digits teacher trained by the table, a one-step student (the smoke scale's one
    divergence) and a variant with the ablation's options (the EMA counting student
    updates, clipped gradients), each also sampled from its raw weights, the teacher at a
    few NFE, FD, the stronger C2ST and memorisation for each row, the paper's column, the
    table paired with the preset's student."""
    run_dir = tmp_path / "run"
    variant = (
        "table.variants=[{name: abl, divergence: kl, overrides: "
        '["distill.ema_clock=student_updates", "optim.grad_clip=10"]}]'
    )
    r = run_inprocess(
        "reproduce",
        "table=fdistill_digits",
        "table.scale=smoke",
        variant,
        "table.raw_rows=true",
        "table.strong_c2st=true",
        "table.baseline=kl",
        f"hydra.run.dir={run_dir}",
    )
    assert r.code == 0, r.stderr[-3000:]
    assert (run_dir / "teacher/checkpoints").is_dir()
    assert (run_dir / "runs/kl_seed0/checkpoints").is_dir()
    abl = OmegaConf.load(run_dir / "runs/abl_seed0/config.yaml")
    assert abl.distill.ema_clock == "student_updates" and abl.optim.grad_clip == 10
    res = json.loads((run_dir / "results.json").read_text())
    # Heun 2 steps, DPM-Solver++ at 1 and 2 NFE, two students with and without EMA
    assert [x["nfe"] for x in res] == [3, 1, 2, 1, 1, 1, 1]
    assert [x["key"] for x in res[3:]] == ["kl", "kl_raw", "abl", "abl_raw"]
    assert all(x["train_s"] > 0 for x in res[3:]) and res[0]["train_s"] is None
    assert all(0 <= x["c2st_pixels_strong_samples"] <= 1 for x in res)
    labels = [x["label"] for x in res]
    assert labels[2] in (
        "teacher, DPM-Solver++(2M), sigma_min 0.002",
        "teacher, DPM-Solver++(2M), sigma_min 0.5",
    )
    assert all(np.isfinite(x["fd"]) and x["fd"] >= 0 for x in res)
    assert all(
        0 <= x["c2st_pixels_samples"] <= 1 and 0 <= x["recall_pixels_samples"] <= 1 for x in res
    )
    summary = (run_dir / "fdistill_digits_summary.md").read_text()
    assert "student, forward-KL" in summary and "1.92" in summary  # the paper's FID
    assert "| training images (floor) |" in summary and "C2ST pixels (2x boosting)" in summary
    assert "student, forward-KL, no EMA" in summary
    paired = (run_dir / "fdistill_digits_paired.md").read_text()
    assert "ΔC2ST pixels (2x boosting)" in paired and "distill.ema_clock=student_updates" in paired


def test_fdistill_digits_refuses_a_teacher_of_other_data_before_compute(tmp_path):
    """table.teacher=<a 2-D toy run>: one line naming table.teacher, nothing trained. The
    table reads the teacher's config.yaml (experiments.tables.common.check_digits_run):
    the run is the config.yaml that ``experiments.train experiment=toy_dsm`` writes."""
    toy_run = tmp_path / "toy_dsm"
    toy_run.mkdir()
    OmegaConf.save(compose_train(["experiment=toy_dsm"]), toy_run / "config.yaml", resolve=True)
    run_dir = tmp_path / "run"
    r = run_inprocess(
        "reproduce",
        "table=fdistill_digits",
        "table.scale=smoke",
        f"table.teacher={toy_run}",
        f"hydra.run.dir={run_dir}",
    )
    assert r.code == 2, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"error: table.teacher={toy_run}: a run of data=toy" in r.stderr, r.stderr
    assert not (run_dir / "runs").exists()


@pytest.mark.parametrize(
    "variants, match",
    [
        ([{"name": "kl", "divergence": "kl", "overrides": []}], r"variants\[0\]\.name must be"),
        ([{"name": "Bad name", "divergence": "kl", "overrides": []}], r"variants\[0\]\.name"),
        ([{"name": "a", "divergence": "kl"}], r"variants\[0\] must have the keys"),
        ([{"name": "a", "divergence": "tv", "overrides": []}], r"variants\[0\]\.divergence"),
        ([{"name": "a", "divergence": "kl", "overrides": "x=1"}], r"variants\[0\]\.overrides"),
        (
            [{"name": "a", "divergence": "kl", "overrides": []}] * 2,
            r"variants\[1\]\.name must be a new",
        ),
    ],
)
def test_fdistill_digits_refuses_a_bad_variant(variants, match):
    """Each ``table.variants`` entry is checked before anything runs, naming its index."""
    from experiments.tables.fdistill_digits import _settings, students

    cfg = OmegaConf.load(CONFIG_DIR / "table" / "fdistill_digits.yaml")
    cfg.variants = [{"name": "kl_refine", "divergence": "kl", "overrides": ["x=1"]}]
    assert [s[0] for s in students(_settings(cfg))] == [*cfg.divergences, "kl_refine"]
    cfg.variants = variants
    with pytest.raises(ValueError, match=match):
        _settings(cfg)


def test_the_paper_ordering_against_welch_written_out():
    """``paper_ordering``: the sign (positive = better than reverse-KL, lower or higher
    better), Welch's p against the statistic and Welch-Satterthwaite degrees of freedom
    written out with the t distribution's tail, and the verdicts."""
    from scipy import stats

    from experiments.tables.fdistill_digits import paper_ordering

    rkl = [0.80, 0.82, 0.84]
    kl = [0.60, 0.61, 0.65]  # clearly lower (better C2ST)
    js = [0.79, 0.85, 0.81]  # within the spread
    out = paper_ordering({"rkl": rkl, "kl": kl, "js": js, "sf": [0.5, 0.5]}, True)
    assert set(out) == {"kl", "js"}  # sf is not a teacher-mass divergence
    a, b = np.array(kl), np.array(rkl)
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    t = (a.mean() - b.mean()) / np.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    p = 2 * stats.t.sf(abs(t), dof)
    diff, p_kl, verdict = out["kl"]
    assert diff == pytest.approx(b.mean() - a.mean()) and diff > 0
    assert p_kl == pytest.approx(p, rel=1e-9) and verdict == "better"
    assert out["js"][2] == "within the seeds' spread" and out["js"][1] > 0.05
    # recall: higher is better, so a lower kl is worse
    assert paper_ordering({"rkl": rkl, "kl": kl}, False)["kl"][2] == "worse"
    with pytest.raises(ValueError, match="reverse-KL"):
        paper_ordering({"kl": kl}, True)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paper_ordering({"rkl": rkl, "kl": [0.6]}, True)


def test_the_digits_report_means_over_seeds_a_floor_row_and_the_ordering(tmp_path):
    """``report`` on made-up rows of 2 seeds: a ``mean ± std`` cell per metric, FD over the
    teacher's, the floor row from the first row's floors, the paper's columns, and a note of
    the ordering per metric naming the verdicts."""
    from experiments.tables.fdistill_digits import report

    def row(label, nfe, key, seed, c2st):
        return {
            "label": label,
            "nfe": nfe,
            "key": key,
            "seed": seed,
            "fd": 2.0 + seed if key == "teacher_35" else 4.0 + seed + (key == "kl") * 0.1,
            "c2st_pixels_samples": c2st,
            "c2st_features_samples": 0.5,
            "recall_pixels_samples": 0.8 + 0.01 * seed,
            "recall_features_samples": 0.9,
            "mem_copy_rate": 0.0,
            "fd_floor": 1.0,
            "c2st_pixels_floor": 0.49 + 0.02 * seed,
            "c2st_features_floor": 0.5,
            "recall_pixels_floor": 0.89,
            "recall_features_floor": 0.9,
            "mem_reference_copy_rate": 0.0,
        }

    results = []
    for seed in (0, 1):
        results.append(row("teacher, Heun", 35, "teacher_35", seed, 0.55))
        results.append(row("student, reverse-KL", 1, "rkl", seed, 0.90 + 0.001 * seed))
        results.append(row("student, forward-KL", 1, "kl", seed, 0.70 + 0.001 * seed))
        results.append(row("student, forward-KL, x=1", 2, "kl_x", seed, 0.60))
    tc = OmegaConf.create(
        {
            "teacher": "t",
            "seeds": [0, 1],
            "overrides": [],
            "variants": [{"name": "kl_x", "divergence": "kl", "overrides": ["x=1"]}],
            "few_step_nfe": [2],
            "few_step_sigma_min": [0.5],
            "samples": 100,
        }
    )
    (tmp_path / "run_info.json").write_text('{"launches": [{"git": {"commit": "abc1234"}}]}')
    out = report(results, tc, tmp_path, tmp_path / "f.png", {}, tmp_path)
    (table,) = out["tables"]
    rows = {r[0]: dict(zip(table["columns"], r, strict=True)) for r in table["rows"]}
    assert rows["teacher, Heun"]["FD (digits classifier)"] == "2.5 ± 0.5"
    assert rows["student, forward-KL"]["FD / teacher-35 FD"] == pytest.approx(4.6 / 2.5)
    assert rows["student, forward-KL"]["CIFAR-10 FID (paper)"] == 1.92
    assert rows["student, reverse-KL"]["CIFAR-10 recall (paper)"] == 0.60
    assert rows["training images (floor)"]["C2ST pixels"] == "0.5 ± 0.01"
    notes = " ".join(out["notes"])
    assert "by pixel C2ST" in notes and "forward-KL better (+0.2, p " in notes
    assert "by FD" in notes and "forward-KL within the seeds' spread (-0.1, p " in notes
    assert "by pixel recall" in notes and "forward-KL within the seeds' spread (+0, p 1)" in notes
    # a variant is its own row, outside the ordering and the best of the divergences' rows
    assert rows["student, forward-KL, x=1"]["NFE"] == 2
    assert rows["student, forward-KL, x=1"]["CIFAR-10 FID (paper)"] is None
    assert "Best student by pixel C2ST: forward-KL, pixel C2ST 0.70" in notes
    assert "pixel recall 0.805 = 1.00x the teacher's 0.805 at 35 NFE" in notes
    assert "student, forward-KL, x=1 (2 NFE): pixel C2ST 0.600 (target <= 0.65)" in notes
    # the power note: the paper's FID gap rkl -> kl, (2.13 - 1.92) / 2.13 of reverse-KL's
    # mean FD here (4.5), against the pooled spread over the 2 seeds (both 4 -> 5: 0.707)
    from scorelib.metrics import seeds_needed  # the power note's reference, this check only

    n_fd = seeds_needed((2.13 - 1.92) / 2.13 * 4.5, np.sqrt(0.5))
    assert 10 < n_fd < 100 and f"FD: forward-KL {n_fd}" in notes
    # recall: the paper's gap (0.62 - 0.60) / 0.60 of 0.805, the same tiny spread for both
    n_recall = seeds_needed((0.62 - 0.60) / 0.60 * 0.805, np.sqrt(0.5) * 0.01)
    assert f"pixel recall: forward-KL {n_recall}" in notes


def test_the_ablation_table_composes_every_student():
    """table=fdistill_ablation: every factor's student config composes with its override
    and builds its DistillConfig (no teacher needed), paired with the preset."""
    # the table's and the distillation's config code, as the tests above import theirs
    from experiments.runs.distill import distill_config
    from experiments.tables import fdistill_digits as table
    from scorelib.processes import EDM

    tc = table._settings(OmegaConf.load(CONFIG_DIR / "table/fdistill_ablation.yaml"))
    assert tc.baseline == "kl" and tc.raw_rows and tc.strong_c2st
    names = {}
    for name, d, extra in table.students(tc):
        cfg = table.student_config(tc, d, 0, Path("teacher"), extra)
        names[name] = distill_config(cfg, EDM())
        assert cfg.teacher.run_dir == "teacher" and cfg.distill.divergence == "kl"
    assert names["kl"].ema_clock == "steps" and names["kl"].gan_weight == 0.2
    together = names["together"]
    assert together.ema_clock == "student_updates" and together.gan_weight == 1e-3
    assert together.sigma_min == 0.05
