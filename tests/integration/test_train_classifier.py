"""experiments.train_classifier end to end at tiny sizes: a cross-entropy classifier of the
digits (checkpoints, accuracy report, loading, the bit-identical resume), a DLSM classifier
against a tiny digits score run, and bad input refused with one line naming the field
before anything is written."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from entry_helpers import copy_run, run_inprocess

from experiments.runs import ClassifierRun, load_run, run_kind, saved_steps
from experiments.runs.classifier import load_classifier
from scorelib.scores import NoisyClassifier

#: The smallest classifier and a few steps of small batches.
TINY = [
    "classifier.width=16",
    "classifier.depth=1",
    "classifier.emb_dim=8",
    "trainer.batch_size=16",
    "trainer.log_every=3",
    "trainer.ckpt_every=3",
]


def _same(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))


@pytest.fixture(scope="module")
def ce_run(tmp_path_factory):
    """A 6-step cross-entropy classifier of the digits (checkpoints at 3 and 6)."""
    out = tmp_path_factory.mktemp("ce") / "run"
    r = run_inprocess("train_classifier", *TINY, "trainer.steps=6", f"hydra.run.dir={out}")
    assert r.code == 0, r.stderr[-3000:]
    assert "accuracy on the 359 test images: clean" in r.stdout
    assert "classifier: ClassifierMLP 16x1 on [8, 8, 1], 10 classes" in r.stdout
    return out


@pytest.mark.slow  # about 40 s on 2 busy cores: three short trainings
def test_ce_run_reports_loads_and_resumes_bit_for_bit(ce_run, tmp_path):
    out = ce_run
    assert saved_steps(out) == [3, 6]
    acc = json.loads((out / "accuracy.json").read_text())
    assert acc["step"] == 6 and acc["split"] == "test" and acc["num_examples"] == 359
    assert len(acc["sigma"]) == len(acc["accuracy"]) == 5
    assert acc["sigma"][0] == pytest.approx(0.002)  # the process's lowest level: clean
    assert all(0 <= a <= 1 for a in acc["accuracy"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"loss", "sigma", "grad_norm"} <= set(rows[-1])
    info = json.loads((out / "run_info.json").read_text())
    assert info["seed"] == 0 and info["launches"][0]["git"]
    assert run_kind(out) is ClassifierRun
    clf = load_classifier(out)
    assert isinstance(clf, NoisyClassifier) and clf.num_classes == 10
    x = np.zeros((2, 8, 8, 1), np.float32)
    lp = clf.log_probs(x, 0.5)
    np.testing.assert_allclose(jax.nn.logsumexp(lp, axis=1), 0.0, atol=1e-6)
    # the same command again: complete, nothing retrained
    again = run_inprocess("train_classifier", *TINY, "trainer.steps=6", f"hydra.run.dir={out}")
    assert again.code == 0 and "resuming" not in again.stdout, again.stderr[-2000:]
    # interrupted after step 3: the same command resumes, bit for bit the uninterrupted run
    half = copy_run(out, tmp_path / "half")
    shutil.rmtree(half / "checkpoints" / "6")
    resumed = run_inprocess("train_classifier", *TINY, "trainer.steps=6", f"hydra.run.dir={half}")
    assert resumed.code == 0, resumed.stderr[-2000:]
    assert f"resuming {half} from step 3 of 6" in resumed.stdout
    _, whole = load_run(out, step=6)
    _, again6 = load_run(half, step=6)
    assert _same(jax.device_get(whole), jax.device_get(again6))
    # a classifier run draws no samples
    s = run_inprocess("sample", f"run_dir={out}")
    assert s.code == 2 and "draws no samples" in s.stderr, s.stderr


@pytest.fixture(scope="module")
def score_run(tmp_path_factory):
    """A 2-step digits score run (a tiny MLP on EDM)."""
    out = tmp_path_factory.mktemp("score") / "run"
    args = [
        "experiment=digits_edm",
        "model=mlp",
        "model.width=16",
        "model.depth=1",
        "model.emb_dim=8",
        "trainer.steps=2",
        "trainer.batch_size=16",
        "trainer.ckpt_every=2",
        "sampler.steps=2",
        "sampler.num_samples=4",
        "sampler.batch_size=4",
        f"hydra.run.dir={out}",
    ]
    r = run_inprocess("train", *args)
    assert r.code == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow  # about 30 s on 2 busy cores: a score run and a DLSM classifier
def test_dlsm_run_against_a_score_run(score_run, tmp_path):
    out = tmp_path / "dlsm"
    args = [
        "experiment=digits_classifier_dlsm",
        f"score_run={score_run}",
        *TINY,
        "trainer.steps=3",
        f"hydra.run.dir={out}",
    ]
    r = run_inprocess("train_classifier", *args)
    assert r.code == 0, r.stderr[-3000:]
    assert "DLSM against the EMA score of" in r.stdout and "at step 2" in r.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"dlsm", "ce", "loss"} <= set(rows[-1])
    info = json.loads((out / "run_info.json").read_text())
    assert info["score_step"] == 2 and info["score_run"] == str(score_run.resolve())
    assert load_classifier(out).num_classes == 10
    # the score checkpoint is pinned at the first launch: after the score run saved a newer
    # one, the same command (a larger trainer.steps) continues against the same frozen score
    newer = score_run / "checkpoints" / "4"
    shutil.copytree(score_run / "checkpoints" / "2", newer)
    try:
        more = run_inprocess("train_classifier", *args[:-2], "trainer.steps=6", args[-1])
    finally:
        shutil.rmtree(newer)
    assert more.code == 0, more.stderr[-3000:]
    assert f"resuming {out} from step 3 of 6" in more.stdout and "at step 2" in more.stdout
    assert "score_step: 2" in (out / "config.yaml").read_text()
    # a score run of other data is refused before anything is written
    bad = run_inprocess(
        "train_classifier", *args[:1], f"score_run={out}", f"hydra.run.dir={tmp_path / 'x'}"
    )
    assert bad.code == 2 and "score_run=" in bad.stderr, bad.stderr
    assert not (tmp_path / "x").exists()


def _other_data_run(tmp_path):
    """A directory that looks like a score run of the 2-D toy data (config and a checkpoint
    directory: the refusal comes before any checkpoint is read)."""
    run_dir = tmp_path / "toy_run"
    (run_dir / "checkpoints" / "5").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        "name: toy\ndata:\n  name: toy\n  toy: moons\n  sigma_data: 1.0\nprocess:\n"
        "  _target_: scorelib.processes.EDM\n"
    )
    return run_dir


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["objective=dlsm"], "error: score_run must be an experiments.train run directory"),
        (
            ["objective=dlsm", "score_run={other}"],
            "error: score_run={other}: a score run of data=toy",
        ),
        (["score_run={other}"], "error: score_run is used only with objective=dlsm"),
        (["objective=dlsm", "score_run={missing}"], "error: score_run={missing}: no config.yaml"),
        (["objective=edm"], "error: objective must be ce or dlsm"),
        (["classifier.width=0"], "error: classifier.width must be an integer >= 1"),
        (["data=toy"], "error: data: a classifier needs labelled images"),
        (["objective.P_std=0"], "error: objective.P_std must be a number in (0.0"),
        (["+classifier.foo=1"], "error: classifier.foo is not a field of"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(overrides, message, tmp_path):
    other, missing = _other_data_run(tmp_path), tmp_path / "nowhere"
    fill = {"{other}": str(other), "{missing}": str(missing)}

    def subst(text):
        for k, v in fill.items():
            text = text.replace(k, v)
        return text

    out = tmp_path / "r"
    r = run_inprocess("train_classifier", *map(subst, overrides), f"hydra.run.dir={out}")
    lines = r.stderr.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and subst(message) in lines[0], r.stderr[-2000:]
    assert not out.exists()


def test_experiments_train_refuses_a_classifier_objective(tmp_path):
    out = tmp_path / "r"
    r = run_inprocess("train", "objective=ce", f"hydra.run.dir={out}")
    assert r.code == 2, r.stderr[-2000:]
    assert "objective=ce trains a noise-conditional classifier" in r.stderr
    assert not out.exists()
