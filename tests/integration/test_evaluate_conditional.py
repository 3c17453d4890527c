"""experiments.evaluate on conditional samples (a ``labels`` array beside ``samples``): the
classifier accuracy and the per-class rows beside their floors, told apart on real digits
with true and with shuffled labels; bad labels refused in one line naming ``samples=`` and
the file, before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from entry_helpers import ROOT, run_inprocess
from omegaconf import OmegaConf

from experiments.runs.evaluation import load_labels
from scorelib.data.images import load_digits


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A digits run directory (its config only: no checkpoint, so no bits/dim)."""
    from hydra import compose, initialize_config_dir

    from experiments.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=digits_edm"])
    run_dir = tmp_path_factory.mktemp("conditional") / "digits"
    run_dir.mkdir()
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    return run_dir


def _few(y):
    """Class 3 down to 2 samples (the others moved to class 4)."""
    y = y.copy()
    y[np.flatnonzero(y == 3)[2:]] = 4
    return y


BAD_LABELS = [
    (lambda y: y[:-1], "labels must be [60] integer classes (one per sample); got shape (59,)"),
    (lambda y: y * 0.5, "labels must be [60] integer classes (one per sample); got shape (60,), "),
    (lambda y: np.where(y == 3, 10, y), "labels must be classes of the data (0..9); got 10 (6 "),
    (_few, "the per-class two-sample tests need at least 10 samples of each class (5 folds, "),
]


@pytest.mark.parametrize("make, expected", BAD_LABELS, ids=["short", "float", "11th", "few"])
def test_bad_labels_are_refused_in_one_line_naming_the_file(digits_run, tmp_path, make, expected):
    d = load_digits()
    samples = tmp_path / "samples.npz"
    np.savez(samples, samples=d.train[:60], labels=make(np.arange(60) % 10))
    r = run_inprocess("evaluate", f"run_dir={digits_run}", f"samples={samples}")
    assert r.code == 2, (r.code, r.stderr[-3000:])
    assert len(r.err_lines) == 1, r.stderr[-3000:]
    assert expected in r.err_lines[0], r.err_lines[0]
    if make is not _few:  # refused by the entry point, naming the file
        assert f"samples={samples}: labels must be" in r.err_lines[0]
    else:
        assert "class 3 has 2 of 60: draw more (sampler.num_samples)" in r.err_lines[0]
    assert (
        not (tmp_path / "eval_samples.json").exists()
        and not (tmp_path / "eval_samples.md").exists()
    )


def _digits(kind):
    x = load_digits().train[:60]
    return {
        "int": ((x + 1) * 8).round().astype(np.int64),  # the raw 0..16 digits
        "0..16": (x + 1) * 8,
        "0..1": (x + 1) / 2,
        "shape": x[:, :4],
        "strings": np.array(["a", "b"]),
        "nan": np.where(np.arange(60)[:, None, None, None] < 3, np.nan, x),
    }[kind]


BAD_IMAGES = [
    (
        "int",
        "must hold float images [n, 8, 8, 1] in [-1, 1], the data's range; got dtype "
        "int64 with values in [0, 16]",
    ),
    (
        "0..16",
        "(a model's samples may overshoot it by up to 2: evaluation clips them); got "
        "values in [0, 16]: map them to [-1, 1]",
    ),
    (
        "0..1",
        "got values in [0, 1], none below 0 where the data's images reach -1 (images in "
        "[0, 1]? give 2 x - 1)",
    ),
    (
        "shape",
        "must hold float images [n, 8, 8, 1] in [-1, 1], the data's range; got shape (60, 4, 8, 1)",
    ),
    ("strings", "must hold float images [n, 8, 8, 1] in [-1, 1], the data's range; got dtype <U1"),
    ("nan", ": 3 of 60 samples are not finite"),
]


@pytest.mark.parametrize("kind, expected", BAD_IMAGES, ids=[k for k, _ in BAD_IMAGES])
def test_images_off_the_datas_convention_are_refused_before_any_compute(
    digits_run, tmp_path, kind, expected
):
    """Integer digits, another scale, another shape, strings, NaN: one line naming
    ``samples=`` and the file, what it holds and what is expected, before the classifier or
    anything else runs (issue 39, items 2 and 4)."""
    samples = tmp_path / f"{kind}.npz"
    np.savez(samples, samples=_digits(kind))
    r = run_inprocess("evaluate", f"run_dir={digits_run}", f"samples={samples}")
    assert r.code == 2, (r.code, r.stderr[-3000:])
    assert len(r.err_lines) == 1, r.stderr[-3000:]
    assert r.err_lines[0].startswith(f"error: samples={samples}"), r.err_lines[0]
    assert expected in r.err_lines[0], r.err_lines[0]
    assert r.stdout == "" and "evaluating" not in r.stderr  # nothing computed
    assert sorted(p.name for p in tmp_path.iterdir()) == [samples.name]


