"""The reproduce app's table writer and dispatcher, and the tsm_low_noise table's pure parts
(settings, report formatting) on a hand-made result. No training here: the end-to-end run
is tests/integration/test_reproduce_tsm.py."""

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments.reproduce import require_table, resolve_runner, table_names
from experiments.tables import common
from experiments.tables import tsm_low_noise as tln

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "table" / "tsm_low_noise.yaml"


def test_fmt_and_pm():
    assert common.fmt(None) == "" and common.fmt(3) == "3" and common.fmt(0.0) == "0"
    assert common.fmt(0.123456) == "0.123" and common.fmt(1.5e-5) == "1.50e-05"
    assert common.fmt(float("nan")) == "nan" and common.fmt(np.float32(2.0)) == "2"
    assert common.fmt(123456.0) == "1.23e+05" and common.fmt(np.int64(7)) == "7"
    assert common.pm(1.23456, 0.01) == "1.23 ± 0.01"


def test_seed_cell_and_check_seeds():
    """The one cell every multi-seed table reports (numpy's population std written out) and
    the one check of ``table.seeds`` every table runs."""
    rows = [{"fd": 2.0}, {"fd": 4.0}, {"fd": 6.0}]
    std = ((4.0 + 0.0 + 4.0) / 3) ** 0.5
    assert common.seed_cell(rows, "fd") == f"4 ± {common.fmt(std, 2)}" == "4 ± 1.6"
    assert common.seed_cell(rows[:1], "fd") == 2.0
    assert common.check_seeds([2, 0, 1]) == [2, 0, 1]
    for bad in ([], [0, 0], [-1], [0.5]):
        with pytest.raises(ValueError, match="table.seeds"):
            common.check_seeds(bad)


def test_write_report_md_csv_tex_metadata(tmp_path):
    result = {
        "tables": [
            {
                "name": "demo",
                "caption": "A demo 100% table_with | pipes.",
                "columns": ["sigma", "value", "note", "paper"],
                "rows": [
                    [1e-3, 0.1234567891, "a|b", None],
                    [10.0, float("nan"), "x_y", "TSM ≪ DSM"],
                ],
            }
        ],
        "notes": ["note one"],
        "seeds": [0, 1, 2],
        "figure": str(tmp_path / "figure.png"),
    }
    cmd = common.command_line(["table=demo", "table.title=a b", "hydra.run.dir=/x=y@z%"])
    assert (
        cmd == "python -m experiments.reproduce table=demo 'table.title=a b' hydra.run.dir=/x=y@z%"
    )
    path = common.write_report(
        tmp_path, "demo_table", result, {"name": "demo"}, command=cmd, wall_s=1.5
    )
    md = path.read_text()
    assert "table.title=a b" in md and "Seeds: 0, 1, 2" in md and "note one" in md
    assert "![figure](figure.png)" in md and "a\\|b" in md
    rows = list(csv.reader(io.StringIO((tmp_path / "demo_table_demo.csv").read_text())))
    assert rows[0] == ["sigma", "value", "note", "paper"]
    assert float(rows[1][1]) == 0.1234567891 and rows[1][3] == "" and rows[2][1] == "nan"
    tex = (tmp_path / "demo_table_demo.tex").read_text()
    assert r"100\% table\_with" in tex and r"x\_y" in tex and r"$\ll$" in tex and r"\toprule" in tex
    assert "Seeds: 0, 1, 2" in tex
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert (
        meta["command"] == cmd and meta["seeds"] == [0, 1, 2] and meta["config"] == {"name": "demo"}
    )
    assert "jax" in meta["versions"] and "commit" in meta["git"] and meta["wall_s"] == 1.5
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        common.write_table(
            tmp_path, "bad", {"columns": ["a", "b"], "rows": [[1]]}, command="", seeds=[]
        )


def test_resolve_runner():
    assert resolve_runner(OmegaConf.create({"name": "tsm_low_noise"})) is tln.run
    assert (
        resolve_runner(
            OmegaConf.create({"name": "x", "runner": "experiments.tables.tsm_low_noise:report"})
        )
        is tln.report
    )
    with pytest.raises(ValueError, match="table.name: no table module 'experiments.tables.nope'"):
        resolve_runner(OmegaConf.create({"name": "nope"}))
    with pytest.raises(ValueError, match="table.name must name a module"):
        resolve_runner(OmegaConf.create({"name": "../etc"}))
    with pytest.raises(ValueError, match="has no function 'missing'"):
        resolve_runner(
            OmegaConf.create({"name": "x", "runner": "experiments.tables.common:missing"})
        )


