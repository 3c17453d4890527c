"""Early-stopped Langevin from the data: ``python -m experiments.reproduce table=data_langevin``.

Koehler and Vuong, "Sampling multimodal distributions with the vanilla score: benefits of
data-based initialization", ICLR 2024 (arXiv 2310.01762): Langevin dynamics on a score
estimated at one noise level (the "vanilla" score), started at training examples drawn
uniformly and stopped early, samples a mixture of log-concave components with the right
weights; Langevin from noise does not (``scorelib.samplers.data_langevin``).

Per seed of ``table.seeds``, on the mixture of ``configs/experiment/langevin_gmm.yaml``
(``table.overrides``):

* two vanilla scores at ``sigma0`` (the vanilla network's ``objective.t_range``): the
  mixture's exact noised score, and a network trained by DSM at that one level
  (``table.vanilla``, an ``experiments.train`` run);
* Langevin from ``table.n_train`` training examples (exact draws, one set per seed) and
  from ``N(0, table.init_scale^2 I)`` on each, ``table.num_samples`` chains of step
  ``table.step_size``, the state recorded at every stopping step of ``table.stops``;
* the diffusion sampler (the preset's Heun) of a model of every noise level (the EDM loss,
  an ``experiments.train`` run with ``table.overrides`` alone).

Every sample set is read by ``scorelib.metrics.mode_statistics`` (Mahalanobis radius 3):
the total variation between its normalised mode masses and the weights, and the off-mode
fraction; beside them the same for exact draws of as many points (the floor) and the mean
distance of each chain's state to its start (in units of the modes' std; 0 at K = 0,
where the samples are copies of the training examples). This module composes library
calls and reports.
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
from scorelib.metrics import mean_displacement, mode_statistics
from scorelib.samplers import langevin_from_data, langevin_from_noise

PAPER = (
    "from the data and stopped early: the right mode weights; from noise: the wrong ones "
    "(Koehler and Vuong 2024, abstract)"
)
STARTS = ("data", "noise")


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError: naming ``table.<field>`` (seeds, ``stops`` not increasing integers >= 0,
        ``step_size``, ``init_scale`` <= 0, ``n_train`` or ``num_samples`` < 1, a vanilla
        network whose ``objective.t_range`` is not one level) or a bad override.
    """
    tc = scaled(cfg, base="small")
    check_seeds(tc.seeds)
    stops = [check_int(s, "table.stops", low=0) for s in tc.stops]
    require(
        len(stops) >= 1 and all(a < b for a, b in zip(stops, stops[1:], strict=False)),
        "table.stops",
        "strictly increasing integers >= 0",
        stops,
    )
    check_real(tc.step_size, "table.step_size", low=0.0, low_open=True)
    check_real(tc.init_scale, "table.init_scale", low=0.0, low_open=True)
    check_int(tc.n_train, "table.n_train", low=1)
    check_int(tc.num_samples, "table.num_samples", low=1)
    for overrides in models(tc, 0).values():
        check(overrides)
    sigma0(tc)
    return tc


def models(tc: DictConfig, seed: int) -> dict:
    """``{label: overrides}`` of one seed: the vanilla network and the diffusion model."""
    base = [*tc.overrides, f"trainer.seed={seed}"]
    return {"vanilla": [*base, *tc.vanilla], "diffusion": base}


def sigma0(tc: DictConfig) -> float:
    """The vanilla score's noise level: the vanilla network's ``objective.t_range``.

    Raises:
      ValueError: naming ``table.vanilla`` unless it trains DSM at one level.
    """
    oc = compose(models(tc, 0)["vanilla"]).objective
    lo, hi = (None, None) if oc.get("t_range") is None else tuple(oc.t_range)
    require(
        lo is not None and lo == hi,
        "table.vanilla",
        "overrides of DSM at one noise level (objective=dsm objective.t_range=[s,s])",
        list(tc.vanilla),
    )
    return float(lo)


def _row(x, target, start_points=None) -> dict:
    stats = mode_statistics(np.asarray(x), target)
    out = {"tv": stats["tv"], "off_mode": stats["off_mode"]}
    if start_points is not None:
        out["moved"] = mean_displacement(x, start_points, target)
    return out


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Train the two networks per seed, run every chain, read every sample set; writes
    ``results.json`` and ``figure.png`` into ``run_dir``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    s0 = sigma0(tc)
    stops = [int(s) for s in tc.stops]
    n = int(tc.num_samples)
    results, figure = [], {}
    for seed in (int(s) for s in tc.seeds):
        runs = {}
        for label, overrides in models(tc, seed).items():
            name = f"{label}_seed{seed}"
            runs[label] = train_model(overrides, run_dir / "runs" / slug(name), log)
        target = build_data(runs["vanilla"][0].cfg).target
        key = jax.random.key(seed)
        train = np.asarray(target.sample(jax.random.fold_in(key, 0), int(tc.n_train)))
        floor = np.asarray(target.sample(jax.random.fold_in(key, 1), n))
        results.append({"seed": seed, "score": "exact draws (floor)", **_row(floor, target)})
        run, state, _ = runs["vanilla"]
        scores = {
            "exact": target.noisy_score(run.process),
            "network": run.source(state.ema_params),
        }
        recorded = sorted({0, *stops})  # step 0: each chain's start
        for score, source in scores.items():
            kw = dict(t=s0, step_size=float(tc.step_size), n_steps=recorded, num_samples=n)
            ck = jax.random.fold_in(key, 2)
            xd, start = langevin_from_data(source, ck, train, **kw)
            xn = langevin_from_noise(
                source, ck, train.shape[1:], init_scale=float(tc.init_scale), **kw
            )
            for K in stops:
                k = recorded.index(K)
                for how, x, s in (("data", xd[k], xd[0]), ("noise", xn[k], xn[0])):
                    r = {"seed": seed, "score": score, "start": how, "K": K}
                    results.append({**r, **_row(x, target, s)})
                if seed == int(tc.seeds[0]):
                    figure[(score, K)] = (xd[k], xn[k])
            log(
                f"[seed {seed}] {score}: TV from data "
                + " ".join(f"{r['tv']:.3f}" for r in results[-2 * len(stops) :: 2])
            )
        drun, dstate, _ = runs["diffusion"]
        x, _ = drun.draw(dstate.ema_params, progress=False)
        x = np.asarray(x)[:n]
        results.append({"seed": seed, "score": "diffusion sampler", **_row(x, target)})
        if seed == int(tc.seeds[0]):
            figure[("diffusion", None)] = (x, None)
            figure[("train", None)] = (train, None)
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1, default=float))
    fig = run_dir / "figure.png"
    make_figure(figure, stops, fig)
    return report(results, tc, s0, fig)


