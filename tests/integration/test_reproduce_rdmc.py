"""End to end: ``python -m experiments.reproduce table=rdmc table.scale=smoke`` (rdMC through
the sampler driver on a mixture and a many-well, ULA/MALA at the same gradient count, mode
masses, energy distance, writer, figure) and its one-line refusals."""

import pytest
from entry_helpers import run_inprocess, smoke_table

pytestmark = pytest.mark.slow


def test_rdmc_smoke(tmp_path):
    run_dir = tmp_path / "run"
    _, res = smoke_table("rdmc", ("summary", "mass"), run_dir)
    assert set(res) == {"gmm4", "manywell4"}
    for rows in res.values():
        rdmc = rows["rdMC (MALA inner, importance start)"][0]
        # 4 outer steps x 2 chains x (2 MALA steps + 1); 8 proposals per query on top
        assert (rdmc["grad"], rdmc["density"]) == (24, 4 * (2 * 3 + 8))
        assert rows["ULA"][0]["grad"] == rows["MALA"][0]["grad"] == 24
        assert rows["MALA (2x budget)"][0]["grad"] == 48
        # the weighted proposals: no chains, 8 densities per query; the long row (4 x 4,
        # 4 x 4 x 5 = 80 gradients) is beyond the budget the Langevin rows are matched to
        assert (rows["snis"][0]["grad"], rows["snis"][0]["density"]) == (0, 4 * 8)
        assert rows["long"][0]["grad"] == 80
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
