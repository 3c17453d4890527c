"""Score models of the digits trained, sampled and evaluated for a table (``table=sure``,
``table=qcsbm``).

Each model is an ``experiments.train`` run (:class:`experiments.runs.ScoreRun`, trained or
resumed by :func:`experiments.runs.train_run` in ``<table run>/runs/<slug>``) composed from
a list of overrides; its samples come from the run's own sampler and EMA parameters, and
every metric from :func:`experiments.runs.evaluation.evaluate_images` against the CLEAN
digits (their test split; their training split for the floors). This module composes and
reports; the maths is in ``scorelib``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig

from experiments.runs import ScoreRun, train_run
from experiments.runs.evaluation import evaluate_images
from experiments.schema import register_configs
from experiments.tables.common import pm

#: The sample-quality columns of the tables: (column, evaluate_images key); each cell is
#: the mean over training seeds, ``± std`` when there are several.
QUALITY_COLUMNS = (
    ("C2ST pixels (0.5 = indistinguishable)", "c2st_pixels_samples"),
    ("recall pixels", "recall_pixels_samples"),
    ("C2ST features", "c2st_features_samples"),
    ("recall features", "recall_features_samples"),
    ("FD (digits classifier)", "fd"),
)
#: The same metrics of clean training digits against the test digits (the floor row).
FLOOR_KEYS = {
    "c2st_pixels_samples": "c2st_pixels_floor",
    "recall_pixels_samples": "recall_pixels_floor",
    "c2st_features_samples": "c2st_features_floor",
    "recall_features_samples": "recall_features_floor",
    "fd": "fd_floor",
}


#: The last note of each table.
CELLS_NOTE = (
    "Cells: one training seed, or mean ± std over the seeds. The paper column paraphrases the "
    "paper's claim; its experiments use other data, so none of its numbers is comparable."
)


def quality_note(first: dict) -> str:
    """How the sample-quality columns were measured, from one row's ``evaluate_images``
    result."""
    n, m = first["n"], first["two_sample_n"]
    return (
        "Sample quality against the clean test digits "
        f"(experiments.runs.evaluation.evaluate_images): {n} samples quantised to the digits' "
        f"{first['levels']} grey levels; C2ST (5-fold) and recall (k = 3) on {m} samples "
        f"against {m} test digits, mean over {first['two_sample_draws']} disjoint slices; FD "
        f"on all {n} in the bundled digits classifier's features. The floor row: clean "
        "training digits, same sizes."
    )


def slug(label: str) -> str:
    """A directory name for a row label (letters, digits, ``.``, ``_``, ``-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")


def compose(overrides: Sequence[str]) -> DictConfig:
    """The ``experiments.train`` config of ``overrides`` (a bad override fails here, before
    any training; the schemas are registered first, as ``experiments.train`` does)."""
    register_configs()
    return hydra.compose("train", overrides=list(overrides))


def check(overrides: Sequence[str]) -> None:
    """Build the run of ``overrides`` (:meth:`ScoreRun.build`: every config error, the
    objective's and penalty's included, as a one-line ``ValueError`` naming the field) without
    training it: a table checks every model before it trains the first."""
    ScoreRun.build(compose(overrides))


def train_model(overrides: Sequence[str], out: Path, log=print):
    """Train (or resume, or find complete) the run of ``overrides`` in ``out``;
    ``(run, state, wall seconds)``."""
    t0 = time.perf_counter()
    run, state = train_run(
        ScoreRun, compose(overrides), out, progress=False, handle_signals=False, tensorboard=False
    )
    wall = time.perf_counter() - t0
    log(f"[{out.name}] {run.cfg.trainer.steps} steps, {wall:.0f} s")
    return run, state, wall


def sample_and_evaluate(run, state, clean, *, seed: int, likelihood: bool, floor_draws: int):
    """``(samples, metrics)``: the run's samples from its EMA parameters and
    :func:`evaluate_images` of them against the clean digits ``clean`` (bits/dim of the
    test digits under the model's PF-ODE with ``likelihood``)."""
    x, _ = run.draw(state.ema_params, progress=False)
    x = np.asarray(x)
    source = run.source(state.ema_params) if likelihood else None
    metrics = evaluate_images(x, clean, "digits", seed=seed, source=source, floor_draws=floor_draws)
    return x, metrics


def cells(results: Sequence[dict], keys: Sequence[str]) -> list:
    """One table cell per key: the mean over ``results`` (one per seed), ``mean ± std`` with
    several; empty where no result has the key."""
    out = []
    for key in keys:
        v = np.array([r[key] for r in results if r.get(key) is not None], float)
        out.append(None if v.size == 0 else float(v[0]) if v.size == 1 else pm(v.mean(), v.std()))
    return out


def trained_models(tc: DictConfig, models, run_dir: Path, clean, *, likelihood: bool, log=print):
    """Train, sample and evaluate every model of every seed of ``table.seeds``.

    Args:
      tc: the table config (``seeds``, ``floor_draws``).
      models: ``models(seed) -> {key: (run slug, overrides)}``.
      run_dir: the table's run directory (runs in ``runs/<slug>``).
      clean: the clean digits (``scorelib.data.load_digits()``), the reference of every metric.
      likelihood: also bits/dim of the test digits (:func:`sample_and_evaluate`).

    Yields:
      ``(key, run, state, samples, row)`` per model, ``row`` holding ``seed``, ``train_s``
      and the metrics of :func:`evaluate_images`.
    """
    for seed in (int(s) for s in tc.seeds):
        for key, (name, overrides) in models(seed).items():
            run, state, wall = train_model(overrides, Path(run_dir) / "runs" / slug(name), log)
            x, m = sample_and_evaluate(
                run, state, clean, seed=seed, likelihood=likelihood, floor_draws=int(tc.floor_draws)
            )
            log(f"[{name}] C2ST pixels {m['c2st_pixels_samples']:.3f}, FD {m['fd']:.3g}")
            yield key, run, state, x, {"seed": seed, "train_s": wall, **m}
