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

* SURE-Score on the noisy digits, one row per variant of ``table.sure`` (``objective=sure``
  with the authors' loss, with this table's first recipe, with the guard, and both recipes
  on the whole-image denoiser);
* DSM (the EDM loss, ``objective=edm``) on the same noisy digits: a model of the noisy data;
* DSM on the clean digits (one run, shown once): what a clean data set allows.

Every run holds a quarter of its training digits out of training (``data.holdout``): each
noisy-data model's denoiser ``D(y, sigma_n)`` is scored by SURE on its own noisy training
digits and on the held-out noisy digits (``scorelib.objectives.denoiser_sure``), beside its
true error against the clean digits, which the table knows and the model never saw; the
SURE-Score runs' logged divergence term shows whether and when training drives it negative.

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

import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments.build import NOISE_SEED
from experiments.runs.evaluation import evaluate_images
from experiments.tables.common import (
    check_seeds,
    paired_cell,
    paired_difference,
    paired_verdict,
    pm,
    scaled,
)
from experiments.tables.digits_models import (
    CELLS_NOTE,
    FLOOR_KEYS,
    QUALITY_COLUMNS,
    cells,
    check,
    compose,
    quality_note,
    slug,
    trained_models,
)
from experiments.tables.fdistill_digits import make_figure
from scorelib._checks import check_int, check_real, require
from scorelib._io import atomic_write_text
from scorelib.data import load_digits, noisy_dataset
from scorelib.objectives import denoiser_sure

PAPER = (
    "trained on noisy data alone, close to the model of clean data and better than a "
    "model of the noisy data (abstract: competitive with clean training; MIMO, MRI)"
)
SURE, DSM_NOISY, DSM_CLEAN = (
    "SURE-Score, noisy digits",
    "DSM, noisy digits",
    "DSM, clean digits (reference)",
)


