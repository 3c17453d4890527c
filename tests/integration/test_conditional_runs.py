"""Class-conditional runs through the real command line (issue 36, items 1, 4 and 7): a
labelled toy run trains and draws balanced classes, ``sampler.labels`` and
``sampler.guidance`` redraw it, bad input is one line (exit 2) with nothing written, and an
unconditional run's config written before the conditioning fields existed samples exactly
as before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from entry_helpers import run_inprocess
from omegaconf import OmegaConf

from experiments.schema import not_identity_keys
from scorelib.data.toy import ring_means

pytestmark = pytest.mark.slow  # two tiny trainings and a few draws: about 40 s

TINY = [
    "experiment=toy_dsm",
    "model.width=32",
    "model.depth=2",
    "trainer.steps=300",
    "trainer.log_every=100",
    "trainer.ckpt_every=300",
    "sampler.steps=30",
    "sampler.num_samples=200",
    "sampler.batch_size=200",
]
COND = ["data.labels=true", "model.num_classes=8", "objective.label_dropout=0.2"]


def nearest_component(x: np.ndarray) -> np.ndarray:
    """The 8gaussians component nearest each point (its class)."""
    return np.argmin(((x[:, None, :] - ring_means()[None]) ** 2).sum(-1), axis=1)


@pytest.fixture(scope="module")
def cond_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("cond") / "run"
    r = run_inprocess("train", *TINY, *COND, "sampler.labels=balanced", f"hydra.run.dir={run_dir}")
    assert r.code == 0, r.stderr[-3000:]
    return run_dir


def samples_of(run_dir: Path, name: str):
    d = np.load(run_dir / "samples" / "step300" / name / "samples.npz")
    return d["samples"], (d["labels"] if "labels" in d else None)


def test_trains_and_draws_balanced_classes(cond_run):
    x, labels = samples_of(cond_run, "euler_maruyama_30_n200_seed0+labels-balanced")
    np.testing.assert_array_equal(labels, np.arange(200) % 8)
    assert np.mean(nearest_component(x) == labels) > 0.8  # each sample is of its class
    meta = json.loads(
        (
            cond_run / "samples/step300/euler_maruyama_30_n200_seed0+labels-balanced/samples.json"
        ).read_text()
    )
    assert meta["sampler"]["labels"] == "balanced"


def test_labels_and_guidance_redraw(cond_run):
    r = run_inprocess("sample", f"run_dir={cond_run}", "sampler.labels=3")
    assert r.code == 0, r.stderr[-2000:]
    x, labels = samples_of(cond_run, "euler_maruyama_30_n200_seed0+labels-3")
    assert np.all(labels == 3) and np.mean(nearest_component(x) == 3) > 0.8
    r = run_inprocess("sample", f"run_dir={cond_run}", "sampler.labels=none")
    assert r.code == 0, r.stderr[-2000:]
    x, labels = samples_of(cond_run, "euler_maruyama_30_n200_seed0+labels-none")
    assert labels is None and len(np.unique(nearest_component(x))) == 8  # unconditional
    guided = [
        "sampler.guidance.kind=cfg",
        "sampler.guidance.scale=3",
        "sampler.guidance.interval=[0.1,10]",
        "sampler.guidance.filter=tangential",
    ]
    r = run_inprocess("sample", f"run_dir={cond_run}", *guided)
    assert r.code == 0, r.stderr[-2000:]
    name = (
        "euler_maruyama_30_n200_seed0+labels-balanced+guidance-cfg+scale-3+interval-0.1_10"
        "+filter-tangential"
    )
    x, labels = samples_of(cond_run, name)
    np.testing.assert_array_equal(labels, np.arange(200) % 8)
    assert np.all(np.isfinite(x))


CFG2 = ["sampler.guidance.kind=cfg", "sampler.guidance.scale=2"]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["sampler.labels=12"], "sampler.labels must be null, balanced | uniform | none"),
        (["sampler.labels=none", *CFG2], "sampler.labels: guidance"),
        (["sampler.guidance.kind=cfg"], "sampler.guidance.scale must be given"),
        (["sampler.guidance.filter=tangential"], "sampler.guidance.filter is used only"),
        (["sampler.guidance.kind=cfg", "sampler.guidance.classifier=x"], "guidance.classifier"),
        (["sampler.guidance.kind=classifier"], "sampler.guidance.classifier must name"),
    ],
)
def test_bad_sampling_is_one_line(cond_run, overrides, needle):
    before = sorted(p.name for p in (cond_run / "samples" / "step300").iterdir())
    r = run_inprocess("sample", f"run_dir={cond_run}", *overrides)
    lines = r.stderr.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and needle in lines[0], r.stderr[-2000:]
    assert sorted(p.name for p in (cond_run / "samples" / "step300").iterdir()) == before


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["sampler.labels=2"], "the model is unconditional"),
        ([*CFG2, "sampler.labels=2"], "classifier-free guidance needs"),
        (CFG2, "classifier-free guidance needs"),  # before asking for labels
        (["data.labels=true"], "model.num_classes must be 8"),
        (["model.num_classes=8"], "data.labels: model.num_classes=8"),
        (["objective.label_dropout=0.1"], "it needs data.labels=true"),
        (["data.toy=swissroll", "data.labels=true", "model.num_classes=3"], "data.labels"),
        ([*COND[:2], "sampler.labels=none"], "null label (the unconditional score) was never"),
        ([*COND[:2], "sampler.labels=1", *CFG2], "was never trained"),
    ],
)
def test_bad_training_config_is_one_line(tmp_path, overrides, needle):
    r = run_inprocess("train", *TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    lines = r.stderr.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and needle in lines[0], r.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_an_unconditional_run_of_before_samples_as_before(tmp_path):
    """A run whose config.yaml and checkpoint predate the conditioning fields (no data.labels,
    model.num_classes, objective.label_dropout, sampler.labels, sampler.guidance; the
    checkpoint's model fingerprint without num_classes) loads and redraws bit for bit what
    the run drew itself."""
    run_dir = tmp_path / "run"
    r = run_inprocess("train", *TINY[:-2], "sampler.num_samples=50", f"hydra.run.dir={run_dir}")
    assert r.code == 0, r.stderr[-2000:]
    name = "euler_maruyama_30_n50_seed0"
    first = np.load(run_dir / "samples/step300" / name / "samples.npz")
    assert list(first.keys()) == ["samples"]
    cfg = OmegaConf.load(run_dir / "config.yaml")
    for node, key in [
        ("data", "labels"),
        ("model", "num_classes"),
        ("objective", "label_dropout"),
        ("sampler", "labels"),
        ("sampler", "guidance"),
    ]:
        assert key in cfg[node]
        del cfg[node][key]
    OmegaConf.save(cfg, run_dir / "config.yaml")
    meta = run_dir / "checkpoints/300/meta/metadata"  # the checkpoint's model fingerprint
    fingerprint = json.loads(meta.read_text())
    del fingerprint["config"]["model"]["num_classes"]
    meta.write_text(json.dumps(fingerprint))
    (run_dir / "samples/step300" / name / "samples.npz").unlink()
    r = run_inprocess("sample", f"run_dir={run_dir}")
    assert r.code == 0, r.stderr[-2000:]
    again = np.load(run_dir / "samples/step300" / name / "samples.npz")
    np.testing.assert_array_equal(again["samples"], first["samples"])


def test_conditioning_names_the_run_and_sampling_does_not():
    keys = set(not_identity_keys("train"))
    assert {"data.labels", "model.num_classes", "objective.label_dropout"}.isdisjoint(keys)
    assert {"sampler.labels", "sampler.guidance.kind", "sampler.guidance.scale"} <= keys
