"""Cas-DM on the digits: ``python -m experiments.reproduce table=casdm_digits``.

An et al., "Bring metric functions into diffusion models" (IJCAI 2024, arXiv:2401.02414):
a cascaded network whose second module predicts the clean image, trained with a metric loss
(LPIPS) on that image while the first module keeps the plain denoising loss, gives better
samples than the same network without the metric loss.

Per seed of ``table.seeds``, two ``experiments.train`` runs of ``experiment=casdm_digits``
(the main job's network cascaded, ``scorelib.nets.Cascade``; ``objective=cascade``) with
``table.overrides``:

* ``mse``: the cascade without the metric (``objective.metric=none``,
  ``objective.metric_weight=0``): the paper's baseline, the same network without it;
* ``metric``: with the metric (``table.metric`` at weight ``table.metric_weight``).

Each is sampled by the run's own sampler with each blend of ``table.blends``
(``scorelib.nets.with_blend``: the same parameters; ``first`` is module 1 alone, the plain
EDM network, the same in both runs because module 2's losses never reach it: the table
reports the largest difference of its samples between the runs), and read against the clean
test digits by ``evaluate_images`` (pixel two-sample test and recall, FD). The per-sigma
table reads the two modules on noised test digits (``scorelib.metrics.cascade_errors``):
each one's squared error and their gap, which a metric-free cascade keeps near 0 (Tweedie)
and the metric widens. This module composes runs and reports.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig

from experiments.runs.evaluation import evaluate_images
from experiments.tables.common import check_seeds, paired_cell, pm, scaled
from experiments.tables.digits_models import check, train_model
from experiments.tables.fdistill_digits import make_figure
from scorelib._checks import check_choice, check_int, check_real
from scorelib._io import atomic_write_text
from scorelib.data import load_digits
from scorelib.metrics import cascade_errors
from scorelib.nets.cascade import BLENDS, with_blend

PAPER = (
    "the metric loss on the cascaded module improves FID, sFID and IS over the same "
    "network without it (abstract; LPIPS)"
)
RUNS = {"mse": "cascade, no metric", "metric": "cascade + metric"}
#: The pixel test decides; 'better' needs every seed's C2ST below the no-metric run's.
METRICS = ("c2st_pixels_samples", "recall_pixels_samples", "fd")


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError: naming ``table.<field>`` (seeds, an unknown blend or one given twice, a
        negative or zero ``metric_weight``, ``floor_draws`` < 1, an error sigma not
        positive) or, from building both runs, a bad override.
    """
    tc = scaled(cfg, base="small")
    check_seeds(tc.seeds)
    blends = [check_choice(b, "table.blends", BLENDS) for b in tc.blends]
    if "first" not in blends or len(set(blends)) != len(blends):
        raise ValueError(
            f"table.blends must hold 'first' (the baseline) and no blend twice; got {blends}"
        )
    check_real(tc.metric_weight, "table.metric_weight", low=0.0, low_open=True)
    check_int(tc.floor_draws, "table.floor_draws", low=1)
    check_int(tc.error_examples, "table.error_examples", low=2)
    for s in tc.error_sigmas:
        check_real(s, "table.error_sigmas", low=0.0, low_open=True, high_open=True)
    for overrides in models(tc, 0).values():
        check(overrides)
    return tc


def models(tc: DictConfig, seed: int) -> dict:
    """``{run key: experiments.train overrides}`` of one seed."""
    base = ["experiment=casdm_digits", *tc.overrides, f"trainer.seed={seed}"]
    return {
        "mse": [*base, "objective.metric=none", "objective.metric_weight=0"],
        "metric": [
            *base,
            f"objective.metric={tc.metric}",
            f"objective.metric_weight={tc.metric_weight}",
        ],
    }


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Train both cascades per seed, sample each blend, read them; writes ``results.json``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    digits = load_digits()
    rows, errors, identical, figure = [], [], [], {}
    for seed in (int(s) for s in tc.seeds):
        first = {}
        for key, overrides in models(tc, seed).items():
            r, state, wall = train_model(overrides, run_dir / "runs" / f"{key}_seed{seed}", log)
            params = state.ema_params
            for blend in tc.blends:
                blended = dataclasses.replace(r, graphdef=with_blend(r.graphdef, params, blend))
                x, _ = blended.draw(params, progress=False)
                x = np.asarray(x)
                if blend == "first":
                    first[key] = x
                m = evaluate_images(x, digits, "digits", seed=seed, floor_draws=int(tc.floor_draws))
                rows.append(
                    {
                        "seed": seed,
                        "run": key,
                        "blend": blend,
                        "train_s": wall,
                        **{k: m[k] for k in METRICS},
                        "c2st_pixels_floor": m["c2st_pixels_floor"],
                        "recall_pixels_floor": m["recall_pixels_floor"],
                        "fd_floor": m["fd_floor"],
                    }
                )
                if seed == int(tc.seeds[0]) and (blend != "first" or key == "mse"):
                    figure[label(key, blend)] = x[:64]
                log(
                    f"[{key} {blend} seed {seed}] C2ST {m['c2st_pixels_samples']:.3f}, "
                    f"recall {m['recall_pixels_samples']:.3f}, FD {m['fd']:.2f}"
                )
            source = r.source(params)
            for i, sigma in enumerate(tc.error_sigmas):
                key_i = jax.random.fold_in(jax.random.key(seed), i)
                e = cascade_errors(source, digits.test[: int(tc.error_examples)], sigma, key_i)
                errors.append({"seed": seed, "run": key, "sigma": float(sigma), **e})
        identical.append(float(np.max(np.abs(first["mse"] - first["metric"]))))
    record = {"rows": rows, "errors": errors, "first_max_diff": identical}
    atomic_write_text(run_dir / "results.json", json.dumps(record, indent=1, default=float))
    fig = run_dir / "figure.png"
    make_figure(figure, fig)
    return {**report(record, tc), "figure": str(fig)}


