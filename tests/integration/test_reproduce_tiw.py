"""End to end: ``python -m experiments.reproduce table=tiw_digits table.scale=smoke`` (the
biased digits written as .npz, the reference-vs-biased classifier, DSM, TIW-DSM and IW-DSM
on the biased set, DSM on the unbiased split; writer, figure) and its one-line refusals."""

import numpy as np
import pytest
from entry_helpers import assert_table_refused, smoke_table
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow


def test_tiw_digits_smoke(tmp_path):
    run_dir = tmp_path / "run"
    _, res = smoke_table("tiw_digits", ("summary", "ratio"), run_dir)
    assert {r["model"] for r in res["rows"]} == {"dsm", "tiw", "iw", "unbiased"}
    # the bias: class 8 keeps 10% of its examples outside the 100 reference ones
    with np.load(run_dir / "data/train.npz") as f:
        labels = f["labels"]
    with np.load(run_dir / "data/classifier.npz") as f:
        ref = f["labels"]
    assert ref.sum() == 100 == res["n_reference"] and len(labels) == 100 + res["n_biased"]
    biased_eights = int(np.sum(labels[ref == 0] == 8))
    assert 10 <= biased_eights <= 16  # about 10% of the ~130 eights left after the reference
    cfg = OmegaConf.load(run_dir / "runs/tiw_seed0/config.yaml")
    assert cfg.objective._target_ == "scorelib.objectives.TIWLoss" and cfg.objective.mode == "tiw"
    assert cfg.objective.prior_log_odds == pytest.approx(np.log(100 / res["n_biased"]))
    assert OmegaConf.load(run_dir / "runs/iw_seed0/config.yaml").objective.mode == "iw"
    for r in res["rows"]:
        assert 0.0 <= r["minority_share"] <= 1.0 and 0.0 <= r["class_tv"] <= 1.0
    # the exact class-level ratios: class 8's share of the unbiased split over its share of
    # the training set, and the same for the others
    k = np.load(run_dir / "data/train.npz")["labels"]
    q8 = np.mean(k == 8)
    for r in res["ratios"]:
        assert r["exact_minority"] == pytest.approx(139 / 1438 / q8)  # 139 eights of 1438
        assert r["exact_minority"] > 4 and 0.0 < r["ess"] <= 1.0


@pytest.mark.parametrize(
    "override,needle",
    [
        ("table.minority=10", "table.minority must be an integer in [0, 9]"),
        ("table.keep=1.0", "table.keep must be a number in (0.0, 1.0)"),
        ("table.n_reference=0", "table.n_reference must be an integer in [1, 719]"),
    ],
)
def test_tiw_digits_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path, "tiw_digits", override, needle)
