"""Every error a user can cause exits with status 2 and one line naming the field, Hydra's
own errors included, and leaves no directory behind.

The commands run in-process through each module's ``main()`` (the same code path as
``python -m``, without a JAX start-up per command); a few run as real subprocesses too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from entry_helpers import run, run_inprocess
from omegaconf import OmegaConf

from experiments.common import CONFIG_DIR
from experiments.reproduce import table_names

T, S, E, R = "train", "sample", "evaluate", "reproduce"

# (module, overrides, what the line must name). {run} is a trained run, {missing} a
# directory that does not exist, {npz} a .npz without a `samples` array.
BAD_COMMANDS = [
    # experiments.reproduce goes through the same one-line reporting
    (R, [], "table= is required; choose one of"),
    (R, ["table=tsm_low_nois"], "table must be one of"),
    (R, ["table=tsm_low_noise", "table.foo=1"], "table.foo"),
    (R, ["table=tsm_low_noise", "+table.foo=1"], "table.foo is not a field of table=tsm_low_noise"),
    # a scalar where a table setting is a list (issue 39, item 3; every table: below)
    (
        R,
        ["table=qcsbm", "table.weights=0.5"],
        "table.weights must be a list (as its default, [1.6e-06, 0.00016, 0.0016, 0.016]); got 0.5",
    ),
    (
        R,
        ["table=sure", "table.noise_levels=0.2"],
        "table.noise_levels must be a list (as its default, [0.2, 0.5]); got 0.2",
    ),
    (
        R,
        ["table=msma", "table.seeds=0"],
        "table.seeds must be a list (as its default, [0, 1, 2]); got 0",
    ),
    (R, ["table=msma", "table.shifts=[1,0]"], "table.shifts[0] must be a list; got 1"),
    (R, ["table=msma", "table.smoke.seeds=0"], "table.smoke.seeds must be a list"),
    (
        R,
        ["table=cfdm", "table.sampler=3"],
        "table.sampler must be a mapping (as its default, {T: 0.95, S: 100}); got 3",
    ),
    (T, ["trainer.ema_decay=1.5"], "trainer.ema_decay must be a number in [0.0, 1.0)"),
    (
        T,
        ["trainer.matmul_precision=tf32"],
        "trainer.matmul_precision must be one of ['highest', 'tensorfloat32', 'bfloat16']",
    ),
    # Hydra's own: group options, fields, types, syntax, mandatory values
    (T, ["process=vpp"], "process must be one of ['custom', 'edm', 'ou', 'subvp', 've', 'vp']"),
    (T, ["proces=vp"], "did you mean process?"),
    (T, ["sampler.steps=ten"], "sampler.steps must be an integer; got 'ten'"),
    (T, ["sampler.steps=[1,"], "sampler.steps=[1,"),
    (T, ["experiment=nope"], "digits_edm"),  # the presets are listed
    (T, ["sampler=nope"], "sampler must be one of"),
    (T, ["model=mlp", "model.channels=3"], "model.channels is not a field of model=mlp"),
    (T, ["model.channels=3"], "model.channels is not a field of model=local_mlp"),
    (T, ["experiment=toy_dsm", "model=unet"], "model.width is not a field of model=unet"),
    (T, ["data=digits", "data.toy=moons"], "data.toy is not a field of data=digits"),
    (T, ["trainer.ema_decay=high"], "trainer.ema_decay must be a number or null; got 'high'"),
    (S, [], "run_dir is required"),
    (E, [], "run_dir is required"),
    # no silent options: sampler, grid, objective and model options that do not apply
    # a field added with + that its node's schema does not have (Hydra force-adds it)
    (T, ["+trainer.stpes=5"], "trainer.stpes is not a field of trainer"),
    (T, ["+optim.lrr=1"], "optim.lrr is not a field of optim"),
    (T, ["+data.dequantize=true"], "did you mean dequantise?"),
    # SURE-Score: noisy data with a noise level > 0, and the objective only on noisy data
    (T, ["objective=sure"], "objective.sigma_n: scorelib.objectives.SURE learns from noisy"),
    (T, ["data.noise_sigma=0"], "data.noise_sigma must be a number in (0.0, inf); got 0"),
    (T, ["data.noise_sigma=0.2"], "data.dequantise must be false with data.noise_sigma"),
    (T, ["experiment=toy_dsm", "data.noise_sigma=0.2"], "data.noise_sigma is not a field of"),
    (T, ["+sampler.stepz=10"], "did you mean steps?"),
    # Cas-DM: its network and loss together, the metric's options only where they apply
    (T, ["experiment=casdm_digits", "model=local_digits"], "model: objective=cascade trains"),
    (T, ["experiment=casdm_digits", "objective=edm_digits"], "objective: model=cascade_digits"),
    (
        T,
        ["experiment=casdm_digits", "objective.metric_weights=w.npz"],
        "objective.metric_weights is used only with objective.metric=lpips",
    ),
    (T, ["experiment=casdm_digits", "model.blend=avg"], "model.blend must be one of"),
    (T, ["experiment=casdm_digits", "data=mnist"], "objective.metric: digits_classifier reads"),
    (
        T,
        ["experiment=casdm_digits", "objective.metric=lpips", "objective.metric_weights=w.npz"],
        "objective.metric: lpips (VGG16, four 2x2 poolings) needs images of at least 16",
    ),
    (
        T,
        ["experiment=toy_dsm", "sampler=dpmpp_2m", "sampler.S_churn=40"],
        "sampler.S_churn is not an option of sampler=dpmpp_2m",
    ),
    (
        T,
        ["sampler.grid=log_snr", "sampler.rho=3", "sampler.sigma_min=0.05"],
        "sampler.rho, sampler.sigma_min are not options of grid log_snr",
    ),
    (
        T,
        ["sampler=euler_maruyama", "sampler.sigma_min=null", "sampler.sigma_max=10"],
        "sampler.sigma_max is not an option of grid uniform_t",
    ),
    # the digits preset's sigma_min (0.1) on a sampler whose grid has none
    (T, ["sampler=euler_maruyama"], "sampler.sigma_min is not an option of grid uniform_t"),
    (T, ["+sampler.foo=1"], "sampler.foo is not an option of sampler=heun"),
    (T, ["sampler.name=pc"], "sampler.name cannot change sampler=heun"),
    (T, ["sampler=run"], "sampler=run"),
    (
        T,
        ["experiment=tsm_gmm", "objective.kappa=tsm", "objective.sigma_switch=0.1"],
        "objective.sigma_switch is used only with objective.kappa=switch",
    ),
    (T, ["model=mlp", "+model.foo=1"], "model.foo is not a field of model=mlp"),
    (
        T,
        ["model=mlp", "model._target_=mypackage.Net"],
        "model._target_: model=mlp builds scorelib.nets.MLP",
    ),
    (
        T,
        ["model._target_=mypackage.Net"],
        "model._target_: model=local_mlp builds scorelib.nets.LocalMLP",
    ),
    (T, ["model=custom"], "model._target_ must name your class"),
    (T, ["model=custom", "model._target_=nope.Net"], "No module named 'nope'"),
    (
        T,
        ["model=custom", "model._target_=scorelib.nets"],
        "model._target_ must be an importable class or function; got 'scorelib.nets', a module",
    ),
    (
        T,
        ["process=custom", "process._target_=scorelib.processes.VP", "+process.foo=3"],
        "process.foo is not an argument of scorelib.processes.VP",
    ),
    (T, ["objective=tsm"], "objective.target"),
    (T, ["objective=smoothed", "objective.M=0"], "objective.M must be an integer >= 1"),
    (T, ["objective=smoothed", "objective.sigma_s=-1"], "objective.sigma_s"),
    (
        T,
        ["objective=smoothed", "objective.estimator=exact", "objective.k=3"],
        "objective.k must be null with objective.estimator=exact",
    ),
    (T, ["objective=smoothed", "objective.k=5000"], "objective.k"),
    (T, ["objective=smoothed", "+objective.foo=1"], "objective.foo"),
    (T, ["experiment=toy_dsm", "objective=smoothed"], "objective.train"),
    # values out of range (before anything is compiled)
    (T, ["sampler.steps=0"], "sampler.steps"),
    (T, ["model.sigma_local=0"], "model.sigma_local must be a number in (0.0, inf)"),
    (T, ["model.radius=-1"], "model.radius must be an integer >= 0"),
    (T, ["experiment=toy_dsm", "model=local_mlp"], "a local network needs image data"),
    (T, ["process.sigma_min=-1"], "process.sigma_min"),
    (T, ["process.sigma_min=100"], "process.sigma_max"),
    (T, ["experiment=toy_dsm", "process.beta_min=-1"], "process.beta_min"),
    (T, ["sampler.rho=0"], "sampler.rho"),
    (T, ["sampler.num_samples=0"], "sampler.num_samples must be an integer >= 1"),
    (T, ["trainer.batch_size=0"], "trainer.batch_size"),
    (T, ["trainer.seed=-1"], "trainer.seed must be an integer >= 0; got -1"),
    (T, ["trainer.keep_every=0"], "trainer.keep_every must be an integer >= 1"),
    (T, ["data.sigma_data=-1"], "data.sigma_data must be a number in (0.0, inf); got -1.0"),
    (T, ["optim.lr=-1"], "optim.lr"),
    (T, ["data=npz", "data.path=/nonexistent/images.npz"], "/nonexistent/images.npz"),
    (T, ["data=npz"], "data.path"),
    (T, ["init_from={missing}"], "init_from="),
    (T, ["experiment=toy_dsm", "model.width=64", "init_from={run}"], "model.width"),
    # sample and evaluate
    (S, ["run_dir={missing}"], "config.yaml: not found; run_dir must be a training run"),
    (E, ["run_dir={missing}"], "config.yaml: not found; run_dir must be a training run"),
    (
        S,
        ["run_dir={run}", "sampler.snr=0.1"],
        "sampler.snr is not an option of sampler=euler_maruyama, the run's sampler",
    ),
    (
        S,
        ["run_dir={run}", "sampler=heun", "sampler.snr=0.1"],
        "sampler.snr is not an option of sampler=heun",
    ),
    (S, ["run_dir={run}", "step=7"], "step=7: no such checkpoint"),
    (E, ["run_dir={run}", "samples={npz}"], "must hold an array named 'samples'"),
    (
        E,
        ["run_dir={run}", "sampler.seed=9"],
        "no samples for these arguments; draw them with python -m experiments.sample run_dir=",
    ),
    (E, ["run_dir={run}", "samples={npz}", "sampler.seed=1"], "give one or the other"),
    # bad samples files (issue 39, items 2 and 4): one line naming samples= and the file,
    # before anything is computed (the image cases: test_evaluate_conditional.py)
    (E, ["run_dir={run}", "samples={strings}"], "strings.npz must hold float points [n, 2]"),
    (
        E,
        ["run_dir={run}", "samples={ints}"],
        "must hold float points [n, 2], the data's shape; got dtype int64 with values in [0, 3]",
    ),
    (
        E,
        ["run_dir={run}", "samples={shape3}"],
        "shape3.npz must hold float points [n, 2], the data's shape; got shape (50, 3)",
    ),
    (
        E,
        ["run_dir={run}", "samples={npy}"],
        "array.npy must be a .npz file with an array named 'samples' (numpy.savez(path, "
        "samples=x), as experiments.sample writes); got a .npy array",
    ),
    (
        E,
        ["run_dir={run}", "samples={text}"],
        "text.npz must be a .npz file with an array named 'samples' (numpy.savez(path, "
        "samples=x), as experiments.sample writes); got a file that is not a .npz (zip) archive",
    ),
    (E, ["run_dir={run}", "samples={nonfinite}"], "nonfinite.npz: 2 of 50 samples are not finite"),
    # refused before anything is written (issue 21, item 2): the run directory, and the
    # parents a missing run_dir would have made
    (T, ["trainer.nonfinite=ignore"], "trainer.nonfinite must be one of ['stop', 'skip']"),
    (E, ["run_dir={missing}/deeper"], "config.yaml: not found; run_dir must be a training run"),
    (S, ["run_dir={missing}/deeper"], "config.yaml: not found; run_dir must be a training run"),
    # grid fields against the process's range (issue 21, item 3): VP's t_max is 1
    (T, ["experiment=toy_dsm", "sampler.t_max=5"], "sampler.t_max must be <= 1, the time range"),
    (T, ["experiment=toy_dsm", "sampler.t_max=1.5"], "sampler.t_max must be <= 1"),
    (
        T,
        ["experiment=toy_dsm", "sampler=heun", "sampler.sigma_max=200"],
        "sampler.sigma_max must be <= 152.167, the largest noise level of the process (VP",
    ),
    # 600 levels within 2e-5 of each other are not strictly decreasing in float32: the
    # message shows the grid cut, not 600 values
    (
        T,
        ["experiment=toy_dsm", "sampler.t_min=0.9999999", "sampler.steps=600"],
        "use float64=True for finer grids",
    ),
]


@pytest.fixture(scope="module")
def paths(toy_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("errors")
    np.savez(tmp / "no_samples.npz", images=np.zeros((3, 2)))
    points = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
    np.savez(tmp / "strings.npz", samples=np.array(["a", "b"]))
    np.savez(tmp / "ints.npz", samples=np.arange(100).reshape(50, 2) % 4)
    np.savez(tmp / "shape3.npz", samples=np.zeros((50, 3), np.float32))
    np.save(tmp / "array.npy", points)
    (tmp / "text.npz").write_text("x y\n1 2\n")
    np.savez(tmp / "nonfinite.npz", samples=np.where(np.arange(50)[:, None] < 2, np.nan, points))
    files = {k: tmp / f for k, f in [("npy", "array.npy"), ("text", "text.npz")]}
    for k in ("strings", "ints", "shape3", "nonfinite"):
        files[k] = tmp / f"{k}.npz"
    return {
        "run": toy_run,
        "missing": tmp / "no_such_run",
        "npz": tmp / "no_samples.npz",
        **files,
    }


def _ids():
    return [f"{m}:{' '.join(a) or '<none>'}"[:60] for m, a, _ in BAD_COMMANDS]


@pytest.mark.slow
@pytest.mark.parametrize("module, overrides, expected", BAD_COMMANDS, ids=_ids())
def test_bad_command_exits_2_with_one_line_naming_the_field(
    module, overrides, expected, paths, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # any outputs/ would land here
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("SCORELIB_TRACEBACK", raising=False)
    args = [a.format(**paths) for a in overrides]
    if module == T:
        args.append(f"hydra.run.dir={tmp_path / 'run'}")
    before = sorted(p.relative_to(paths["run"]) for p in paths["run"].rglob("*"))
    r = run_inprocess(module, *args)
    assert r.code == 2, (r.code, r.stderr[-3000:])
    assert len(r.err_lines) == 1, r.stderr[-3000:]
    line = r.err_lines[0]
    assert line.startswith("error: ") and expected in line, line
    assert len(line) <= 300 + len("error: "), line
    assert "Traceback" not in r.stderr + r.stdout
    assert sorted(os.listdir(tmp_path)) == [], os.listdir(tmp_path)  # nothing left behind
    assert not paths["missing"].exists()
    after = sorted(p.relative_to(paths["run"]) for p in paths["run"].rglob("*"))
    assert after == before  # nothing written into the trained run


def _a_list_setting(name: str) -> str | None:
    """The first setting of ``configs/table/<name>.yaml`` whose default is a list."""
    conf = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "table" / f"{name}.yaml"))
    return next((k for k, v in conf.items() if isinstance(v, list)), None)


@pytest.mark.parametrize("table", table_names())
def test_every_tables_list_settings_refuse_a_scalar(table, tmp_path, monkeypatch):
    """Each table's list settings are checked against its config file before it runs: a
    scalar is one line naming the field, exit 2, nothing written (issue 39, item 3)."""
    monkeypatch.chdir(tmp_path)
    field = _a_list_setting(table)
    if field is None:
        pytest.skip(f"table={table} has no list setting")
    r = run_inprocess("reproduce", f"table={table}", f"table.{field}=3")
    assert r.code == 2, (r.code, r.stderr[-3000:])
    assert len(r.err_lines) == 1, r.stderr[-3000:]
    assert f"error: table.{field} must be a list (as its default, " in r.err_lines[0]
    assert r.err_lines[0].endswith("; got 3"), r.err_lines[0]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("module", [S, E])
def test_a_training_free_run_is_named_with_the_command_that_draws_it(module, tmp_path, monkeypatch):
    """``run_dir=`` of a training-free run (no config.yaml, no checkpoint) says what it is
    and the command that draws it again, and writes nothing, not even a log in its existing
    ``sample_logs/`` (issue 39, item 5)."""
    monkeypatch.chdir(tmp_path)
    run_dir = Path("outputs/cfdm_moons")
    out = run_dir / "samples" / "cfdm_T0.95_S100_n64_seed0"
    out.mkdir(parents=True)
    (run_dir / "sample_logs" / "experiment-cfdm_moons").mkdir(parents=True)
    command = f"python -m experiments.sample experiment=cfdm_moons run_dir={run_dir}"
    meta = {"score": {"name": "cfdm"}, "title": "cfdm_moons: sigma-CFDM", "command": command}
    (out / "samples.json").write_text(json.dumps(meta))
    before = sorted(run_dir.rglob("*"))
    r = run_inprocess(module, f"run_dir={run_dir}")
    assert r.code == 2 and len(r.err_lines) == 1, r.stderr[-3000:]
    assert r.err_lines[0] == (
        f"error: run_dir={run_dir} is a training-free run (score=cfdm; no config.yaml, no "
        f"checkpoint): draw it again with {command}"
    )
    assert sorted(run_dir.rglob("*")) == before


def test_at_least_25_bad_commands():
    assert len(BAD_COMMANDS) >= 25


@pytest.mark.parametrize(
    "module, overrides, expected",
    [
        (T, ["process=vpp"], "process must be one of"),
        (T, ["sampler.steps=ten"], "sampler.steps must be an integer"),
        (S, [], "run_dir is required"),
        # Hydra logs an ERROR block of its own for an unimportable target: not shown
        (
            T,
            ["model=custom", "model._target_=nope.Net"],
            "model._target_ must be an importable class or function; got 'nope.Net' (",
        ),
    ],
)
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_bad_commands_through_a_real_subprocess(module, overrides, expected, tmp_path):
    r = run(module, *overrides, cwd=tmp_path, check=False, timeout=300)
    assert r.code == 2, r.stderr[-3000:]
    assert len(r.err_lines) == 1 and expected in r.err_lines[0], r.stderr[-3000:]
    assert os.listdir(tmp_path) == []


def test_a_failed_command_with_an_absolute_path_leaves_no_nested_directories(tmp_path):
    # the run directory would be outputs/digits_edm/data.path-/abs/.../x.npz+data-npz
    missing = tmp_path / "elsewhere" / "images.npz"
    r = run("train", "data=npz", f"data.path={missing}", cwd=tmp_path, check=False, timeout=300)
    assert r.code == 2 and len(r.err_lines) == 1 and str(missing) in r.err_lines[0], r.stderr
    assert os.listdir(tmp_path) == [], list(tmp_path.rglob("*"))
