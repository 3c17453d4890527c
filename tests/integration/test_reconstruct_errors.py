"""experiments.reconstruct refuses bad input in one line naming the field, with exit status
2, before anything is computed or written: a measurement file of the wrong shape or of
another operator, operator parameters out of range, a negative sigma_y, ddrm on an
operator without an SVD, unknown methods and options no chosen method uses, image tasks on
flat data, and a run directory that is not a trained score run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from entry_helpers import ROOT, run_inprocess
from omegaconf import OmegaConf

R = "task=inpaint_random"
BAD = [
    # measurements given: y of the wrong shape, or measured by another operator
    ([R, "task.num_images=4", "task.measurements={bad_y}"], "task.measurements="),
    ([R, "task.num_images=4", "task.measurements={bad_y}"], "y is [task.num_images, m] = [4, 16]"),
    ([R, "task.num_images=4", "task.measurements={other_op}"], "measurements of this task's"),
    ([R, "task.measurements={missing}/y.npz"], "task.measurements="),
    # operator parameters out of range
    (["task=inpaint_random", "task.keep=0"], "task.keep must be a number in (0"),
    (["task=inpaint_random", "task.keep=0.001"], "task.keep must be a fraction keeping at least"),
    (["task=cs", "task.m=0"], "task.m must be an integer in [1, 64]"),
    (["task=cs", "task.m=65"], "task.m must be an integer in [1, 64]"),
    (["task=blur", "task.size=9"], "task.size must be an integer in [1, 8]"),
    (["task=blur", "task.std=3"], "task.size must be an odd integer in [1, 8]"),
    (["task=inpaint_box", "task.box=[8,8]"], "task.box must be (h, w) with"),
    (["task=downsample", "task.factor=3"], "task.factor must be an integer dividing H=8"),
    (["task=denoise", "task.sigma_y=-0.1"], "task.sigma_y must be a number in [0"),
    (["task=sensors", "task.sigma_y_points=-1"], "task.sigma_y_points must be a number in [0"),
    (["task=colourise"], "task must be a task for the run's 1-channel images (colourise needs"),
    ([R, "task.draws=1"], "task.draws must be an integer >= 2"),
    ([R, "task.num_images=400"], "task.num_images must be an integer in [1, 359]"),
    # methods
    (
        ["task=sensors", "method.names=[pigdm,ddrm]"],
        "method.names must be methods without ddrm for this task: ddrm needs the operator's SVD "
        "and one sigma_y",
    ),
    ([R, "method.names=[pigdm,foo]"], "method.names must be a list of methods from ['ddrm', 'dps'"),
    ([R, "method.names=[]"], "method.names must be a list of distinct methods"),
    ([R, "method.zeta=1"], "method.zeta is used only by method dps; got method.names=[projection"),
    ([R, "method.names=[dps]", "method.eta=0.5"], "method.eta is used only by method ddrm"),
    ([R, "method.names=[dps]"], "method.zeta must be given"),
    ([R, "method.names=[dps]", "method.zeta=-1"], "method.zeta must be a number in [0"),
    ([R, "method.names=[ddrm]", "method.eta=2"], "method.eta must be a number in [0.0, 1.0]"),
    ([R, "sampler.num_samples=10"], "sampler.num_samples is task.num_images x task.draws here"),
    ([R, "sampler=heun", "sampler.S_chur=1"], "sampler.S_chur is not an option of sampler=heun"),
    ([R, "task.kep=0.3"], "task.kep is not a field of task=inpaint_random"),
    (["task=nope"], "task=nope: no such option; task must be one of"),
    # not a trained score run
    ([R, "run_dir={missing}"], "config.yaml: not found; run_dir must be a training run"),
    (["task=denoise", "run_dir={config_only}"], "checkpoints: no checkpoint to sample from"),
    ([R, "run_dir={classifier}"], "run_dir must be a score training run (experiments.train)"),
    # flat data: the image operators are refused naming task
    (
        ["task=inpaint_box", "run_dir={toy}"],
        "task must be one of ['denoise', 'inpaint_random', 'cs'",
    ),
    (["task=blur", "run_dir={toy}"], "for the run's flat data (shape [2]): blur needs images"),
]


@pytest.fixture(scope="module")
def paths(tiny_digits_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reconstruct_errors")
    np.savez(tmp / "bad_y.npz", y=np.zeros((4, 15), np.float32))
    other = {"task": "downsample", "operator": "Downsample", "params": {"factor": 2}, "m": 16}
    other |= {"data_shape": [8, 8, 1], "seed": 0}
    np.savez(tmp / "other_op.npz", y=np.zeros((4, 16)), operator=np.asarray(json.dumps(other)))
    from hydra import compose, initialize_config_dir

    from experiments.schema import register_configs

    register_configs()
    dirs = {}
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        for name, preset in [("toy", "experiment=toy_dsm"), ("config_only", "experiment=toy_dsm")]:
            cfg = compose("train", overrides=[preset])
            dirs[name] = tmp / name
            dirs[name].mkdir()
            OmegaConf.save(cfg, dirs[name] / "config.yaml", resolve=True)
        cfg = compose("train_classifier")
        dirs["classifier"] = tmp / "classifier"
        dirs["classifier"].mkdir()
        OmegaConf.save(cfg, dirs["classifier"] / "config.yaml", resolve=True)
    (dirs["toy"] / "checkpoints" / "2").mkdir(parents=True)  # a checkpoint step's directory
    return {
        "run": tiny_digits_run,
        "missing": tmp / "no_such_run",
        "bad_y": tmp / "bad_y.npz",
        "other_op": tmp / "other_op.npz",
        **dirs,
    }


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.slow  # about 30 s on 2 cores with the tiny digits run's training
@pytest.mark.parametrize("overrides, expected", BAD, ids=[" ".join(a)[:50] for a, _ in BAD])
def test_bad_input_exits_2_with_one_line_naming_the_field(
    overrides, expected, paths, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("SCORELIB_TRACEBACK", raising=False)
    args = [a.format(**paths) for a in overrides]
    if not any(a.startswith("run_dir=") for a in args):
        args.insert(0, f"run_dir={paths['run']}")
    watched = [paths[k] for k in ("run", "toy", "config_only", "classifier")]
    before = [_listing(d) for d in watched]
    r = run_inprocess("reconstruct", *args)
    assert r.code == 2, (r.code, r.stderr[-3000:])
    assert len(r.err_lines) == 1, r.stderr[-3000:]
    line = r.err_lines[0]
    assert line.startswith("error: ") and expected in line, line
    assert "Traceback" not in r.stderr + r.stdout
    assert [_listing(d) for d in watched] == before  # nothing written, no log directory left
    assert not paths["missing"].exists()
    assert list(tmp_path.iterdir()) == []
