"""End to end: ``python -m experiments.reproduce table=rdmc table.scale=smoke`` (rdMC through
the sampler driver on a mixture and a many-well, ULA/MALA at the same gradient count, mode
masses, energy distance, writer, figure) and its one-line refusals."""

import json

import pytest
from entry_helpers import run_inprocess

pytestmark = pytest.mark.slow


def test_rdmc_smoke(tmp_path):
    run_dir = tmp_path / "run"
    r = run_inprocess("reproduce", "table=rdmc", "table.scale=smoke", f"hydra.run.dir={run_dir}")
    assert r.code == 0, r.stderr[-3000:]
    for stem in ("summary", "mass"):
        for ext in (".md", ".csv", ".tex"):
            assert (run_dir / f"rdmc_{stem}{ext}").is_file(), (stem, ext)
    assert (run_dir / "figure.png").stat().st_size > 5_000
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert "table=rdmc" in meta["command"] and meta["git"]
    res = json.loads((run_dir / "results.json").read_text())
    assert set(res) == {"gmm4", "manywell4"}
    for rows in res.values():
        rdmc = rows["rdMC (MALA inner, importance start)"][0]
        # 4 outer steps x 2 chains x (2 MALA steps + 1); 8 proposals per query on top
        assert (rdmc["grad"], rdmc["density"]) == (24, 4 * (2 * 3 + 8))
        assert rows["ULA"][0]["grad"] == rows["MALA"][0]["grad"] == 24
        assert rows["MALA (2x budget)"][0]["grad"] == 48
        assert rows["exact samples"][0]["tv"] < 0.5 and rows["exact samples"][0]["energy"] >= 0
        assert len(rows["exact samples"][0]["weights"]) == 4
        oracle = rows["reverse OU with the exact score (no estimation error)"][0]
        assert oracle["grad"] is None and oracle["nonfinite"] == 0
    summary = (run_dir / "rdmc_summary.md").read_text()
    assert "greatly improves" in summary and "exact samples" in summary


def test_rdmc_refuses_bad_settings_in_one_line(tmp_path):
    for override, needle in [
        ("table.inner.step_size=3.0", "score.step_size must be a number in (0.0, 2.0)"),
        ("table.targets.gmm4.target.stds=[0.5,0.5,0.5,-1.0]", "target.stds must be"),
        ("table.smoke.samples=5", "table.samples must be an integer >= 10"),
    ]:
        r = run_inprocess(
            "reproduce",
            "table=rdmc",
            "table.scale=smoke",
            override,
            f"hydra.run.dir={tmp_path / 'run'}",
        )
        assert r.code != 0, override
        assert needle in r.stderr + r.stdout, (override, r.stderr[-1500:])
