"""No work lost and no misleading state at the edges of a run's life (issue 21): a damaged
checkpoint on resume, the run's own sampler, and every run saying whether it worked.

The damaged checkpoints go through a real ``python -m`` process (their warnings and errors
on its stderr); the other commands through each module's ``main()``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml
from entry_helpers import TOY, TOY_SAMPLES, TOY_STEPS, copy_run, run, run_inprocess

pytestmark = pytest.mark.slow


def _newest_steps(run_dir):
    ckpt = run_dir / "checkpoints"
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(toy_run, tmp_path):
    run_dir = copy_run(toy_run, tmp_path / "outputs" / "toy_dsm")
    newest, before = _newest_steps(run_dir)[-1], _newest_steps(run_dir)[-2]
    (run_dir / f"checkpoints/{newest}/meta/metadata").write_text("")  # an empty JSON file
    r = run("train", *TOY, cwd=tmp_path, check=False)  # the same command: the lost steps again
    assert r.code == 0, r.stderr[-3000:]
    assert f"resuming {run_dir} from step {before} of {TOY_STEPS}" in r.stdout, r.stdout
    assert f"checkpoints/{newest} cannot be read (JSONDecodeError" in r.stderr
    assert "Traceback" not in r.stderr
    assert TOY_STEPS in _newest_steps(run_dir)
    assert (run_dir / "checkpoints/unreadable" / str(newest)).is_dir()  # moved aside, kept


def test_no_readable_checkpoint_is_one_line_with_advice(toy_run, tmp_path):
    run_dir = copy_run(toy_run, tmp_path / "outputs" / "toy_dsm")
    for step in _newest_steps(run_dir):  # truncate the array files of every checkpoint
        for data in (run_dir / f"checkpoints/{step}/state").rglob("d/*"):
            data.write_bytes(data.read_bytes()[:10])
    sample = run("sample", f"run_dir={run_dir}", cwd=tmp_path, check=False)
    train = run("train", *TOY, cwd=tmp_path, check=False)
    for r in (sample, train):
        assert r.code == 1, r.stderr[-3000:]
        errors = [line for line in r.err_lines if line.startswith("error: ")]
        assert len(errors) == 1 and "no readable checkpoint in" in errors[0], r.stderr[-3000:]
        assert errors[0].endswith("move the directory aside to train the run again from step 0")
        assert len(errors[0]) <= 300 + len("error: ")
        assert "Traceback" not in r.stderr


def test_the_runs_own_sampler_changes_only_when_asked(toy_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outputs/ lands here
    run_dir = copy_run(toy_run, tmp_path / "outputs" / "toy_dsm")
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())["sampler"]
    other = [a for a in TOY if not a.startswith("sampler.")] + ["sampler.t_max=0.5"]
    other += ["sampler.num_samples=200", "sampler.batch_size=200", "sampler.steps=20"]
    r = run_inprocess("train", *other)  # the run is complete: it only draws samples
    assert r.code == 0, r.stderr[-3000:]
    assert "the run's own sampler stays" in r.stdout
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["sampler"] == stored
    e = run_inprocess("evaluate", f"run_dir={run_dir}")
    assert e.code == 0, e.stderr[-3000:]
    assert "evaluating " in e.stdout and "euler_maruyama_100_n1000_seed0" in e.stdout
    assert (
        f"(euler_maruyama, 100 steps, NFE 100, checkpoint step {TOY_STEPS}, EMA weights)"
        in e.stdout
    )
    # with the flag, this command's sampler becomes the run's own; the finished run's
    # samples of this sampler are reused, not drawn again (issue 39, item 7: make demo)
    r = run_inprocess("train", *other, "set_default_sampler=true")
    assert r.code == 0, r.stderr[-3000:]
    assert "(drawn earlier from this checkpoint with this sampler: reused;" in r.stdout
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["sampler"]["t_max"] == 0.5
    assert r.stdout.count("run directory: outputs/toy_dsm\n") == 1, r.stdout


def test_training_says_whether_it_worked(tmp_path, monkeypatch):
    """A toy run prints its evaluation when it ends: the samples' distances beside another
    draw of the data (the floor) and the prior's."""
    monkeypatch.chdir(tmp_path)  # outputs/ lands here
    args = [a for a in TOY if not a.startswith("trainer.steps=")] + ["trainer.steps=50"]
    r = run_inprocess("train", *args)
    assert r.code == 0, r.stderr[-3000:]
    assert "| samples |" in r.stdout
    assert "| other draws of the data, as many points (floor; mean +- std of 8) |" in r.stdout
    assert "| prior draws (baseline) |" in r.stdout
    out = tmp_path / "outputs/toy_dsm/samples/step50/euler_maruyama_100_n1000_seed0"
    result = json.loads((out / "eval_samples.json").read_text())
    assert result["energy_distance_floor"] < result["energy_distance_prior"]


