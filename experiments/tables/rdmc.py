"""Reverse diffusion Monte Carlo against Langevin: ``python -m experiments.reproduce table=rdmc``.

Huang, Dong, Hao, Ma and Zhang, "Reverse diffusion Monte Carlo", ICLR 2024 (arXiv
2307.02037); abstract: "For multi-modal target distributions such as those in Gaussian
mixture models, rdMC greatly improves over the Langevin-style MCMC sampling methods both
theoretically and in practice."

For each target of ``table.targets`` (a 2-D mixture of four separated modes, the 4-D
many-well) and seed: rdMC samples (Euler-Maruyama on the reverse OU process of
``scorelib.processes.ornstein_uhlenbeck(table.horizon)``, the sampler's driver binding the
source's draws to each example, each score a ``scorelib.scores.ReverseDiffusionScore`` of one
``table.variants`` entry), plain ULA and MALA chains from the OU prior
(``scorelib.samplers.langevin_mcmc``) given the largest rdMC gradient count
(``ReverseDiffusionScore.target_evaluations``; MALA also at ``table.long_budget`` times it)
of the variants not marked ``beyond_budget: true`` (the long-chain rows, beside the short
ones, are not what the Langevin rows are matched to),
the same reverse process with the exact score (the error of the sampler and its start
alone) and exact samples (the floor). Reported per row (mean ± std over seeds): target gradient and
log-density evaluations per sample, the total variation between the mode masses and the true
weights (``scorelib.metrics.mode_statistics`` / ``well_mode_statistics``), the squared energy
distance to a fresh exact sample (``scorelib.metrics.energy_distance``), non-finite samples
and wall time. This module only runs the library and writes the results.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments.runs.layout import pyplot, save_figure
from experiments.tables.common import check_seeds, seed_cell
from scorelib._io import atomic_write_text
from scorelib.data.targets import ManyWellTarget, make_target
from scorelib.metrics import energy_distance, mode_statistics, well_mode_statistics
from scorelib.processes import ornstein_uhlenbeck
from scorelib.samplers import (
    draw_samples,
    euler_maruyama,
    langevin_mcmc,
    steps_for_budget,
    uniform_t_grid,
)
from scorelib.scores import ReverseDiffusionScore

ORACLE = "reverse OU with the exact score (no estimation error)"
PAPER = "large gains over Langevin on mixtures (abstract: 'greatly improves')"
INNER_FIELDS = ("n_samples", "n_steps", "step_size", "n_proposals")
VARIANT_FIELDS = (*INNER_FIELDS, "method", "init", "estimator", "beyond_budget")


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config with ``smoke`` applied (its ``variants`` replace the full list),
    checked before anything is compiled.

    Raises:
      ValueError: naming ``table.<field>``.
    """
    tc = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    scale = tc.get("scale", "full")
    if scale not in ("full", "smoke"):
        raise ValueError(f"table.scale must be full or smoke; got {scale!r}")
    if scale == "smoke":
        smoke = OmegaConf.create(OmegaConf.to_container(tc.smoke))
        variants = smoke.pop("variants", None)
        tc = OmegaConf.merge(tc, smoke)
        if variants is not None:
            tc.variants = variants
    check_seeds(tc.seeds)
    for field, low in (("samples", 10), ("outer_steps", 1), ("long_budget", 1)):
        v = tc.get(field)
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"table.{field} must be an integer >= {low}; got {v!r}")
    for k in tc.inner:
        if k not in INNER_FIELDS:
            raise ValueError(f"table.inner.{k} is not an inner option (have {INNER_FIELDS})")
    if not tc.variants:
        raise ValueError("table.variants must list at least one rdMC variant")
    for name, v in tc.variants.items():
        for k in v:
            if k not in VARIANT_FIELDS:
                raise ValueError(
                    f"table.variants.{name}.{k} is not a ReverseDiffusionScore option "
                    f"(have {VARIANT_FIELDS})"
                )
    if not tc.targets:
        raise ValueError("table.targets must list at least one target")
    return tc


def sources(tc, spec) -> tuple:
    """``(target, process, grid, {row name: ReverseDiffusionScore})`` of one target; every
    option is checked here (one-line ``ValueError`` naming it)."""
    target = make_target(**spec.target)
    process = ornstein_uhlenbeck(float(tc.horizon))
    grid = uniform_t_grid(process, int(tc.outer_steps))
    out = {}
    for name, variant in tc.variants.items():
        opts = {**tc.inner, **variant}
        opts.pop("beyond_budget", None)
        if opts.get("init", "scaled") != "importance":
            opts.pop("n_proposals", None)
        out[name] = ReverseDiffusionScore.create(
            target, process=process, curvature=float(spec.curvature), **opts
        )
    return target, process, grid, out