def test_a_models_overshoot_is_not_refused(digits_run, tmp_path):
    """A model's raw samples overshoot [-1, 1] (the evaluation clips them): checked, not
    refused."""
    from experiments.build import build_data
    from experiments.runs.evaluation import check_samples

    data = build_data(OmegaConf.load(digits_run / "config.yaml"))
    x = load_digits().train[:60] * 2.2  # -2.2 .. 2.2
    assert check_samples(x, data, "samples=x") is not None
    with pytest.raises(ValueError, match=r"^samples=x must hold float images .* got values in "):
        check_samples(x * 2, data, "samples=x")


def test_labels_are_read_when_present(tmp_path):
    np.savez(tmp_path / "a.npz", samples=np.zeros((4, 2)), labels=np.arange(4))
    np.savez(tmp_path / "b.npz", samples=np.zeros((4, 2)))
    np.savez(tmp_path / "c.npz", samples=np.zeros((4, 2)), labels=np.arange(3))
    assert load_labels(tmp_path / "a.npz").tolist() == [0, 1, 2, 3]
    assert load_labels(tmp_path / "b.npz") is None
    with pytest.raises(ValueError, match=r"^samples=.*c\.npz: labels must be \[4\] integer"):
        load_labels(tmp_path / "c.npz")


@pytest.mark.slow  # 20 to 45 s: a run directory's evaluation through the command line
def test_evaluate_command_reports_the_conditional_rows(digits_run, tmp_path):
    d = load_digits()
    samples = tmp_path / "samples.npz"
    np.savez(samples, samples=d.train[:359], labels=d.train_labels[:359])
    r = run_inprocess("evaluate", f"run_dir={digits_run}", f"samples={samples}")
    assert r.code == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "eval_samples.json").read_text())
    # training digits with their own labels: the classifier knows them (its test accuracy is
    # the floor), and the per-class tests sit at their floors (the metric-level tests in
    # tests/metrics/test_metrics_conditional.py show shuffled labels failing them)
    assert result["conditional"] and result["accuracy_samples"] > 0.95
    assert result["accuracy_samples_n"] == 359 and result["accuracy_floor"] > 0.9
    assert result["per_class_classes"] == list(range(10))
    for space in ("pixels", "features"):
        c2st = f"per_class_c2st_{space}_samples"
        assert abs(result[c2st] - result[f"per_class_c2st_{space}_floor"]) < 0.1
        assert result[f"{c2st}_min"] <= result[c2st] <= result[f"{c2st}_max"]
    table = (tmp_path / "eval_samples.md").read_text()
    n = result["per_class_n"]
    assert table.startswith(
        f"| conditional samples, 10 classes: {min(n)}-{max(n)} of each vs the test images"
    )
    assert "| classifier accuracy vs labels | C2ST pixels | C2ST features |" in table
    assert "(test images)" in table and "Worst classes: accuracy" in table
    assert "| C2ST pixels |" in table and "FD_digits" in table  # the pooled rows as before


def test_samples_of_one_class_are_pooled_against_that_class():
    """Training sevens labelled 7: every pooled row compares them with the sevens (C2ST at
    chance, FD near its floor), not with all the digits, which they would fail; bits/dim is
    not asked here. ``ImageDataset.of_classes`` keeps exactly the class's images."""
    from experiments.runs.evaluation import evaluate_images

    d = load_digits()
    sevens = d.of_classes([7])
    assert np.all(sevens.train_labels == 7) and np.all(sevens.test_labels == 7)
    assert sevens.test.shape[0] == np.sum(d.test_labels == 7) > 20
    with pytest.raises(ValueError, match="classes must be classes of the test split"):
        d.of_classes([7, 11])
    x = sevens.train[:100]
    r = evaluate_images(x, d, "digits", labels=np.full(100, 7), floor_draws=2, two_sample_draws=1)
    assert r["pooled_classes"] == [7] and r["two_sample_n"] == sevens.test.shape[0]
    assert r["c2st_pixels_samples"] < 0.7 and r["fd"] < 3 * r["fd_floor"] + 1.0
    # the same sevens against all the test digits: told apart (what the rows showed before)
    from scorelib.metrics import c2st

    assert c2st(x.reshape(100, -1), d.test[:100].reshape(100, -1), seed=0)["accuracy"] > 0.8
