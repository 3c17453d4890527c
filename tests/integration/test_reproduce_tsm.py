"""End to end: ``python -m experiments.reproduce table=tsm_low_noise table.scale=smoke``
(target, objectives, training, sampler, metrics, writer) through the command's ``main()``,
and configuration errors (a bad field, no ``table=``) reported as one line with exit status 2
through the real command line."""

import json

import pytest
from doc_pages import ROOT
from entry_helpers import reproduce, run_inprocess

pytestmark = pytest.mark.slow


def test_tsm_low_noise_smoke(tmp_path):
    run_dir = tmp_path / "run"
    smoke = ("table=tsm_low_noise", "table.scale=smoke", f"hydra.run.dir={run_dir}")
    p = run_inprocess("reproduce", *smoke)
    assert p.code == 0, p.stderr[-3000:]
    stems = ["label_variance", "score_error", "summary", "samples"]
    for stem in stems:
        for ext in (".md", ".csv", ".tex"):
            assert (run_dir / f"tsm_low_noise_{stem}{ext}").is_file(), (stem, ext)
    assert (run_dir / "figure.png").stat().st_size > 10_000
    md = (run_dir / "tsm_low_noise.md").read_text()
    for needle in (
        "table=tsm_low_noise table.scale=smoke",
        "Seeds: 0, 1",
        "DSM label",
        "TSM label",
        "gaussian_optimal",
        "exact samples (reference)",
        "paper",
    ):
        assert needle in md, needle
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["seeds"] == [0, 1] and meta["config"]["name"] == "tsm_low_noise"
    res = json.loads((run_dir / "results.json").read_text())["results"]
    assert set(res) == {"gmm1d"}  # the smoke scale's target
    for r in res.values():
        # the measured label variances show the known shape even at smoke size
        v = r["variance"]
        assert v["DSM label"]["mean"][0] > 1e4 * v["TSM label"]["mean"][0]  # sigma = 1e-3
        assert v["DSM label"]["mean"][-1] < v["TSM label"]["mean"][-1]  # sigma = 10
        for k in r["objectives"]:
            assert len(r["error"][k]) == 2 and len(r["error"][k][0]) == len(r["sigmas"])
        # every objective behind one of the two networks; the modes' kappa scale is the
        # target's Fisher scale (below its RMS std)
        assert r["precond"]["dsm_fisher"] == "fisher" and r["precond"]["dsm"] == "edm"
        assert r["sigma_fisher"] < r["sigma_data"]
    summary = (run_dir / "tsm_low_noise_summary.md").read_text()
    assert "Fisher-scaled network, one weight for all" in summary
    # running the same command again reuses the per-target results
    p = run_inprocess("reproduce", *smoke)
    assert p.code == 0 and p.stdout.count("reusing") == 1, p.stdout[-2000:]


def test_tsm_low_noise_bad_config_is_one_line(tmp_path):
    p = reproduce(
        "table=tsm_low_noise",
        "table.sigmas=[1.0e-5,1.0]",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=120,
    )
    assert p.code == 2
    assert "error: table.sigmas: 1e-05 is outside the VE-frame range" in p.stderr


def test_reproduce_without_a_table_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    p = reproduce(f"hydra.run.dir={run_dir}", timeout=120)
    assert p.code == 2
    tables = sorted(f.stem for f in (ROOT / "configs/table").glob("*.yaml"))
    assert {"cfdm", "fdistill_digits", "msma", "rdmc", "tsm_low_noise"} <= set(tables)
    want = f"error: table= is required; choose one of: {', '.join(tables)}"
    assert p.stderr.strip().splitlines() == [want]  # every name: the line is not shortened
    assert not run_dir.exists()  # nothing left behind