def measure(x: np.ndarray, target, reference: np.ndarray, tc) -> dict:
    """Mode masses, their TV to the weights and the energy distance of the finite samples."""
    finite = np.isfinite(x).all(axis=1)
    x = x[finite]
    row = {"nonfinite": int((~finite).sum())}
    if len(x) == 0:
        return {**row, "tv": 1.0, "energy": float("nan"), "mass": None, "weights": None}
    if isinstance(target, ManyWellTarget):
        s = well_mode_statistics(x, target)
        weights = s["weights"]
    else:
        s = mode_statistics(x, target, radius=float(tc.radius))
        weights = target.weights
    return {
        **row,
        "tv": s["tv"],
        "energy": float(energy_distance(x, reference)),
        "mass": np.asarray(s["mass"]).tolist(),
        "weights": np.asarray(weights).tolist(),
    }


def run_target(tc, name: str, spec, log) -> tuple[dict, dict, object]:
    """Every row of one target over the seeds: ``({row: [per-seed dicts]}, {row: samples of
    the first seed}, target)``."""
    target, process, grid, srcs = sources(tc, spec)
    d, n = int(target.dim), int(tc.samples)
    rows, first = {}, {}

    def add(row, seed, x, evals, wall, ref):
        m = measure(np.asarray(x), target, ref, tc)
        rows.setdefault(row, []).append({"seed": seed, **evals, "wall_s": wall, **m})
        if row not in first:
            first[row] = np.asarray(x)
        log(
            f"[{name} seed {seed}] {row}: TV {m['tv']:.3f}, energy {m['energy']:.4f}, "
            f"{evals['grad']} grads, {wall:.1f} s"
        )

    for seed in (int(s) for s in tc.seeds):
        key = jax.random.key(seed)
        ref = np.asarray(target.sample(jax.random.key(2000 + seed), n))
        for row, src in srcs.items():
            t0 = time.perf_counter()
            x, info = draw_samples(
                euler_maruyama,
                src,
                key,
                (d,),
                num_samples=n,
                batch_size=n,
                grid=grid,
            )
            add(row, seed, x, src.target_evaluations(info["nfe"]), time.perf_counter() - t0, ref)
        matched = [r for r in srcs if not tc.variants[r].get("beyond_budget", False)]
        budget = max(rows[row][-1]["grad"] for row in matched)
        for method, mult in (("ula", 1), ("mala", 1), ("mala", int(tc.long_budget))):
            row = f"{method.upper()}" + ("" if mult == 1 else f" ({mult}x budget)")
            t0 = time.perf_counter()
            x, info = langevin_mcmc(
                target,
                key,
                n,
                n_steps=steps_for_budget(method, mult * budget),
                step_size=float(tc.inner.step_size),
                curvature=float(spec.curvature),
                method=method,
            )
            evals = {"grad": info["grad_evals"], "density": info["density_evals"]}
            add(row, seed, x, evals, time.perf_counter() - t0, ref)
            rows[row][-1]["acceptance"] = info["acceptance"]
        t0 = time.perf_counter()  # the same sampler and grid with the exact score of p_t
        x, _ = draw_samples(
            euler_maruyama,
            target.noisy_score(process),
            key,
            (d,),
            num_samples=n,
            batch_size=n,
            grid=grid,
        )
        add(ORACLE, seed, x, {"grad": None, "density": None}, time.perf_counter() - t0, ref)
        t0 = time.perf_counter()
        x = np.asarray(target.sample(jax.random.key(3000 + seed), n))
        add("exact samples", seed, x, {"grad": 0, "density": 0}, time.perf_counter() - t0, ref)
    return rows, first, target


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Run every target, write ``results.json`` and ``figure.png``; return the tables."""
    tc = _settings(cfg)
    for spec in tc.targets.values():  # every option checked before any sampling
        sources(tc, spec)
    run_dir = Path(run_dir)
    results, samples, targets = {}, {}, {}
    for name, spec in tc.targets.items():
        results[name], samples[name], targets[name] = run_target(tc, name, spec, log)
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1))
    fig = run_dir / "figure.png"
    make_figure(samples, targets, fig)
    return report(results, tc, fig)


def report(results: dict, tc, fig: Path) -> dict:
    """The summary and mode-mass tables from ``results`` (``{target: {row: [per seed]}}``)."""
    cols = [
        "target",
        "method",
        "grad evals / sample",
        "log-density evals / sample",
        "TV of mode masses to weights",
        "energy distance",
        "non-finite",
        "wall s",
        "paper",
    ]
    rows, mass_rows = [], []
    for name, by_row in results.items():
        weights = np.asarray(by_row["exact samples"][0]["weights"])
        for row, runs in by_row.items():
            rows.append(
                [
                    name,
                    row,
                    runs[0]["grad"],
                    runs[0]["density"],
                    seed_cell(runs, "tv"),
                    seed_cell(runs, "energy"),
                    f"{sum(r['nonfinite'] for r in runs)} of {len(runs) * int(tc.samples)}",
                    fmt_wall(runs),
                    PAPER if row.startswith("rdMC") else "",
                ]
            )
            masses = [r["mass"] for r in runs if r["mass"] is not None]
            mean = np.mean(masses, 0) if masses else np.full(len(weights), np.nan)
            mass_rows.append([name, row, " ".join(f"{m:.3f}" for m in mean)])
        mass_rows.append([name, "truth (weights)", " ".join(f"{w:.3f}" for w in weights)])
    notes = [
        f"rdMC: Euler-Maruyama on the reverse OU process from OU time {tc.horizon} "
        f"({tc.outer_steps} steps uniform in time, the last a Tweedie step), start "
        f"N(0, (1 - e^(-2T)) I); inner chains {dict(tc.inner)} unless the row says otherwise. "
        "The same sampler with the exact score of p_t (an oracle: the mixture's closed form, "
        "the many-well's quadrature) shows the error of the sampler and of its start alone.",
        "Langevin rows: one chain per sample from N(0, I), step step_size / curvature, given "
        "the largest rdMC gradient count (one extra MALA row 'Nx budget'); rdMC's importance "
        "start costs log-density evaluations but no gradients (column 4).",
        "TV: 0.5 sum |mode mass - weight| (mixture: nearest mode within Mahalanobis radius "
        f"{tc.radius}, off-mode samples count in no mode; many-well: side of each barrier). "
        f"Energy distance: squared, V-statistic, against {tc.samples} fresh exact samples. "
        "Mean ± std over seeds. Samples with a NaN or inf are counted in 'non-finite' and "
        "left out of the TV and the energy distance (which then describe the rest only).",
        "The paper column quotes the abstract; its tables were not available to check.",
    ]
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": [
            {
                "name": "summary",
                "caption": "rdMC against ULA and MALA at equal gradient evaluations.",
                "columns": cols,
                "rows": rows,
            },
            {
                "name": "mass",
                "caption": "Fraction of samples in each mode, mean over seeds (mixture: "
                "modes in the target's order; many-well: left/right bits of the wells).",
                "columns": ["target", "method", "mode masses"],
                "rows": mass_rows,
            },
        ],
        "notes": notes,
        "figure": str(fig),
    }


def fmt_wall(runs) -> str:
    """Mean wall time over seeds, seconds (as text, one decimal)."""
    return f"{np.mean([r['wall_s'] for r in runs]):.1f}"


def make_figure(samples: dict, targets: dict, path: Path) -> None:
    """Samples of the first seed per row (mixture: both coordinates; many-well: the two
    well coordinates)."""
    plt = pyplot()
    n_cols = 5
    lines = {name: -(-len(rows) // n_cols) for name, rows in samples.items()}
    fig, axes = plt.subplots(
        sum(lines.values()),
        n_cols,
        figsize=(2.2 * n_cols, 2.5 * sum(lines.values())),
        squeeze=False,
    )
    first_line = 0
    for name, rows in samples.items():
        target = targets[name]
        dims = np.nonzero(target.well_mask)[0][:2] if isinstance(target, ManyWellTarget) else [0, 1]
        for j, (row, x) in enumerate(rows.items()):
            ax = axes[first_line + j // n_cols, j % n_cols]
            x = x[np.isfinite(x).all(1)]
            ax.scatter(x[:, dims[0]], x[:, dims[1]], s=0.5, alpha=0.4)
            ax.set_title(textwrap.fill(f"{name}: {row}", 34), fontsize=6)
            ax.set_xlim(-6, 6), ax.set_ylim(-6, 6), ax.set_aspect("equal")
            ax.set_xticks([]), ax.set_yticks([])
        for j in range(len(rows), lines[name] * n_cols):
            axes[first_line + j // n_cols, j % n_cols].axis("off")
        first_line += lines[name]
    save_figure(fig, path)
