"""End to end: ``python -m experiments.reproduce table=qcsbm table.scale=smoke`` (the same
digits model trained with and without the quasi-conservative penalty; Jacobian asymmetry,
two-sample test, recall and bits/dim; writer, figure) and its one-line refusals."""

import math

import pytest
from entry_helpers import assert_table_refused, smoke_table
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow


def test_qcsbm_smoke(tmp_path):
    run_dir = tmp_path / "run"
    _, res = smoke_table("qcsbm", ("summary", "paired", "asymmetry"), run_dir)
    assert OmegaConf.load(run_dir / "runs/qc_1_seed0/config.yaml").penalty.weight == 1.0
    assert OmegaConf.load(run_dir / "runs/none_seed0/config.yaml").get("penalty") is None
    # the fine-tuned runs start from the base model; the control has no penalty
    ft = OmegaConf.load(run_dir / "runs/ft_qc_1_seed0/config.yaml")
    assert ft.penalty.weight == 1.0 and ft.trainer.steps == 4
    assert ft.init_from == str(run_dir / "runs/none_seed0")
    assert OmegaConf.load(run_dir / "runs/ft_none_seed0/config.yaml").get("penalty") is None
    assert [x["label"] for x in res] == [
        "no penalty",
        "no penalty, fine-tuned",
        "QC fine-tuned, weight 1",
        "QC from scratch, weight 1",
    ]
    assert [x["control"] for x in res] == [None, None, "no penalty, fine-tuned", "no penalty"]
    for x in res:
        a = x["asymmetry"]["0.5"]
        assert 0 <= a["relative"] <= 1 and a["asymmetry"] >= 0 and a["frobenius"] > 0
        assert math.isfinite(x["bpd"]) and x["bpd_uniform"] == pytest.approx(math.log2(17))
        assert 0 <= x["c2st_pixels_samples"] <= 1 and 0 <= x["recall_pixels_samples"] <= 1
    assert "NAsym at sigma 0.5" in (run_dir / "qcsbm_summary.md").read_text()
    paired = (run_dir / "qcsbm_paired.md").read_text()
    assert "lowers the asymmetry" in paired and "quality not judged (one seed)" in paired


@pytest.mark.parametrize(
    "override,needle",
    [
        ("table.smoke.weights=[0.0]", "table.weights must be a number in (0.0, inf); got 0.0"),
        ("table.smoke.asym_sigmas=[-1.0]", "table.asym_sigmas must be a number in (0.0, inf)"),
        ("table.smoke.asym_examples=400", "table.asym_examples must be an integer in [1, 359]"),
        ("table.smoke.scratch_weights=[-1.0]", "table.scratch_weights must be a number"),
        ("table.smoke.scratch_seeds=[3]", "table.scratch_seeds must be among table.seeds [0]"),
        ("table.smoke.scratch_seeds=[0,0]", "table.scratch_seeds must be distinct"),
        ("table.smoke.weights=[1.0,1.0]", "table.weights must be distinct"),
        ("table.penalty=[penalty.probes=0]", "penalty.probes"),
    ],
)
def test_qcsbm_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path, "qcsbm", override, needle)
