"""End to end: ``python -m experiments.reproduce table=casdm_digits table.scale=smoke`` (the
cascade trained with and without the metric loss, sampled with two blends, the modules read
per noise level; writer, figure), module 1's samples the same in both runs, and the table's
one-line refusals."""

import pytest
from entry_helpers import assert_table_refused, smoke_table
from omegaconf import OmegaConf

from experiments.tables.casdm_digits import verdict

pytestmark = pytest.mark.slow


def test_casdm_digits_smoke(tmp_path):
    run_dir = tmp_path / "run"
    _, res = smoke_table("casdm_digits", ("summary", "modules"), run_dir)
    assert {(r["run"], r["blend"]) for r in res["rows"]} == {
        (k, b) for k in ("mse", "metric") for b in ("first", "snr")
    }
    # module 2's losses never reach module 1 (separate clips, stop-gradient): same samples
    assert res["first_max_diff"] == [0.0]
    mse = OmegaConf.load(run_dir / "runs/mse_seed0/config.yaml")
    met = OmegaConf.load(run_dir / "runs/metric_seed0/config.yaml")
    assert mse.objective.metric == "none" and mse.objective.metric_weight == 0
    assert met.objective.metric == "digits_classifier" and met.objective.metric_weight == 1.0
    assert met.model._target_ == "scorelib.nets.Cascade"
    for e in res["errors"]:
        assert e["gap"] >= 0 and e["first"] > 0 and e["second"] > 0


@pytest.mark.parametrize(
    "override,needle",
    [
        ("table.smoke.blends=[snr]", "table.blends must hold 'first' (the baseline)"),
        ("table.metric_weight=0", "table.metric_weight must be a number in (0.0"),
        ("table.metric=lpips", "objective.metric_weights must be the LPIPS .npz"),
        ("table.metric=sharpness", "objective.metric must be one of"),
    ],
)
def test_casdm_digits_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path, "casdm_digits", override, needle)


def test_verdict_reads_each_seed():
    def rows(*c2st):
        return [{"seed": s, "c2st_pixels_samples": c} for s, c in enumerate(c2st)]

    assert verdict(rows(0.5), rows(0.5)) == "no difference"
    assert verdict(rows(0.4), rows(0.5)) == "better (one seed)"
    assert verdict(rows(0.4, 0.3), rows(0.5, 0.5)) == "better in every seed"
    assert verdict(rows(0.6, 0.7), rows(0.5, 0.5)) == "worse in every seed"
    assert verdict(rows(0.6, 0.3), rows(0.5, 0.5)) == "mixed"
