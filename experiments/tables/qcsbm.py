"""Quasi-conservative score models on the digits: ``python -m experiments.reproduce table=qcsbm``.

Chao, Sun, Cheng and Lee, "On investigating the conservative property of score-based
generative models", ICML 2022 (arXiv 2209.12753): the objective plus ``weight * w(t)
|J - J^T|_F^2`` on the score network's Jacobian, Hutchinson-estimated with one JVP and one
VJP per probe (``scorelib.objectives.conservative``; ``penalty=qc penalty.weight=...``).

Rows, per training seed of ``table.seeds`` (each one ``experiments.train`` run composed from
``table.overrides`` with ``trainer.seed``):

* ``no penalty``: the base model (2,000 steps);
* the authors' recipe: the base model fine-tuned (``init_from`` its EMA weights,
  ``table.finetune``: 400 more steps) without the penalty (the control) and with it at each
  weight of ``table.weights``; the paper's ``balancing_fac`` 1e-4 on a summed DSM loss is
  about 1.6e-6 on the preset's mean EDM loss (``configs/table/qcsbm.yaml``);
* ``table.scratch_weights``: the penalty on from the first step (the table's first recipe), at
  the seeds of ``table.scratch_seeds``.

Per model:

* the asymmetry of its score's Jacobian on noised test digits at each VE-frame noise level
  of ``table.asym_sigmas`` (``scorelib.metrics.score_asymmetry``, exact: the whole Jacobian
  by forward mode): the share of ``|J|_F^2`` in its antisymmetric part (the paper's NAsym,
  pooled; 0 for a gradient field) and ``|J - J^T|_F^2`` itself;
* sample quality against the test digits (``experiments.runs.evaluation.evaluate_images``):
  the pixel two-sample test (C2ST accuracy, 0.5 = indistinguishable) and recall, also in
  the bundled classifier's features, FD beside them;
* bits/dim of the test digits under the PF-ODE (a likelihood, meaningful for a
  conservative field: the ODE's density is that of the field's flow either way, but only a
  gradient field is the score of that density).

Each penalised row is compared seed by seed with its control (the fine-tuned unpenalised
model, or the base model for a from-scratch row): the NAsym ratio and the paired
differences of C2ST, recall, FD and bits/dim, and a verdict on the paper's claim
(asymmetry lowered at every level, quality and likelihood not worse by more than two
standard errors of the paired difference).

This module composes runs of the library and reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig

from experiments.tables.common import (
    check_seeds,
    paired_cell,
    paired_difference,
    pm,
    quoted_path,
    scaled,
)
from experiments.tables.digits_models import (
    CELLS_NOTE,
    FLOOR_KEYS,
    QUALITY_COLUMNS,
    cells,
    check,
    quality_note,
    trained_models,
)
from experiments.tables.fdistill_digits import make_figure
from scorelib._checks import check_int, check_real
from scorelib._io import atomic_write_text
from scorelib.data import load_digits
from scorelib.metrics import score_asymmetry

PAPER = (
    "the penalty lowers the asymmetry while sample quality and likelihood are kept "
    "(abstract and Sec. 5; CIFAR-10/100, ImageNet, SVHN)"
)
NO_PENALTY = "no penalty"
CONTROL = "no penalty, fine-tuned"
#: The paired comparisons with the control: (column, row key, worse when larger).
PAIRED = (
    ("C2ST pixels", "c2st_pixels_samples"),
    ("recall pixels", "recall_pixels_samples"),
    ("FD", "fd"),
    ("bits/dim", "bpd"),
)


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError: naming ``table.<field>`` (a weight or noise level <= 0, seeds that are not
        distinct integers, a scratch seed not among ``table.seeds``,
        ``table.asym_examples`` outside [1, 359]) or, from Hydra, a bad override.
    """
    tc = scaled(cfg, base="small")
    for field in ("weights", "scratch_weights"):
        for w in tc[field]:
            check_real(w, f"table.{field}", low=0.0, low_open=True, high_open=True)
        if len({float(w) for w in tc[field]}) != len(tc[field]):
            raise ValueError(f"table.{field} must be distinct; got {list(tc[field])}")
    if not tc.asym_sigmas:
        raise ValueError("table.asym_sigmas must list at least one noise level > 0")
    for s in tc.asym_sigmas:
        check_real(s, "table.asym_sigmas", low=0.0, low_open=True, high_open=True)
    seeds = check_seeds(tc.seeds)
    bad = [s for s in tc.scratch_seeds if s not in seeds]
    if len(set(tc.scratch_seeds)) != len(tc.scratch_seeds):
        raise ValueError(f"table.scratch_seeds must be distinct; got {list(tc.scratch_seeds)}")
    if bad:
        raise ValueError(f"table.scratch_seeds must be among table.seeds {seeds}; got {bad}")
    n_test = load_digits().test.shape[0]
    check_int(tc.asym_examples, "table.asym_examples", low=1, high=n_test)
    check_int(tc.floor_draws, "table.floor_draws", low=1)
    for _, overrides, _ in models(tc, seeds[0], Path("<run_dir>")).values():
        check(overrides)  # a bad override (penalty.probes, ...) fails here
    return tc