def _cell(v):
    v = np.asarray(v, float)
    return float(v[0]) if v.size == 1 else pm(v.mean(), v.std())


def report(results: list, tc: DictConfig, s0: float, fig: Path) -> dict:
    """One row per (score, start, K), then the diffusion sampler and the floor."""
    cols = [
        "vanilla score",
        "start",
        "stopping step K",
        "hK (time)",
        "mode-weight TV",
        "off-mode fraction",
        "distance moved (mode stds)",
        "paper",
    ]
    rows = []
    h = float(tc.step_size)
    for score in ("exact", "network"):
        for how in STARTS:
            for K in (int(k) for k in tc.stops):
                rs = [
                    r
                    for r in results
                    if (r.get("score"), r.get("start"), r.get("K")) == (score, how, K)
                ]
                rows.append(
                    [
                        f"{score} at sigma0 = {s0:g}",
                        "training examples" if how == "data" else f"N(0, {tc.init_scale:g}^2 I)",
                        K,
                        h * K,
                        _cell([r["tv"] for r in rs]),
                        _cell([r["off_mode"] for r in rs]),
                        _cell([r["moved"] for r in rs]),
                        PAPER if not rows else "",
                    ]
                )
    for label in ("diffusion sampler", "exact draws (floor)"):
        rs = [r for r in results if r["score"] == label]
        rows.append(
            [
                label,
                "-",
                None,
                None,
                _cell([r["tv"] for r in rs]),
                _cell([r["off_mode"] for r in rs]),
                None,
                "",
            ]
        )
    notes = [
        f"Mixture: configs/experiment/langevin_gmm.yaml ({list(tc.overrides)}). Vanilla "
        f"network: experiments.train with {[*tc.overrides, *tc.vanilla]} (DSM at the one "
        f"level sigma0 = {s0:g}); diffusion model: the same without them (the EDM loss at "
        "every level), sampled by its preset's sampler; trainer.seed over the seeds.",
        f"Chains: scorelib.samplers.langevin_from_data / langevin_from_noise, step h = {h:g}, "
        f"{int(tc.num_samples)} chains, starts drawn uniformly from {int(tc.n_train)} exact "
        "training draws (one set per seed) or from N(0, init_scale^2 I); every K recorded "
        "on one run per seed.",
        "Mode-weight TV: 0.5 sum_k |mass_k / sum(mass) - w_k| over the modes "
        "(scorelib.metrics.mode_statistics, Mahalanobis radius 3); off-mode: the fraction "
        "outside every mode's radius. Distance moved: the mean distance from each chain's "
        "start, in units of the modes' std. Floor: exact draws of as many points. Cells: "
        "mean ± std over the seeds.",
    ]
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": [
            {
                "name": "summary",
                "caption": "Langevin on a vanilla score from the data and from noise, by "
                "stopping step, against the diffusion sampler: mode-weight error.",
                "columns": cols,
                "rows": rows,
            }
        ],
        "notes": notes,
        "figure": str(fig),
    }


def make_figure(panels: dict, stops: list, path: Path) -> None:
    """Chains from the data (blue) and from noise (red) on the network's vanilla score at a
    few stopping steps, beside the training examples and the diffusion sampler."""
    plt = pyplot()
    shown = [k for k in (stops[0], stops[len(stops) // 2], stops[-1])]
    fig, axes = plt.subplots(1, len(shown) + 2, figsize=(3.0 * (len(shown) + 2), 3.0))
    for ax, (title, (a, b)) in zip(
        axes,
        [("training examples", panels[("train", None)])]
        + [(f"network score, K = {k}", panels[("network", k)]) for k in shown]
        + [("diffusion sampler", panels[("diffusion", None)])],
        strict=True,
    ):
        ax.scatter(a[:, 0], a[:, 1], s=2, alpha=0.4, color="C0")
        if b is not None:
            ax.scatter(b[:, 0], b[:, 1], s=2, alpha=0.4, color="C3")
        ax.set_title(title, fontsize=8)
        ax.set_xlim(-8, 8)
        ax.set_ylim(-8, 8)
        ax.set_aspect("equal")
    fig.suptitle("blue: from the data; red: from noise", fontsize=8)
    save_figure(fig, path)
