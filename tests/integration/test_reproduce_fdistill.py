"""End to end: ``python -m experiments.reproduce table=fdistill_gmm table.scale=smoke``
(students through experiments.distill, mode statistics, energy distance, writer, figure)."""

import json

import numpy as np
import pytest
from compose_train import compose_train
from entry_helpers import run_inprocess
from omegaconf import OmegaConf

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
    divergence), the teacher at a few NFE, FD and memorisation for each row, the paper's
    column."""
    run_dir = tmp_path / "run"
    r = run_inprocess(
        "reproduce", "table=fdistill_digits", "table.scale=smoke", f"hydra.run.dir={run_dir}"
    )
    assert r.code == 0, r.stderr[-3000:]
    assert (run_dir / "teacher/checkpoints").is_dir()
    assert (run_dir / "runs/kl/checkpoints").is_dir()
    res = json.loads((run_dir / "results.json").read_text())
    # Heun 2 steps, DPM-Solver++ at 1 and 2 NFE, the student
    assert [x["nfe"] for x in res] == [3, 1, 2, 1]
    labels = [x["label"] for x in res]
    assert labels[2] in (
        "teacher, DPM-Solver++(2M), sigma_min 0.002",
        "teacher, DPM-Solver++(2M), sigma_min 0.5",
    )
    assert all(np.isfinite(x["fd"]) and x["fd"] >= 0 for x in res)
    summary = (run_dir / "fdistill_digits_summary.md").read_text()
    assert "student, forward-KL" in summary and "1.92" in summary  # the paper's FID


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