def models(tc: DictConfig, seed: int, run_dir: Path) -> dict:
    """``{row label: (run slug, overrides, control label or None)}`` of one training seed,
    in training order (a fine-tuned run starts from ``<run_dir>/runs/none_seed<seed>``)."""
    base = [*tc.overrides, f"trainer.seed={seed}"]
    penalty = lambda w: ["penalty=qc", f"penalty.weight={w}", *tc.penalty]  # noqa: E731
    none = f"none_seed{seed}"
    finetune = [*base, f"init_from={quoted_path(Path(run_dir) / 'runs' / none)}", *tc.finetune]
    out = {NO_PENALTY: (none, base, None)}
    if tc.weights:
        out[CONTROL] = (f"ft_none_seed{seed}", finetune, None)
    for w in tc.weights:
        out[f"QC fine-tuned, weight {w:g}"] = (
            f"ft_qc_{w:g}_seed{seed}",
            [*finetune, *penalty(w)],
            CONTROL,
        )
    if seed in tc.scratch_seeds:
        for w in tc.scratch_weights:
            out[f"QC from scratch, weight {w:g}"] = (
                f"qc_{w:g}_seed{seed}",
                [*base, *penalty(w)],
                NO_PENALTY,
            )
    return out


def asymmetry(source, process, x0, tc: DictConfig, seed: int) -> dict:
    """``{sigma: score_asymmetry(...) without per_example}`` at each of ``table.asym_sigmas``."""
    out = {}
    for i, sigma in enumerate(tc.asym_sigmas):
        t = float(process.t_of_ve_sigma(float(sigma)))
        r = score_asymmetry(
            source, x0, t, jax.random.key(1000 * seed + i), method="exact", batch_size=64
        )
        r.pop("per_example")
        out[float(sigma)] = r
    return out


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Train every model, measure its asymmetry and sample quality; writes
    ``results.json`` and ``figure.png`` into ``run_dir``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    clean = load_digits()
    x0 = clean.test[: int(tc.asym_examples)]
    seeds = [int(s) for s in tc.seeds]
    results, figure = [], {}
    table = lambda seed: {k: v[:2] for k, v in models(tc, seed, run_dir).items()}  # noqa: E731
    rows = trained_models(tc, table, run_dir, clean, likelihood=True, log=log)
    for label, trun, state, x, row in rows:
        asym = asymmetry(trun.source(state.ema_params), trun.process, x0, tc, row["seed"])
        control = models(tc, row["seed"], run_dir)[label][2]
        results.append({"label": label, "control": control, "asymmetry": asym, **row})
        rel = ", ".join(f"{s:g}: {a['relative']:.3f}" for s, a in asym.items())
        log(f"[{label}, seed {row['seed']}] NAsym at sigma {rel}; bits/dim {row['bpd']:.3f}")
        if row["seed"] == seeds[0]:
            figure[label] = x[:64]
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1, default=str))
    fig = run_dir / "figure.png"
    make_figure(figure, fig)
    return report(results, tc, fig)


def _asym_cells(rs: list, key: str, sigmas) -> list:
    out = []
    for s in sigmas:
        v = np.array([r["asymmetry"][float(s)][key] for r in rs], float)
        out.append(float(v[0]) if v.size == 1 else pm(v.mean(), v.std()))
    return out


def asym_ratio(rs: list, base: list, sigma: float) -> np.ndarray:
    """NAsym of each seed's penalised model over its control's, at ``sigma``."""
    ctrl = {r["seed"]: r["asymmetry"][sigma]["relative"] for r in base}
    return np.array([r["asymmetry"][sigma]["relative"] / ctrl[r["seed"]] for r in rs], float)


def verdict(rs: list, base: list, sigmas) -> str:
    """The paper's claim on one penalised row against its control, seed by seed: the
    asymmetry lowered (NAsym below the control's at every level in every seed), and sample
    quality and likelihood kept (no paired difference worse by more than two standard
    errors: C2ST, FD and bits/dim up, recall down)."""
    lowered = all(np.all(asym_ratio(rs, base, s) < 1.0) for s in sigmas)
    worse = []
    for name, key in PAIRED:
        p = paired_difference(rs, base, key)
        sign = -1.0 if key.startswith("recall") else 1.0
        if p["n"] > 1 and sign * p["mean"] > 2.0 * p["se"]:
            worse.append(name)
    head = "asymmetry lowered" if lowered else "asymmetry NOT lowered in every seed and level"
    if len(rs) == 1:
        return head + "; quality not judged (one seed)"
    return head + ("; worse: " + ", ".join(worse) if worse else "; quality and likelihood kept")


