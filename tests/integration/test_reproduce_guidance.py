"""End to end: ``python -m experiments.reproduce table=guidance table.scale=smoke`` (the
mixture's CE and DLSM classifiers against the exact classifier and the samples of each
guidance; a class-conditional digits model, its CE and DLSM classifier runs and the guided
digits of every method; writer, figures) and its one-line refusals before anything is
trained."""

import pytest
from entry_helpers import assert_table_refused, smoke_table
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow

TABLES = ("mixture_gradient", "mixture_samples", "digits", "digits_classifiers")


def test_guidance_smoke(tmp_path):
    run_dir = tmp_path / "run"
    _, res = smoke_table("guidance", TABLES, run_dir)
    for name in ("mixture.png", "grid.png"):
        assert (run_dir / name).stat().st_size > 5_000, name

    # mixture: both classifiers at every level, scored against the exact gradient
    grads = res["mixture_gradient"]
    assert {(g["classifier"], g["sigma"]) for g in grads} == {
        (c, s) for c in ("CE", "DLSM") for s in (0.1, 1.0)
    }
    assert all(g["error"] >= 0 and g["stderr"] > 0 for g in grads)
    rows = {(r["guidance"], r["scale"]): r for r in res["mixture_samples"]}
    assert set(rows) == {
        ("exact conditional", 1.0),
        ("CFG, exact parts", 2.0),
        *((f"classifier guidance, {c} classifier", 2.0) for c in ("exact", "CE", "DLSM")),
    }
    for r in rows.values():
        assert r["num_nonfinite"] == 0 and 0 <= r["accuracy"] <= 1 and 0 <= r["c2st"] <= 1
    # CFG with exact parts at w is exact classifier guidance at s = w: the same field
    cfg, clf = rows[("CFG, exact parts", 2.0)], rows[("classifier guidance, exact classifier", 2.0)]
    assert abs(cfg["accuracy"] - clf["accuracy"]) <= 1.0 / cfg["n"]

    # digits: the conditional model with label dropout, DLSM against that model
    runs = run_dir / "runs"
    model = OmegaConf.load(runs / "cond_seed0/config.yaml")
    assert model.model.num_classes == 10 and model.objective.label_dropout > 0
    dlsm = OmegaConf.load(runs / "dlsm_seed0/config.yaml")
    assert dlsm.objective._target_.endswith("DLSM")
    assert dlsm.score_run == str((runs / "cond_seed0").resolve()) and dlsm.score_step == 20
    assert not (runs / "ce_seed0").exists()  # table.methods has no CE guidance at smoke
    digits = {(r["method"], r["scale"]): r for r in res["digits"]}
    assert set(digits) == {
        ("conditional model, unguided", 1.0),
        *((m, 3.0) for m in ("interval CFG", "TCFG", "DLSM classifier guidance")),
    }
    assert digits[("conditional model, unguided", 1.0)]["guidance"] is None
    assert digits[("interval CFG", 3.0)]["guidance"]["interval"] == [0.28, 1.17]
    assert digits[("TCFG", 3.0)]["guidance"]["filter"] == "tangential"
    assert digits[("DLSM classifier guidance", 3.0)]["guidance"]["classifier"].endswith(
        "dlsm_seed0"
    )
    for r in digits.values():
        assert r["num_nonfinite"] == 0 and r["n"] == 100
        assert 0 <= r["accuracy_samples"] <= 1 and 0 <= r["c2st_pixels_samples"] <= 1
    # committed results hold no machine paths: the runs relative to the table's directory
    assert digits[("TCFG", 3.0)]["model"] == "runs/cond_seed0"
    assert str(tmp_path) not in (run_dir / "results.json").read_text()
    assert [c["classifier"] for c in res["digits_classifiers"]] == ["dlsm"]
    assert "floor" in (run_dir / "guidance_digits.md").read_text()


def _fake_run(tmp_path, num_classes: int, label_dropout: float):
    """A directory with only the config of a digits score run (what the table reads to
    refuse it)."""
    run = tmp_path / "fake_run"
    run.mkdir()
    cfg = {
        "data": {"name": "digits"},
        "model": {"num_classes": num_classes},
        "objective": {"label_dropout": label_dropout},
    }
    OmegaConf.save(OmegaConf.create(cfg), run / "config.yaml")
    return run


@pytest.mark.parametrize(
    "override,needle",
    [
        (
            "table.smoke.cfg_scales=[1.0,3.0]",
            "table.cfg_scales must be scales other than 1 (w = 1 is the reference row",
        ),
        ("table.smoke.seeds=[0,0]", "table.seeds must be distinct integers"),
        ("table.scale=full", "table.scale must be 'small' or 'smoke'; got 'full'"),
        ("table.interval=[2.0,1.0]", "table.interval must be a pair [lo, hi] with lo < hi"),
        ("table.figure_scale=2.0", "table.figure_scale must be a scale of both"),
        ("table.smoke.mixture.cfg_scales=[1.0]", "table.mixture.cfg_scales must be scales"),
        (
            "table.mixture.stds=[0.6,-1.0,0.6]",
            "table.mixture.stds must be 3 positive numbers",
        ),
        ("table.smoke.samples=50", "table.samples must be"),
        ("table.smoke.methods=[cfg,pfg]", "table.methods must be a list of distinct methods"),
        (
            "table.models=[/no/such/run]",
            "table.models[0]=/no/such/run: not an experiments.train run",
        ),
    ],
)
def test_guidance_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path, "guidance", override, needle)


@pytest.mark.parametrize(
    "num_classes,dropout,needle",
    [
        (0, 0.0, "an unconditional run (model.num_classes = 0)"),
        (10, 0.0, "a run whose null label was never trained (objective.label_dropout = 0)"),
    ],
)
def test_guidance_refuses_a_model_without_a_null_label(tmp_path, num_classes, dropout, needle):
    run = _fake_run(tmp_path, num_classes, dropout)
    assert_table_refused(tmp_path / "out", "guidance", f"table.models=[{run}]", needle)


def test_dlsm_score_run_with_override_characters():
    """A table's run directory is named by its overrides (``table.models-[outputs/...]``):
    DLSM's ``score_run`` reaches the classifier's config whole, ``[``, ``]``, ``=``, ``,``
    and a quote included."""
    from experiments.tables.guidance import classifier_config

    for path in ("/r/guidance/table.models-[outputs/digits_edm_cond]/runs/x", "/r/a'b=c,d"):
        cfg = classifier_config(["experiment=digits_classifier_dlsm"], 1, path)
        assert cfg.score_run == path and cfg.trainer.seed == 1
