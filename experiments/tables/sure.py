"""SURE-Score on noisy digits: ``python -m experiments.reproduce table=sure``.

Aali, Arvinte, Kumar and Tamir, "Solving inverse problems with score-based generative
priors learned from noisy data", arXiv 2305.01166: a score model learned from training data
corrupted by known Gaussian noise ``y = x + sigma_n n`` alone (Stein's unbiased risk
estimate of the denoiser at ``sigma_n`` plus the EDM loss on its denoised estimates,
``scorelib.objectives.SURE``; ``objective=sure data.noise_sigma=sigma_n``).

For each noise level of ``table.noise_levels`` (the training split corrupted once,
``scorelib.data.noisy_dataset``; the test split stays clean), each an ``experiments.train``
run with ``table.overrides`` (same network, optimizer, steps, sampler) and ``trainer.seed``
from ``table.seeds``:

* SURE-Score on the noisy digits (``table.sure``: ``objective=sure``);
* DSM (the EDM loss, ``objective=edm``) on the same noisy digits: a model of the noisy data;
* DSM on the clean digits (one run, shown once): what a clean data set allows.

Beside them: the noisy training digits themselves, and clean training digits (the floor).
Every row is judged against the CLEAN test digits by
``experiments.runs.evaluation.evaluate_images``: the classifier two-sample test in pixels
(C2ST accuracy, 0.5 = indistinguishable) and recall (k = 3), also in the bundled digits
classifier's features, and FD beside them (never alone). This module composes runs of the
library and reports; the objective is ``scorelib/objectives/sure.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from experiments.build import NOISE_SEED
from experiments.runs.evaluation import evaluate_images
from experiments.tables.common import check_seeds, scaled
from experiments.tables.digits_models import (
    CELLS_NOTE,
    FLOOR_KEYS,
    QUALITY_COLUMNS,
    cells,
    check,
    compose,
    quality_note,
    trained_models,
)
from experiments.tables.fdistill_digits import make_figure
from scorelib._checks import check_int, check_real
from scorelib._io import atomic_write_text
from scorelib.data import load_digits, noisy_dataset

PAPER = (
    "trained on noisy data alone, close to the model of clean data and better than a "
    "model of the noisy data (abstract: competitive with clean training; MIMO, MRI)"
)
SURE, DSM_NOISY, DSM_CLEAN = (
    "SURE-Score, noisy digits",
    "DSM, noisy digits",
    "DSM, clean digits (reference)",
)


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError: naming ``table.<field>`` (a noise level <= 0, seeds that are not distinct
        integers, ``table.floor_draws`` < 1) or, from Hydra, a bad override.
    """
    tc = scaled(cfg, base="small")
    if not tc.noise_levels:
        raise ValueError("table.noise_levels must list at least one noise level > 0")
    for s in tc.noise_levels:
        check_real(s, "table.noise_levels", low=0.0, low_open=True, high_open=True)
    seeds = check_seeds(tc.seeds)
    check_int(tc.floor_draws, "table.floor_draws", low=1)
    for overrides in models(tc, int(seeds[0])).values():
        check(overrides[1])  # a bad override fails here, before any training
    return tc


def models(tc: DictConfig, seed: int) -> dict:
    """``{(noise level or None, row label): (run slug, overrides)}`` of one training seed;
    the clean model once, under ``None``."""
    base = [*tc.overrides, f"trainer.seed={seed}"]
    out = {(None, DSM_CLEAN): (f"clean_seed{seed}", [*base, "objective=edm"])}
    for s in tc.noise_levels:
        noisy = [*base, f"data.noise_sigma={s}"]
        out[(float(s), SURE)] = (f"sure_{s}_seed{seed}", [*noisy, *tc.sure])
        out[(float(s), DSM_NOISY)] = (f"dsm_{s}_seed{seed}", [*noisy, "objective=edm"])
    return out


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Train every model, evaluate it against the clean test digits; writes
    ``results.json`` and ``figure.png`` into ``run_dir``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    clean = load_digits()
    seeds = [int(s) for s in tc.seeds]
    results, figure = [], {}
    rows = trained_models(
        tc, lambda seed: models(tc, seed), run_dir, clean, likelihood=False, log=log
    )
    for (sigma_n, label), _, _, x, row in rows:
        results.append({"sigma_n": sigma_n, "label": label, **row})
        if row["seed"] == seeds[0]:
            figure[label if sigma_n is None else f"{label}, sigma_n {sigma_n:g}"] = x[:64]
    n = int(compose(tc.overrides).sampler.num_samples)
    for s in tc.noise_levels:  # the noisy training digits themselves (no model)
        noisy = noisy_dataset(clean, float(s), seed=NOISE_SEED).train
        m = evaluate_images(
            noisy[:n], clean, "digits", seed=seeds[0], floor_draws=int(tc.floor_draws)
        )
        results.append({"sigma_n": float(s), "label": "noisy training digits (no model)", **m})
        figure[f"noisy training digits, sigma_n {float(s):g}"] = noisy[:64]
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1, default=str))
    fig = run_dir / "figure.png"
    make_figure(figure, fig)
    return report(results, tc, fig)


def report(results: list, tc: DictConfig, fig: Path) -> dict:
    """The summary table (one row per noise level and model, the floor last)."""
    keys = [k for _, k in QUALITY_COLUMNS]
    cols = ["sigma_n (data units)", "model", *(c for c, _ in QUALITY_COLUMNS), "train s", "paper"]
    rows = []
    order = list(dict.fromkeys((r["sigma_n"], r["label"]) for r in results))
    order.sort(key=lambda k: -1.0 if k[0] is None else k[0])
    for sigma_n, label in order:
        rs = [r for r in results if (r["sigma_n"], r["label"]) == (sigma_n, label)]
        wall = [r["train_s"] for r in rs if "train_s" in r]
        rows.append(
            [
                "clean" if sigma_n is None else sigma_n,
                label,
                *cells(rs, keys),
                float(np.mean(wall)) if wall else None,
                PAPER if label == SURE else "",
            ]
        )
    first = [r for r in results if r.get("seed") == int(tc.seeds[0])][0]
    rows.append(
        ["clean", "clean training digits (floor)", *cells([first], FLOOR_KEYS.values()), None, ""]
    )
    notes = [
        f"Models: experiments.train with {list(tc.overrides)} (trainer.seed over the seeds); "
        f"SURE-Score adds {list(tc.sure)} and data.noise_sigma; DSM rows objective=edm (the "
        "EDM loss, the same P_mean as SURE's). The noisy training split is one fixed draw "
        "(scorelib.data.noisy_dataset, seed experiments.build.NOISE_SEED); the test split is "
        "clean.",
        quality_note(first),
        "Noisy training digits (no model): the first n noisy training images, what a model "
        "that learned the noisy data exactly would give.",
        CELLS_NOTE,
    ]
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": [
            {
                "name": "summary",
                "caption": "SURE-Score on noisy digits against DSM on the noisy and on the "
                "clean digits, judged against the clean test digits.",
                "columns": cols,
                "rows": rows,
            }
        ],
        "notes": notes,
        "figure": str(fig),
    }
