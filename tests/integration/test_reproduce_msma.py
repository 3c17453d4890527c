"""End to end: ``python -m experiments.reproduce table=msma table.scale=smoke`` (a toy-sized
digits model trained by the table, MSMA's score norms and mixture, the bits/dim baseline and
the Gaussian-fit reference on every OOD set, the writer and the figure) and its one-line
refusals of bad fields before anything is trained."""

import pytest
from entry_helpers import run_inprocess, smoke_table


@pytest.mark.slow
def test_msma_smoke(tmp_path):
    run_dir = tmp_path / "run"
    meta, res = smoke_table("msma", ("auroc", "scores"), run_dir)
    assert (run_dir / "model" / "config.yaml").is_file()  # trained here: table.model=null
    # the table config as given (the smoke block merged by the table itself)
    assert meta["config"]["scale"] == "smoke"
    protocols = {"authors", "train_fit", "four_components", "first_levels", "first"}
    assert set(res["sigmas"]) == protocols  # the smoke block merges over the five
    assert all(len(v) == 3 for v in res["sigmas"].values())
    # a quarter of the 1,438 training digits held out of training: the authors' fit set
    assert res["n_train"] == 1079 and res["n_fit"]["authors"] == 359
    assert res["n_fit"]["first"] == res["n_fit"]["train_fit"] == 1079
    comps = res["seeds"][0]["components"]
    assert comps["model_first"] == 2 and 1 <= comps["model_authors"] <= 3  # cv over [1, 3]
    sets = res["seeds"][0]["sets"]
    assert set(sets) == {
        "test digits (in-distribution)",
        "MNIST-subset digits, 8x8",
        "test digits shifted by (1, 0)",
        "training digits (control, not OOD)",
        "uniform noise on the 17 levels",
    }
    assert sets["test digits (in-distribution)"]["n"] == 40
    assert sets["uniform noise on the 17 levels"]["n"] == 24
    for name, entry in sets.items():
        keys = [k for k in entry if k.endswith("_auroc")]
        assert len(keys) == (0 if name.startswith("test digits (in") else 12), (name, entry)
        assert all(0.0 <= entry[k] <= 1.0 for k in keys)
    # known-good: pixels drawn uniformly on the levels are nothing like digits, and the
    # Gaussian fit of the digits (no training involved) tells them apart through every detector
    noise = sets["uniform noise on the 17 levels"]
    assert min(noise[f"msma_gaussian_{p}_auroc"] for p in ("authors", "first")) > 0.99
    assert noise["bpd_gaussian_auroc"] > 0.99
    summary = (run_dir / "msma_auroc.md").read_text()
    assert "SVHN" in summary and "unverified" in summary


@pytest.mark.parametrize(
    "override,expected",
    [
        ("table.levels=1", "error: table.levels must be an integer >= 2; got 1"),
        (
            "table.protocols.first.sigma_min=0",
            "error: table.protocols.first.sigma_min must be a number in (0.0, inf); got 0",
        ),
        (
            "table.protocols.authors.sigma_max=0.01",
            "error: table.protocols.authors.sigma_max must be a number in (0.02, inf)",
        ),
        (
            "table.protocols.first.n_components=0",
            "error: table.protocols.first.n_components (an integer or cv) must be an integer",
        ),
        ("table.protocols.first.fit=test", "error: table.protocols.first.fit must be one of"),
        ("+table.protocols.first.levels=3", "error: table.protocols.first must be the fields"),
        ("table.cv_components=[3,2]", "error: table.cv_components must be [lo, hi] with 1 <= lo"),
        ("table.cv_folds=1000", "error: table.cv_folds (protocol authors: 359 digits) must be"),
        (
            "table.cv_components=[2,400]",
            "error: table.cv_components[1] (protocol authors: folds of 323) must be",
        ),
        ("table.cv_folds=1", "error: table.cv_folds must be an integer >= 2; got 1"),
        ("table.shifts=[[9,0]]", "error: table.shifts must be a list of [dy, dx] integer pairs"),
        ("table.model=/nonexistent", "error: table.model=/nonexistent: not an experiments.train"),
    ],
)
def test_msma_refuses_a_bad_field_in_one_line(tmp_path, override, expected):
    # the full scale: `table.scale=smoke` would merge its own levels and sigmas over these
    run_dir = tmp_path / "run"
    r = run_inprocess("reproduce", "table=msma", override, f"hydra.run.dir={run_dir}")
    assert r.code == 2, r.stderr[-2000:]
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith(expected), r.stderr
    assert not (run_dir / "model").exists()  # refused before anything was trained


def test_msma_refuses_a_model_of_other_data(tmp_path):
    other = tmp_path / "toy_run"
    other.mkdir()
    (other / "config.yaml").write_text("data:\n  name: toy\n  toy: moons\n")
    r = run_inprocess(
        "reproduce",
        "table=msma",
        "table.scale=smoke",
        f"table.model={other}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert r.code == 2, r.stderr[-2000:]
    assert r.err_lines == [
        f"error: table.model={other}: a run of data=toy; the table needs a run of the digits "
        "(python -m experiments.train experiment=digits_edm)"
    ]


def test_msma_refuses_a_distillation_run(tmp_path):
    other = tmp_path / "student"
    other.mkdir()
    (other / "config.yaml").write_text("distill:\n  divergence: kl\ndata:\n  name: digits\n")
    r = run_inprocess(
        "reproduce", "table=msma", f"table.model={other}", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert r.code == 2, r.stderr[-2000:]
    assert r.err_lines == [
        f"error: table.model={other}: a distillation run; the table needs a score run"
    ]


@pytest.mark.slow
def test_msma_refuses_a_held_out_fit_on_a_model_that_saw_every_digit(tmp_path):
    items = [
        "experiment=digits_edm",
        "model=mlp_digits",
        "model.width=8",
        "model.depth=1",
        "model.emb_dim=4",
        "trainer.steps=2",
        "trainer.log_every=1",
        "trainer.ckpt_every=2",
        "sampler.sigma_min=null",
    ]
    overrides = "[" + ",".join(f"'{x}'" for x in items) + "]"  # no data.holdout
    r = run_inprocess(
        "reproduce",
        "table=msma",
        "table.scale=smoke",
        f"table.smoke.model_overrides={overrides}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert r.code == 2, r.stderr[-2000:]
    assert len(r.err_lines) == 1, r.stderr
    assert r.err_lines[0].startswith("error: table.protocols.authors.fit=held_out: the model")
    assert r.err_lines[0].endswith("train it with data.holdout=0.25")