def variants(tc: DictConfig) -> dict:
    """``{row label: (slug part, overrides)}`` of the SURE-Score models: ``table.sure`` a list
    (one model, :data:`SURE`) or a mapping ``{name: overrides}`` (one row per name)."""
    if OmegaConf.is_list(tc.sure) or isinstance(tc.sure, list | tuple):
        return {SURE: ("", list(tc.sure))}
    return {f"SURE-Score ({k}), noisy digits": (f"{k}_", list(v)) for k, v in tc.sure.items()}


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError: naming ``table.<field>`` (a noise level <= 0, seeds that are not distinct
        integers, ``table.floor_draws`` or ``table.sure_probes`` < 1, overrides without
        ``data.holdout``) or, from Hydra, a bad override.
    """
    tc = scaled(cfg, base="small")
    if not tc.noise_levels:
        raise ValueError("table.noise_levels must list at least one noise level > 0")
    for s in tc.noise_levels:
        check_real(s, "table.noise_levels", low=0.0, low_open=True, high_open=True)
    seeds = check_seeds(tc.seeds)
    check_int(tc.floor_draws, "table.floor_draws", low=1)
    check_int(tc.sure_probes, "table.sure_probes", low=1)
    holdout = compose(tc.overrides).data.get("holdout")
    require(
        holdout is not None,
        "table.overrides",
        "a list that includes data.holdout=<fraction in (0, 1)> (the held-out SURE's digits)",
        "none",
    )
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
        for label, (part, overrides) in variants(tc).items():
            out[(float(s), label)] = (f"sure_{part}{s}_seed{seed}", [*noisy, *overrides])
        out[(float(s), DSM_NOISY)] = (f"dsm_{s}_seed{seed}", [*noisy, "objective=edm"])
    return out


def trace(run_dir: Path) -> dict:
    """The logged SURE parts of a SURE-Score run (``metrics.jsonl``): the divergence term at
    the last log step, its minimum, and the first logged step where it is negative."""
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "sure_divergence" in r]
    div = [r["sure_divergence"] for r in rows]
    neg = [r["step"] for r in rows if r["sure_divergence"] < 0]
    return {
        "div_last": div[-1],
        "div_min": min(div),
        "first_negative_step": neg[0] if neg else None,
        "sure_last": rows[-1]["sure"],
        "residual_last": rows[-1]["sure_residual"],
    }


def denoiser_errors(run, state, sigma_n: float, clean_split, n_probes: int, seed: int) -> dict:
    """:func:`scorelib.objectives.denoiser_sure` of the run's EMA denoiser at ``sigma_n`` on
    its noisy training digits and on its held-out noisy digits, each with the true error
    against their clean digits (``clean_split``: the clean data set with the same hold-out)."""
    data = run.data.images
    source = run.source(state.ema_params)
    out = {}
    for name, y, x in (
        ("train", data.train, clean_split.train),
        ("held_out", data.held_out, clean_split.held_out),
    ):
        key = jax.random.key(10_000 + seed)
        r = denoiser_sure(source, y, sigma_n=sigma_n, key=key, probes=n_probes, clean=x)
        out.update({f"{k}_{name}": v for k, v in r.items()})
    return out


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Train every model, evaluate it against the clean test digits, and each noisy-data
    model's denoiser by SURE on its training and held-out digits; writes ``results.json``
    and ``figure.png`` into ``run_dir``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    clean = load_digits()
    held = clean.hold_out(float(compose(tc.overrides).data.holdout))
    seeds = [int(s) for s in tc.seeds]
    results, figure = [], {}
    table = lambda seed: models(tc, seed)  # noqa: E731
    rows = trained_models(tc, table, run_dir, clean, likelihood=False, log=log)
    for (sigma_n, label), trun, state, x, row in rows:
        extra = {}
        if sigma_n is not None:
            extra = denoiser_errors(trun, state, sigma_n, held, int(tc.sure_probes), row["seed"])
            slug_ = table(row["seed"])[(sigma_n, label)][0]
            if label != DSM_NOISY:
                extra["trace"] = trace(run_dir / "runs" / slug(slug_))
            log(
                f"[{label}, sigma_n {sigma_n:g}, seed {row['seed']}] SURE train "
                f"{extra['sure_train']:.4f} (true {extra['mse_train']:.4f}), held-out "
                f"{extra['sure_held_out']:.4f} (true {extra['mse_held_out']:.4f})"
            )
        results.append({"sigma_n": sigma_n, "label": label, **row, **extra})
        if row["seed"] == seeds[0]:
            figure[label if sigma_n is None else f"{label}, sigma_n {sigma_n:g}"] = x[:64]
    n = int(compose(tc.overrides).sampler.num_samples)
    for s in tc.noise_levels:  # the noisy training digits themselves (no model)
        noisy = noisy_dataset(held, float(s), seed=NOISE_SEED).train
        m = evaluate_images(
            noisy[:n], clean, "digits", seed=seeds[0], floor_draws=int(tc.floor_draws)
        )
        results.append({"sigma_n": float(s), "label": "noisy training digits (no model)", **m})
        figure[f"noisy training digits, sigma_n {float(s):g}"] = noisy[:64]
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1, default=str))
    fig = run_dir / "figure.png"
    make_figure(figure, fig)
    return report(results, tc, fig)


def _cell(rs: list, key: str):
    v = np.array([r[key] for r in rs if r.get(key) is not None], float)
    return None if v.size == 0 else float(v[0]) if v.size == 1 else pm(v.mean(), v.std())


#: The paired comparison's metrics: result key, column, whether lower is better.
PAIRED_METRICS = (
    ("c2st_pixels_samples", "ΔC2ST pixels", True),
    ("recall_pixels_samples", "Δrecall pixels", False),
    ("fd", "ΔFD", True),
    ("mse_held_out", "Δtrue error of the denoiser, held-out", True),
)
#: The metrics the verdict reads: the samples' (the denoiser's error is shown beside them).
SAMPLE_KEYS = ("c2st_pixels_samples", "recall_pixels_samples")
PAIRED_COLUMNS = [
    "sigma_n (data units)",
    "SURE-Score variant",
    *(c for _, c, _ in PAIRED_METRICS),
    "verdict (against DSM, noisy digits)",
]


def paired_rows(results: list) -> list:
    """One row per noise level and SURE-Score variant: its paired differences from DSM on
    the same noisy digits and seed (:func:`experiments.tables.common.paired_difference`),
    and a verdict on the samples by pixel C2ST and recall
    (:func:`experiments.tables.common.paired_verdict`: a paired t-test per metric at 0.05).
    Rows need 2 seeds or more."""
    rows = []
    levels = sorted({r["sigma_n"] for r in results if r.get("sigma_n") is not None})
    for s in levels:
        base = [r for r in results if (r["sigma_n"], r["label"]) == (s, DSM_NOISY)]
        labels = dict.fromkeys(
            r["label"] for r in results if r["sigma_n"] == s and r["label"].startswith("SURE")
        )
        for label in labels:
            rs = [r for r in results if (r["sigma_n"], r["label"]) == (s, label)]
            if len(rs) < 2 or not base:
                continue
            judged = [(k, lower) for k, _, lower in PAIRED_METRICS if k in SAMPLE_KEYS]
            verdict = paired_verdict(
                [paired_difference(rs, base, k) for k, _ in judged], [lower for _, lower in judged]
            )
            cells_ = [paired_cell(rs, base, k) for k, _, _ in PAIRED_METRICS]
            rows.append([s, label, *cells_, verdict])
    return rows


def report(results: list, tc: DictConfig, fig: Path) -> dict:
    """The summary table (one row per noise level and model, the floor last) and the
    denoisers' SURE against their true error."""
    keys = [k for _, k in QUALITY_COLUMNS]
    cols = ["sigma_n (data units)", "model", *(c for c, _ in QUALITY_COLUMNS), "train s", "paper"]
    den_cols = [
        "sigma_n (data units)",
        "model",
        "SURE, training digits",
        "true error, training digits",
        "SURE, held-out digits",
        "true error, held-out digits",
        "divergence term, training digits",
        "divergence term, held-out digits",
        "divergence term in training (last log)",
        "first logged step with a negative divergence term",
    ]
    rows, den_rows = [], []
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
                PAPER if label.startswith("SURE-Score") else "",
            ]
        )
        if "sure_train" not in rs[0]:
            continue
        tr = [r["trace"] for r in rs if "trace" in r]
        first = [t["first_negative_step"] for t in tr]
        den_rows.append(
            [
                sigma_n,
                label,
                *(
                    _cell(rs, k)
                    for k in (
                        "sure_train",
                        "mse_train",
                        "sure_held_out",
                        "mse_held_out",
                        "divergence_train",
                        "divergence_held_out",
                    )
                ),
                _cell(tr, "div_last") if tr else None,
                ", ".join("never" if f is None else str(f) for f in first) if tr else None,
            ]
        )
    first = [r for r in results if r.get("seed") == int(tc.seeds[0])][0]
    rows.append(
        ["clean", "clean training digits (floor)", *cells([first], FLOOR_KEYS.values()), None, ""]
    )
    sure_notes = "; ".join(f"{k}: {v[1]}" for k, v in variants(tc).items())
    notes = [
        f"Models: experiments.train with {list(tc.overrides)} (trainer.seed over the seeds); "
        f"SURE-Score rows add data.noise_sigma and {sure_notes}; DSM rows objective=edm (the "
        "EDM loss, the same P_mean as SURE's). The noisy training split is one fixed draw "
        "(scorelib.data.noisy_dataset, seed experiments.build.NOISE_SEED); data.holdout keeps "
        "a fixed quarter of it out of training; the test split is clean.",
        quality_note(first),
        "Noisy training digits (no model): the first n noisy training images, what a model "
        "that learned the noisy data exactly would give.",
        "Denoisers: each noisy-data model's D(y, sigma_n) on its noisy training digits and on "
        f"its held-out noisy digits, SURE with {tc.sure_probes} Rademacher probes per digit "
        "(exact b^T J b; scorelib.objectives.denoiser_sure) beside the true squared error "
        "against the clean digits, per pixel (data units squared); SURE = residual + "
        "divergence term - sigma_n^2. SURE is unbiased on the held-out digits only. The "
        "training trace: the logged mean divergence term 2 sigma_n^2 div h / d (every "
        "trainer.log_every steps); a posterior-mean denoiser's is >= 0.",
        CELLS_NOTE,
    ]
    tables = [
        {
            "name": "summary",
            "caption": "SURE-Score on noisy digits against DSM on the noisy and on the "
            "clean digits, judged against the clean test digits.",
            "columns": cols,
            "rows": rows,
        }
    ]
    paired = paired_rows(results)
    if paired:
        tables.append(
            {
                "name": "paired",
                "caption": "Each SURE-Score variant against DSM on the same noisy digits, seed "
                "by seed (mean ± s.e. of the differences): the paper's claim is that training "
                "on noisy data with SURE beats modelling the noisy data.",
                "columns": PAIRED_COLUMNS,
                "rows": paired,
            }
        )
    if den_rows:
        tables.append(
            {
                "name": "denoisers",
                "caption": "Each noisy-data model's denoiser at sigma_n: SURE against the true "
                "error on the training and on held-out digits, and the divergence term.",
                "columns": den_cols,
                "rows": den_rows,
            }
        )
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": tables,
        "notes": notes,
        "figure": str(fig),
    }
