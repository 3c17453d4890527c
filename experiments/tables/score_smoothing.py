"""Score smoothing's interpolation: ``python -m experiments.reproduce table=score_smoothing``.

Chen, "On the interpolation effect of score smoothing in diffusion models" (arXiv
2502.19499, ICLR 2026): with training points on a line, smoothing the empirical score makes
the denoising dynamics land between the points along the line, not on them, and scores
learned by networks do the same (``scorelib.scores.line_smoothing``).

Per seed of ``table.seeds``, on the four points of ``configs/experiment/line_points.yaml``
(``table.overrides``; their positions along the line are read from the preset's target):
``table.num_samples`` starts drawn from the noised training set at ``table.sigma0`` (along
the line and across it), then the probability-flow ODE to noise 0 by Heun
(``table.steps`` steps, EDM grid) with

* the smoothed piecewise-linear empirical score at each ``kappa`` of ``table.kappas``
  (``SmoothedLineScore``), beside its closed-form endpoint law;
* the exact empirical score of the four points (``EmpiricalScore``): memorisation;
* a network trained on the points (an ``experiments.train`` run): the same ODE from the
  same starts, and its own sampler from ``sigma_max`` (its preset's Heun).

Each sample set is read by ``line_statistics``: the fraction farther than ``table.tol``
from every point along the line ("between"), the mean distance to the line and the mean
distance along it to the nearest point; for the network from ``sigma0``, the smoothing
``kappa`` whose closed form leaves the same mass between (``kappa_for_between``). This
module composes library calls and reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig

from experiments.build import build_data
from experiments.runs.layout import pyplot, save_figure
from experiments.tables.common import check_seeds, pm, scaled
from experiments.tables.digits_models import check, compose, slug, train_model
from scorelib._checks import check_int, check_real, require
from scorelib._io import atomic_write_text
from scorelib.samplers import edm_grid, heun
from scorelib.scores import EmpiricalScore, SmoothedLineScore
from scorelib.scores.line_smoothing import (
    along_line,
    endpoint_law,
    kappa_for_between,
    line_statistics,
    line_through,
)

PAPER = (
    "smoothing the empirical score makes samples interpolate the training points along "
    "their line; learned scores do the same (abstract)"
)


def line_of(target) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(positions [n], origin [d], direction [d])`` of a mixture target whose means lie on a
    line (``scorelib.scores.line_smoothing.line_through``).

    Raises:
      ValueError: naming ``table.overrides`` when the means are not on one line.
    """
    try:
        return line_through(target.means)
    except ValueError as e:
        raise ValueError(f"table.overrides: a target whose means lie on a line ({e})") from None


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError: naming ``table.<field>`` (seeds, ``sigma0`` <= 0, a ``kappa`` < 0 or with
        ``kappa sigma0`` at least the half gap, ``steps``/``num_samples`` < 1, ``tol`` <= 0,
        a target whose means are not on a line) or a bad override.
    """
    tc = scaled(cfg, base="small")
    check_seeds(tc.seeds)
    s0 = check_real(tc.sigma0, "table.sigma0", low=0.0, low_open=True)
    check_int(tc.steps, "table.steps", low=1)
    check_int(tc.num_samples, "table.num_samples", low=1)
    check_real(tc.tol, "table.tol", low=0.0, low_open=True)
    check(model_overrides(tc, 0))
    y, _, _ = line_of(build_data(compose(model_overrides(tc, 0))).target)
    h = 0.5 * np.diff(y).min()
    require(len(tc.kappas) >= 1, "table.kappas", "a list of smoothing levels", [])
    for k in tc.kappas:
        check_real(k, "table.kappas", low=0.0, high=h / s0, high_open=True)
    return tc


def model_overrides(tc: DictConfig, seed: int) -> list[str]:
    return [*tc.overrides, f"trainer.seed={seed}"]


def ode(source, x0, sigma0: float, steps: int) -> np.ndarray:
    """Heun from ``sigma0`` to 0 on the EDM grid (``sigma_min`` 1e-3), started at ``x0``."""
    grid = edm_grid(steps, sigma_min=1e-3, sigma_max=sigma0)
    x, _ = heun(source, jax.random.key(0), x0.shape, grid=grid, x_T=x0)
    return np.asarray(x)


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Train the network per seed, run every ODE, read every sample set; writes
    ``results.json`` and ``figure.png`` into ``run_dir``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    s0, steps, n, tol = float(tc.sigma0), int(tc.steps), int(tc.num_samples), float(tc.tol)
    results, figure = [], {}
    for seed in (int(s) for s in tc.seeds):
        run_, state, _ = train_model(
            model_overrides(tc, seed), run_dir / "runs" / slug(f"network_seed{seed}"), log
        )
        target = build_data(run_.cfg).target
        y, o, u = line_of(target)
        means = np.asarray(target.means, np.float64)
        rng = np.random.default_rng(seed)
        x0 = (means[rng.integers(0, len(y), n)] + s0 * rng.normal(size=(n, u.size))).astype(
            np.float32
        )

        def stats(x, label, _line=(y, o, u), _seed=seed, **extra):
            return _read(results, x, _line, tol, _seed, label, log, **extra)

        process = run_.process
        for k in (float(v) for v in tc.kappas):
            src = SmoothedLineScore.create(process, y, kappa=k, direction=u, origin=o)
            x = ode(src, x0, s0, steps)
            stats(
                x,
                f"smoothed, kappa {k:g}",
                law=endpoint_law(y, kappa=k, sigma0=s0, tol=tol)["between_tol"],
            )
            if seed == int(tc.seeds[0]):
                figure[f"smoothed score, kappa {k:g}"] = x
        exact = EmpiricalScore.create(process, means.astype(np.float32))
        stats(ode(exact, x0, s0, steps), "exact empirical score", law=0.0)
        net = run_.source(state.ema_params)
        x = ode(net, x0, s0, steps)
        st = stats(x, "network, ODE from sigma0")
        most = endpoint_law(y, kappa=0.0, sigma0=s0, tol=tol)["between_tol"]
        if st["between"] < most:  # else more than any kappa leaves: outside the model
            results[-1]["kappa_eff"] = kappa_for_between(y, st["between"], sigma0=s0, tol=tol)
        xs, _ = run_.draw(state.ema_params, progress=False)
        stats(np.asarray(xs)[:n], "network, its sampler from sigma_max")
        if seed == int(tc.seeds[0]):
            figure["network, ODE from sigma0"] = x
            figure["network, its sampler"] = np.asarray(xs)[:n]
            figure["training points"] = means
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1, default=float))
    fig = run_dir / "figure.png"
    make_figure(figure, fig)
    return report(results, tc, fig)


def _read(results, x, line, tol, seed, label, log, **extra) -> dict:
    """``line_statistics`` of samples ``x`` appended to ``results`` as one row."""
    y, o, u = line
    st = line_statistics(x, y, direction=u, origin=o, tol=tol)
    results.append({"seed": seed, "row": label, **st, **extra})
    log(f"[seed {seed}] {label}: between {st['between']:.3f}")
    return st


def _cell(v):
    v = np.asarray([x for x in v if x is not None], float)
    if v.size == 0:
        return None
    return float(v[0]) if v.size == 1 else pm(v.mean(), v.std())


def report(results: list, tc: DictConfig, fig: Path) -> dict:
    """One row per score (smoothing levels, exact, network)."""
    cols = [
        "score",
        f"between (> {float(tc.tol):g} from every point), closed form",
        "between, measured",
        "distance to the line",
        "offset along the line",
        "effective kappa",
        "paper",
    ]
    rows = []
    for label in dict.fromkeys(r["row"] for r in results):
        rs = [r for r in results if r["row"] == label]
        rows.append(
            [
                label,
                _cell([r.get("law") for r in rs]),
                _cell([r["between"] for r in rs]),
                _cell([r["distance"] for r in rs]),
                _cell([r["offset"] for r in rs]),
                _cell([r.get("kappa_eff") for r in rs]),
                PAPER if not rows else "",
            ]
        )
    notes = [
        f"Points: configs/experiment/line_points.yaml ({list(tc.overrides)}): four Gaussians of "
        "std 0.01 at -3, -1, 1, 3 along (1, 1)/sqrt(2); the network is experiments.train on "
        "them (trainer.seed over the seeds).",
        f"Starts: {int(tc.num_samples)} draws of the noised training set at sigma0 = "
        f"{float(tc.sigma0):g} per seed; Heun to 0 in {int(tc.steps)} steps (EDM grid, "
        "sigma_min 1e-3), except the last row (the network's own sampler from sigma_max).",
        "Between: the fraction of samples farther than table.tol from every point along the "
        "line; its closed form scorelib.scores.line_smoothing.endpoint_law(tol=...) for the "
        "smoothed scores. Effective kappa: the smoothing whose closed form leaves the "
        "network's measured fraction between (kappa_for_between; blank when it exceeds what "
        "kappa = 0 leaves, outside the model). Cells: mean ± std over the seeds.",
    ]
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": [
            {
                "name": "summary",
                "caption": "Samples of the ODE from the noised training points at sigma0: how "
                "many land between the points, by score.",
                "columns": cols,
                "rows": rows,
            }
        ],
        "notes": notes,
        "figure": str(fig),
    }


def make_figure(panels: dict, path: Path) -> None:
    """Histograms along the line of each score's samples, the training points marked."""
    plt = pyplot()
    y, o, u = line_through(panels.pop("training points"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(6.0, 1.2 * len(panels)), sharex=True)
    for ax, (title, x) in zip(np.atleast_1d(axes), panels.items(), strict=True):
        a = along_line(x, direction=u, origin=o)
        ax.hist(a, bins=200, range=(-4.5, 4.5), color="C0")
        for p in y:
            ax.axvline(p, color="C3", lw=0.6)
        ax.set_yticks([])
        ax.set_ylabel(title, fontsize=6, rotation=0, ha="right", va="center")
    np.atleast_1d(axes)[-1].set_xlabel("position along the line (training points in red)")
    save_figure(fig, path)