def label(key: str, blend: str) -> str:
    """A row's label: module 1 alone is the same network whichever run it comes from."""
    if blend == "first":
        return "module 1 alone (EDM, no metric)"
    return f"{RUNS[key]}, blend {blend}"


def _cell(v):
    v = np.asarray(v, float)
    return float(v[0]) if v.size == 1 else pm(v.mean(), v.std())


def verdict(metric_rows: list[dict], base_rows: list[dict]) -> str:
    """``'better in every seed'``, ``'worse ...'``, ``'no difference'`` (equal in every seed) or
    ``'mixed'``: the metric rows' pixel C2ST against the no-metric rows' of the same blend,
    seed by seed (lower is better; ``'(one seed)'`` for a single seed)."""
    base = {r["seed"]: r["c2st_pixels_samples"] for r in base_rows}
    diff = [r["c2st_pixels_samples"] - base[r["seed"]] for r in metric_rows]
    seeds = "in every seed" if len(diff) > 1 else "(one seed)"
    if all(d == 0 for d in diff):
        return "no difference"
    if all(d < 0 for d in diff):
        return f"better {seeds}"
    if all(d > 0 for d in diff):
        return f"worse {seeds}"
    return "mixed"


def report(record: dict, tc: DictConfig) -> dict:
    """The samples of every run and blend, then the two modules per noise level."""
    rows_all = record["rows"]
    cols = [
        "model",
        "C2ST pixels (0.5 = indistinguishable)",
        "recall pixels",
        "FD (digits classifier)",
        "vs no metric, same blend (C2ST)",
        "C2ST minus no metric (paired, mean ± se)",
        "recall minus no metric (paired)",
        "train s",
        "paper",
    ]
    rows = []
    for key in RUNS:
        for blend in tc.blends:
            if blend == "first" and key == "metric":
                continue  # module 1 alone: the same network in both runs (checked)
            rs = [r for r in rows_all if r["run"] == key and r["blend"] == blend]
            base = [r for r in rows_all if r["run"] == "mse" and r["blend"] == blend]
            rows.append(
                [
                    label(key, blend),
                    *(_cell([r[k] for r in rs]) for k in METRICS),
                    verdict(rs, base) if key == "metric" else "",
                    paired_cell(rs, base, METRICS[0]) if key == "metric" else "",
                    paired_cell(rs, base, METRICS[1]) if key == "metric" else "",
                    float(np.mean([r["train_s"] for r in rs])),
                    PAPER if key == "metric" and blend == "snr" else "",
                ]
            )
    first = rows_all[0]
    rows.append(
        [
            "training digits (floor)",
            first["c2st_pixels_floor"],
            first["recall_pixels_floor"],
            first["fd_floor"],
            "",
            "",
            "",
            None,
            "",
        ]
    )
    err_rows = []
    for sigma in dict.fromkeys(e["sigma"] for e in record["errors"]):
        cell = []
        for key in RUNS:
            es = [e for e in record["errors"] if e["sigma"] == sigma and e["run"] == key]
            cell += [_cell([e[k] for e in es]) for k in ("first", "second", "gap")]
        err_rows.append([sigma, *cell])
    diff = record["first_max_diff"]
    notes = [
        f"Runs: experiments.train experiment=casdm_digits with {list(tc.overrides)}; "
        f"'no metric' adds objective.metric=none objective.metric_weight=0, 'metric' "
        f"objective.metric={tc.metric} objective.metric_weight={tc.metric_weight}. Samples: "
        "the run's sampler with model.blend set (first: module 1 alone; second: module 2; "
        "snr: r = sigma_data^2 / (sigma^2 + sigma_data^2) of module 2).",
        "Module 1 alone: the largest difference between its samples in the two runs, per "
        f"seed: {', '.join(f'{d:.2g}' for d in diff)} (data units; module 2's losses never "
        "reach it, and each module's gradient is clipped by its own norm).",
        "C2ST and recall in pixels and FD against the clean test digits "
        "(experiments.runs.evaluation.evaluate_images); cells mean ± std over the seeds. The "
        "digits_classifier metric uses the same bundled classifier whose logits FD reads: FD "
        "can move with the metric more than the pixel test; the verdict reads the pixel C2ST.",
        f"Modules: scorelib.metrics.cascade_errors on {int(tc.error_examples)} test digits "
        "noised at each sigma: per-pixel mean squared error of D1, of D2, and the gap "
        "mean (D2 - D1)^2.",
    ]
    err_cols = ["sigma"] + [
        f"{RUNS[k]}: {part}" for k in RUNS for part in ("D1 error", "D2 error", "gap D2 - D1")
    ]
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": [
            {
                "name": "modules",
                "caption": "The two modules on noised test digits (per-pixel squared errors).",
                "columns": err_cols,
                "rows": err_rows,
            },
            {
                "name": "summary",
                "caption": "Cas-DM on the digits: the cascade with and without the metric "
                "loss, sampled with each blend of its two modules.",
                "columns": cols,
                "rows": rows,
            },
        ],
        "notes": notes,
    }