def report(results: list, tc: DictConfig, fig: Path) -> dict:
    """The summary table (asymmetry and sample quality per model), the paired comparison of
    every penalised row with its control, and the absolute asymmetry table."""
    sigmas = [float(s) for s in tc.asym_sigmas]
    keys = [k for _, k in QUALITY_COLUMNS]
    cols = [
        "model",
        *(f"NAsym at sigma {s:g}" for s in sigmas),
        *(c for c, _ in QUALITY_COLUMNS),
        "bits/dim (test)",
        "seeds",
        "train s",
    ]
    paired_cols = [
        "model",
        "control",
        *(f"NAsym / control at sigma {s:g}" for s in sigmas),
        *(f"{c} minus control (paired, mean ± se)" for c, _ in PAIRED),
        "verdict",
        "paper",
    ]
    abs_cols = [
        "model",
        *(f"|J - J^T|_F^2 at sigma {s:g}" for s in sigmas),
        *(f"|J|_F^2 at sigma {s:g}" for s in sigmas),
    ]
    rows, paired_rows, abs_rows = [], [], []
    for label in dict.fromkeys(r["label"] for r in results):
        rs = [r for r in results if r["label"] == label]
        bpd = np.array([r["bpd"] for r in rs], float)
        rows.append(
            [
                label,
                *_asym_cells(rs, "relative", sigmas),
                *cells(rs, keys),
                float(bpd[0]) if bpd.size == 1 else pm(bpd.mean(), bpd.std()),
                len(rs),
                float(np.mean([r["train_s"] for r in rs])),
            ]
        )
        abs_rows.append(
            [
                label,
                *_asym_cells(rs, "asymmetry", sigmas),
                *_asym_cells(rs, "frobenius", sigmas),
            ]
        )
        control = rs[0]["control"]
        if control is None:
            continue
        base = [r for r in results if r["label"] == control]
        ratios = []
        for s in sigmas:
            v = asym_ratio(rs, base, s)
            ratios.append(float(v[0]) if v.size == 1 else pm(v.mean(), v.std()))
        paired_rows.append(
            [
                label,
                control,
                *ratios,
                *(paired_cell(rs, base, key) for _, key in PAIRED),
                verdict(rs, base, sigmas),
                PAPER,
            ]
        )
    first = results[0]
    rows.append(
        [
            "training digits (floor)",
            *([None] * len(sigmas)),
            *cells([first], FLOOR_KEYS.values()),
            None,
            None,
            None,
        ]
    )
    notes = [
        f"Models: experiments.train with {list(tc.overrides)} (trainer.seed over the seeds). "
        f"Fine-tuned rows start from the unpenalised model's EMA weights (init_from) and add "
        f"{list(tc.finetune)}; penalised rows add penalty=qc, penalty.weight and "
        f"{list(tc.penalty)}. From-scratch rows: seeds {list(tc.scratch_seeds)}.",
        "Penalty weight: the preset's EDM loss is a mean over the 64 pixels and the penalty "
        "is not, so weight w acts like the authors' balancing_fac w * 64 / (1 + sigma^2 / "
        "sigma_data^2) on their DSM loss summed over the dimensions: their image setting 1e-4 "
        "is about 1.6e-6 here, their 2-D toys' 0.1 about 1.6e-3.",
        f"NAsym: sum |J - J^T|_F^2 / (4 sum |J|_F^2) over {tc.asym_examples} test digits "
        "noised at each sigma (scorelib.metrics.score_asymmetry, exact Jacobian; 0 for a "
        "gradient field, 1 for a purely rotational one); absolute values in the table "
        "asymmetry.",
        quality_note(first),
        "Bits/dim: the test digits under the PF-ODE, uniformly dequantised, one Hutchinson "
        f"probe per image (uniform over the levels: {first['bpd_uniform']:.2f}; a Gaussian "
        f"fit: {first['bpd_gaussian']:.2f}); standard error over images {first['bpd_se']:.2f}.",
        "Paired: each penalised model against its control of the same seed (the fine-tuned "
        "unpenalised model, or the base model for a from-scratch row); NAsym / control is "
        "the mean ± std over seeds of the ratio; differences are mean ± standard error over "
        "seeds. Verdict: asymmetry lowered if NAsym is below the control's at every level in "
        "every seed; a metric is worse if its paired difference is worse by more than two "
        "standard errors.",
        CELLS_NOTE,
    ]
    tables = [
        {
            "name": "summary",
            "caption": "Quasi-conservative penalty on the digits: Jacobian asymmetry "
            "and sample quality with and without it.",
            "columns": cols,
            "rows": rows,
        },
    ]
    if paired_rows:
        tables.append(
            {
                "name": "paired",
                "caption": "Each penalised model against its unpenalised control, seed by "
                "seed, and the paper's claim.",
                "columns": paired_cols,
                "rows": paired_rows,
            }
        )
    tables.append(
        {
            "name": "asymmetry",
            "caption": "The score Jacobian's asymmetry and squared norm (data units^-4), "
            "mean over the test digits.",
            "columns": abs_cols,
            "rows": abs_rows,
        }
    )
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": tables,
        "notes": notes,
        "figure": str(fig),
    }