def test_table_is_required_and_the_choices_are_the_table_configs():
    names = table_names()
    assert names == sorted(p.stem for p in CONFIG.parent.glob("*.yaml"))
    assert "tsm_low_noise" in names and "gaussian_teleport" in names
    with pytest.raises(ValueError, match=r"^table= is required; choose one of: ") as e:
        require_table(OmegaConf.create({}))
    assert str(e.value).endswith(f"choose one of: {', '.join(names)}")  # every one, sorted
    cfg = OmegaConf.create({"table": {"name": "tsm_low_noise"}})
    assert require_table(cfg).name == "tsm_low_noise"


def test_tsm_settings_smoke_merge_and_validation():
    cfg = OmegaConf.load(CONFIG)
    full = tln._settings(cfg)
    assert list(full.run_targets) == ["gmm1d", "gmm10d", "gmm50d", "gmm50d_large", "manywell8d"]
    assert [float(s) for s in full.sigmas][0] == 1e-3 and float(full.sigmas[-1]) == 10.0
    assert isinstance(full.sigmas[0], float)  # not a YAML string
    cfg.scale = "smoke"
    smoke = tln._settings(cfg)
    assert list(smoke.run_targets) == ["gmm1d"] and smoke.train.steps < 100
    assert smoke.train.lr == full.train.lr  # untouched fields survive the merge
    for field, value, msg in [
        ("scale", "huge", "table.scale"),
        ("run_targets", ["nowhere"], "table.run_targets"),
        ("sigmas", [1.0, 0.1], "table.sigmas"),
        ("seeds", [0, 0], "table.seeds"),
    ]:
        bad = OmegaConf.load(CONFIG)
        bad[field] = value
        with pytest.raises(ValueError, match=msg):
            tln._settings(bad)
    bad = OmegaConf.load(CONFIG)
    bad.objectives.switch.precond = "score"
    with pytest.raises(ValueError, match=r"table\.objectives\.switch\.precond must be one of"):
        tln._settings(bad)
    bad = OmegaConf.load(CONFIG)
    bad.controls = ["nothing"]
    with pytest.raises(ValueError, match="table.controls"):
        tln._settings(bad)
    bad = OmegaConf.load(CONFIG)
    bad.sigmas = [1e-4, 1.0]  # below the process's sigma_min = 1e-3
    with pytest.raises(ValueError, match="outside the VE-frame range"):
        tln._process(tln._settings(bad))


def _fake_result(name, dim, objs, sigmas, rng):
    var = {
        k: {"mean": list(rng.uniform(1, 2, len(sigmas))), "se": [0.1] * len(sigmas)} for k in objs
    }
    var["DSM label"] = {"mean": [dim / s**2 for s in sigmas], "se": [0.0] * len(sigmas)}
    var["TSM label"] = {"mean": [s for s in sigmas], "se": [0.0] * len(sigmas)}
    err = {k: rng.uniform(0.1, 1, (3, len(sigmas))).tolist() for k in objs}
    err["tsm"] = (np.full((3, len(sigmas)), 1e-3)).tolist()  # best everywhere
    samples = {
        k: {"energy": [0.1, 0.2, 0.3], "sw2": [1.0, 1.0, 1.0]}
        for k in objs + ["exact score", "exact samples"]
    }
    timings = dict(
        total_s=1,
        cpu_s=1,
        variance_s=0,
        train_total_s=1,
        compile_s=0,
        steps_per_s=1,
        error_s=0,
        samples_s=0,
    )
    return {
        "target": name,
        "dim": dim,
        "sigma_data": 1.0,
        "sigmas": sigmas,
        "objectives": objs,
        "variance": var,
        "error": err,
        "samples": samples,
        "timings": timings,
        "model": {"n_params": 10, "skipped_steps": {k: [0, 0, 0] for k in objs}},
    }


def test_mixture_verdict_ties_within_the_seed_spread():
    """tied when the means differ by at most sqrt(sd_mix^2 + sd_pure^2); controls ignored."""
    r = {
        "objectives": ["dsm", "tsm", "switch", "ctrl"],
        "roles": {"dsm": "pure", "tsm": "pure", "switch": "mixture", "ctrl": "control"},
        "error": {
            "dsm": [[1.0, 1.0], [1.2, 1.2]],  # mean 1.1, sd 0.1
            "tsm": [[5.0, 0.1], [5.0, 0.1]],
            "switch": [[1.05, 0.5], [1.25, 0.5]],  # sigma 0: 1.15 +- 0.1 vs 1.1 +- 0.1: tied
            "ctrl": [[1e-3, 1e-3], [1e-3, 1e-3]],  # a control never wins the verdict
        },
    }
    text, verdict = tln.mixture_verdict(r, 0)
    assert verdict == "tied" and text.startswith("switch 1.15 vs DSM 1.1")
    r["error"]["switch"] = [[1.5, 0.5], [1.5, 0.5]]  # 1.5 +- 0 vs 1.1 +- 0.1: DSM best
    assert tln.mixture_verdict(r, 0)[1] == "DSM best"
    assert tln.mixture_verdict(r, 1)[1] == "TSM best"  # 0.5 vs TSM's 0.1
    r["error"]["switch"] = [[0.5, 0.05], [0.5, 0.05]]
    assert tln.mixture_verdict(r, 1)[1] == "mixture best"
    # one network at a time: behind 'fisher' only switch and ctrl, so no pure objective
    r["precond"] = {"dsm": "edm", "tsm": "edm", "switch": "fisher", "ctrl": "fisher"}
    assert tln.mixture_verdict(r, 1, "fisher") is None and tln.mixture_verdict(r, 1, "edm") is None
    r["precond"]["dsm"] = "fisher"  # switch 0.05 vs DSM 1.1 behind the same network
    assert tln.mixture_verdict(r, 1, "fisher")[1] == "mixture best"
    assert tln.mixture_verdict(r, 1)[1] == "mixture best"  # all networks together
    r["roles"]["switch"] = "control"
    assert tln.mixture_verdict(r, 1) is None