def test_a_training_free_toy_prints_its_copy_rate(tmp_path):
    r = run_inprocess(
        "sample",
        "experiment=cfdm_moons",
        "sampler.num_samples=100",
        f"run_dir={tmp_path / 'cfdm'}",
    )
    assert r.code == 0, r.stderr[-3000:]
    assert "Memorisation of the 50 training points: copy rate" in r.stdout
    assert "(floor; mean +- std of 8)" in r.stdout


def test_a_user_npz_run_is_evaluated_without_a_classifier(tmp_path):
    """``data=npz`` has no bundled feature classifier: evaluate reports the pixel two-sample
    test, precision/recall, sliced W2 and memorisation, each beside its floor."""
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (200, 8, 8, 1), dtype=np.uint8)
    test = rng.integers(0, 256, (100, 8, 8, 1), dtype=np.uint8)
    np.savez(tmp_path / "images.npz", images=train, test_images=test)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = {"name": "mine", "data": {"name": "npz", "path": str(tmp_path / "images.npz")}}
    cfg["data"].update(key="images", sigma_data=0.5, dequantise=False)
    cfg["process"] = {"_target_": "scorelib.processes.EDM"}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    samples = tmp_path / "samples.npz"
    np.savez(samples, samples=rng.uniform(-1, 1, (100, 8, 8, 1)).astype(np.float32))
    r = run_inprocess("evaluate", f"run_dir={run_dir}", f"samples={samples}")
    assert r.code == 0, r.stderr[-3000:]
    assert "No feature classifier is bundled for data 'npz'" in r.stdout
    for row in ("| samples |", "(floor)", "(baseline)", "C2ST pixels", "copy rate"):
        assert row in r.stdout, row
    result = json.loads((tmp_path / "eval_samples.json").read_text())
    assert {"c2st_pixels_samples", "c2st_pixels_floor", "recall_pixels_samples"} <= set(result)
    assert {"sliced_w2_samples", "sliced_w2_floor", "mem_copy_rate"} <= set(result)
    assert "fd" not in result
    assert os.path.isfile(tmp_path / "eval_samples.md")


def test_two_evaluations_in_one_directory_keep_both(toy_run, tmp_path):
    """Each evaluation is named by the file it evaluates (issue 39, item 1): ``a.npz`` and
    ``b.npz`` of one directory get ``eval_a.*`` and ``eval_b.*``; evaluating ``a.npz`` again
    says it replaces its evaluation; ``reuse=true`` prints the saved one (same seed)."""
    x = np.load(toy_run / TOY_SAMPLES / "samples.npz")["samples"]
    np.savez(tmp_path / "a.npz", samples=x[:200])
    np.savez(tmp_path / "b.npz", samples=x[200:400] * 1.5)

    def evaluate(name, *more):
        r = run_inprocess("evaluate", f"run_dir={toy_run}", f"samples={tmp_path / name}", *more)
        assert r.code == 0, r.stderr[-3000:]
        return r.stdout

    assert "replacing" not in evaluate("a.npz") and "replacing" not in evaluate("b.npz")
    a, b = (json.loads((tmp_path / f"eval_{k}.json").read_text()) for k in "ab")
    assert a["samples"].endswith("a.npz") and b["samples"].endswith("b.npz")
    assert a["energy_distance"] < b["energy_distance"] and a["seed"] == 0
    assert (tmp_path / "eval_a.md").is_file() and (tmp_path / "eval_b.md").is_file()
    assert not (tmp_path / "eval.json").exists()
    out = evaluate("a.npz")
    assert "eval_a.md and eval_a.json (replacing an earlier evaluation of these samples)" in out
    stamp = (tmp_path / "eval_a.json").stat().st_mtime_ns
    out = evaluate("a.npz", "reuse=true")
    assert out.startswith("evaluated earlier: ") and "(reused: seed 0" in out, out
    assert (tmp_path / "eval_a.md").read_text().strip() in out
    assert (tmp_path / "eval_a.json").stat().st_mtime_ns == stamp  # nothing computed
    out = evaluate("a.npz", "reuse=true", "seed=1")  # another seed: computed
    assert "replacing an earlier evaluation" in out
    assert json.loads((tmp_path / "eval_a.json").read_text())["seed"] == 1