def test_budgets_enlarge_one_target_only():
    tc = tln._settings(OmegaConf.load(CONFIG))
    big = tln.budgeted(tc, "gmm50d_large")
    assert big.model.width == 128 and big.train.steps == 6000
    assert big.train.lr == tc.train.lr and big.model.depth == tc.model.depth
    assert tln.budgeted(tc, "gmm50d") is tc
    bad = OmegaConf.load(CONFIG)
    bad.budgets = {"gmm50d_large": {"sampler": {"steps": 2}}}
    with pytest.raises(
        ValueError, match=r"^table.budgets.gmm50d_large may set model and train only"
    ):
        tln._settings(bad)
    bad.budgets = {"gmm50d_large": {"train": {"steps": "abc"}}}
    with pytest.raises(ValueError, match=r"^table.budgets.gmm50d_large.train.steps must be"):
        tln._settings(bad)
    bad.budgets = {"gmm50d_large": {"model": {"width": 0}}}
    with pytest.raises(ValueError, match=r"^table.budgets.gmm50d_large.model.width must be"):
        tln._settings(bad)
    bad = OmegaConf.load(CONFIG)
    bad.objectives.gaussian_optimal_modes.kappa_sigma_d = "banana"
    with pytest.raises(ValueError, match=r"^table.objectives.gaussian_optimal_modes.kappa_sigma_d"):
        tln._settings(bad)
    bad = OmegaConf.load(CONFIG)
    bad.budgets = {"nowhere": {"train": {"steps": 2}}}
    with pytest.raises(ValueError, match="^table.budgets: 'nowhere' has no entry"):
        tln._settings(bad)


def test_tsm_report_tables_from_a_result(tmp_path):
    rng = np.random.default_rng(0)
    objs = ["dsm", "tsm", "switch"]
    sigmas = [1e-3, 1.0, 10.0]
    res = {
        "g": _fake_result("g", 2, objs, sigmas, rng),
        "m": _fake_result("m", 8, objs, sigmas, rng),
    }
    tc = tln._settings(OmegaConf.load(CONFIG))
    rep = tln.report({"settings": tc, "results": res, "wall_s": 3.0, "cpu_s": 2.0})
    tabs = {t["name"]: t for t in rep["tables"]}
    assert set(tabs) == {"label_variance", "score_error", "summary", "samples"}
    var = tabs["label_variance"]
    assert var["columns"][:6] == ["target", "d", "sigma", "d/sigma^2", "DSM label", "TSM label"]
    assert var["rows"][0][3] == pytest.approx(2 / 1e-6) and len(var["rows"]) == 6
    err = tabs["score_error"]
    assert all(r[-5] == "TSM" for r in err["rows"])  # the 'best' column follows the means
    assert err["rows"][0][3] == "0.001 ± 0" and "paper (expected shape)" in err["columns"]
    # the verdict: the best mixture (switch, errors in [0.1, 1]) against TSM (1e-3, sd 0),
    # all behind EDM's network (no precond recorded); nothing behind the Fisher-scaled one;
    # across both networks, the same as behind EDM's
    assert all(": TSM best (x" in r[-4] and r[-4].startswith("switch ") for r in err["rows"])
    assert all(r[-3] == "" and r[-2] == r[-4] for r in err["rows"])
    summ = tabs["summary"]
    assert summ["rows"][0][2].startswith("3 / -3.00")
    miss = "0 / 3 (not at sigma 0.001, 1, 10)"
    assert summ["rows"][0][-3:] == [miss, "", miss]
    assert [r[1] for r in tabs["samples"]["rows"]][-2:] == [
        "exact score (reference)",
        "exact samples (reference)",
    ]
    assert rep["seeds"] == [0, 1, 2]
    tln.make_figure(res, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000
