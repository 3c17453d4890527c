"""Table ``cfdm``: smoothed closed-form diffusion (sigma-CFDM) on 2-D toys, digits and MNIST.

Scarvelis, Saez de Ocariz Borde and Solomon, "Closed-form diffusion models", arXiv
2310.12395 (TMLR 2025). ``python -m experiments.reproduce table=cfdm [table.scale=smoke]``

For each data set (two moons and checkerboard with ``toy_n_train`` training points, the
digits' and the MNIST subset's train splits) and each ``(sigma_s, M)`` of the sweep, samples
of the training-free sampler (``scorelib.samplers.cfdm``; ``T = 0.95``, ``S = 100``: 5 Euler
steps from an exact mixture draw) with the exact smoothed score and with the
nearest-neighbour estimator (``k = l = 15``):

* throughput, samples/s on this CPU after compilation, exact and NN;
* memorisation (``scorelib.metrics.memorisation_stats``): the copy rate (samples closer to
  a training point than a third of that point's own leave-one-out NN distance) and the
  mean NN distance of samples over that of held-out data (well below 1: copying);
* quality against held-out data: energy distance and sliced W2 for 2-D; for images, after
  quantising to the data's grey levels, the library's image metrics as
  ``experiments.runs.evaluation.evaluate_images`` computes them: the Frechet distance in the
  bundled classifier's features beside its floor, the classifier two-sample test (in
  features, and in pixels for ``table.c2st_pixels``; at the default configuration only,
  for cost) and recall/precision in pixels and features, each with its floor (training
  images vs the test split) in a table of floors.

``sigma_s`` follows the issue's grid on every data set, plus ``table.sigmas_extra`` where a
larger value shows something (the digits leave the training set from ``sigma_s ~ 0.8``).

At the default configuration of each data set, the exact W2 (``scorelib.metrics.transport``)
between NN and exact samples from the same starts and draws, beside the W2 between two
independent exact sample sets (the noise floor; the paper: 0.1865 vs 0.1791 at k = l = 15).
The figure shows samples with their nearest training points.

Smoothed closed-form score matching (``scorelib.objectives.SmoothedScoreMatching``): on the
data sets of ``table.objective.datasets``, an MLP regressed onto the smoothed closed-form
denoiser (NN estimator) against the same MLP trained with the EDM loss, same budget
(``scorelib.training.train_seeds``: network, optimizer, EMA, data stream, steps), both
sampled with Heun on the EDM grid, beside the sigma-CFDM sampler at the same ``sigma_s, M``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from omegaconf import DictConfig, OmegaConf

from experiments.runs.evaluation import CLASSIFIERS
from experiments.runs.layout import pyplot, save_figure
from experiments.runs.training_free import build_source
from experiments.schema import CFDMScoreConfig
from experiments.tables.common import scaled
from scorelib._io import atomic_write_text
from scorelib.data import get_batch, load_digits, load_mnist_subset, toy_sample
from scorelib.data.images import quantise
from scorelib.metrics import (
    c2st,
    mean_paired_distance,
    memorisation_stats,
    precision_recall,
    sample_distances,
)
from scorelib.metrics.classifier import FeatureExtractor, default_cache_dir
from scorelib.metrics.frechet import fd_features, fd_floor
from scorelib.metrics.memorisation import leave_one_out_distances, nearest_neighbours
from scorelib.metrics.transport import exact_w2
from scorelib.nets import MLP
from scorelib.objectives import EDMLoss, SmoothedScoreMatching
from scorelib.processes import EDM
from scorelib.samplers import draw_samples, edm_grid, get_sampler
from scorelib.samplers.cfdm import cfdm_sample
from scorelib.scores import EmpiricalScore, NeighbourScore, NetworkScore, SmoothedScore
from scorelib.training import EMA, init_state, make_optimizer, network_source, train_seeds

IMAGES = {"digits": load_digits, "mnist": load_mnist_subset}
TOYS = ("moons", "checkerboard")
PAPER_W2 = "0.1865 vs floor 0.1791 (2-D, k = l = 15)"
# The sample-quality columns of the sweep and objective tables: (column, result key); a
# metric a row did not compute (images only, or C2ST only at the defaults) is left empty.
QUALITY_COLUMNS = (
    ("energy dist.", "energy"),
    ("sliced W2", "sw2"),
    ("FD", "fd"),
    ("FD floor", "fd_floor"),
    ("C2ST pixels", "c2st_pixels"),
    ("C2ST features", "c2st_features"),
    ("recall pixels", "recall_pixels"),
    ("recall features", "recall_features"),
)


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config with ``smoke`` merged when ``scale == smoke``, validated.

    Raises:
      ValueError: naming ``table.scale``, ``table.datasets`` or ``table.n_samples``.
    """
    tc = scaled(cfg)
    for d in tc.datasets:
        if d not in TOYS and d not in IMAGES:
            raise ValueError(f"table.datasets must hold names of {[*TOYS, *IMAGES]}; got {d!r}")
    for field, names in (("sigmas_extra", tc.sigmas_extra), ("c2st_pixels", tc.c2st_pixels)):
        for d in names:
            if d not in TOYS and d not in IMAGES:
                raise ValueError(
                    f"table.{field} must name data sets of {[*TOYS, *IMAGES]}; got {d!r}"
                )
    for kind, n in tc.n_samples.items():
        if int(n) % int(tc.batch_size):
            raise ValueError(
                f"table.n_samples.{kind} must be a multiple of table.batch_size "
                f"({tc.batch_size}); got {n}"
            )
    return tc


def load(name: str, tc: DictConfig):
    """``(train, held_out, kind, levels)`` of a data set (held-out: fresh toy draws or the
    test split; ``levels``: the images' grey levels, ``None`` for 2-D)."""
    if name in TOYS:
        train = np.asarray(toy_sample(name, int(tc.toy_n_train), 1234))
        return train, np.asarray(toy_sample(name, 2000, 4321)), "points", None
    ds = IMAGES[name]()
    return np.asarray(ds.train), np.asarray(ds.test), "images", int(ds.levels)


def source(train, sigma_s: float, M: int, estimator: str, tc: DictConfig):
    """The ``score=cfdm`` source (built as ``experiments.sample`` builds it)."""
    fields = {
        **OmegaConf.structured(CFDMScoreConfig),
        "sigma_s": sigma_s,
        "M": M,
        "estimator": estimator,
    }
    if estimator == "nn":
        fields.update(k=int(tc.nn.k), l=int(tc.nn.l))
    return build_source(OmegaConf.create(fields), train)


def draw(src, n: int, seed: int, tc: DictConfig) -> tuple[np.ndarray, float]:
    """``n`` samples and the samples/s after compilation (the first batch compiles)."""
    b, key = int(tc.batch_size), jax.random.key(seed)
    T, S = float(tc.sampler.T), int(tc.sampler.S)
    out = [np.asarray(cfdm_sample(src, key, b, T=T, S=S)[0])]
    t0 = time.perf_counter()
    for start in range(b, n, b):
        out.append(np.asarray(cfdm_sample(src, key, b, T=T, S=S, first_index=start)[0]))
    wall = time.perf_counter() - t0
    rate = (n - b) / wall if n > b else float("nan")
    return np.concatenate(out), rate


class ImageQuality:
    """The library's image metrics of sample sets against the test split (those of
    ``experiments.runs.evaluation.evaluate_images``): samples quantised to the data's grey levels,
    FD in the bundled classifier's features, C2ST and precision/recall (k = 3) against
    ``m = min(n, n_test)`` test images, in features and pixels (the pixel C2ST only with
    ``pixels``: at d = 784 it costs over a minute per set on this CPU). ``floors`` holds the
    same metrics for training images (FD: mean and std over 5 draws of ``n``)."""

    def __init__(self, name, train, test, levels, n, seed, pixels: bool):
        self.ext = FeatureExtractor.load_or_train(
            CLASSIFIERS[name](), os.environ.get("SCORELIB_CACHE") or default_cache_dir(os.environ)
        )
        self.levels, self.seed, self.pixels = levels, seed, pixels
        self.test_feats = self.ext.features(test)
        train_feats = self.ext.features(train)
        floor, floor_std = fd_floor(train_feats, self.test_feats, n, draws=5, seed=seed)
        self.m = min(n, len(test))
        rng = np.random.default_rng(seed)
        ref = rng.choice(len(test), self.m, replace=False) if self.m < len(test) else slice(None)
        self.ref, self.ref_feats = test[ref], self.test_feats[ref]
        tr = rng.choice(len(train), self.m, replace=False)
        self.floors = {
            "n": n,
            "m": self.m,
            "fd": floor,
            "fd_std": floor_std,
            **self._two_sample(train[tr], train_feats[tr]),
        }

    def _two_sample(self, x, feats, classify: bool = True) -> dict:
        """Precision/recall and (with ``classify``) the C2ST accuracy of ``m`` images
        against the ``m`` references."""
        pr_px, pr_ft = precision_recall(self.ref, x), precision_recall(self.ref_feats, feats)
        out = {
            "recall_pixels": pr_px["recall"],
            "precision_pixels": pr_px["precision"],
            "recall_features": pr_ft["recall"],
            "precision_features": pr_ft["precision"],
        }
        if classify:
            out["c2st_features"] = c2st(feats, self.ref_feats, seed=self.seed)["accuracy"]
        if classify and self.pixels:
            out["c2st_pixels"] = c2st(x, self.ref, seed=self.seed)["accuracy"]
        return out

    def __call__(self, x, classify: bool = True) -> dict:
        """FD, precision/recall and, with ``classify``, the C2ST of ``x: [n, H, W, C]``."""
        x = quantise(x, self.levels)
        feats = self.ext.features(x)
        return {
            "fd": fd_features(feats, self.test_feats),
            "fd_floor": self.floors["fd"],
            **self._two_sample(x[: self.m], feats[: self.m], classify),
        }


def image_quality(name: str, tc: DictConfig, cache: dict):
    """The :class:`ImageQuality` of an image data set, built once per run (``None`` for 2-D)."""
    if name not in cache:
        train, held, kind, levels = load(name, tc)
        cache[name] = (
            None
            if kind == "points"
            else ImageQuality(
                name,
                train,
                held,
                levels,
                int(tc.n_samples[kind]),
                int(tc.seed),
                name in tc.c2st_pixels,
            )
        )
    return cache[name]


def run_dataset(name: str, tc: DictConfig, quality=None, log=print) -> dict:
    """The sweep rows and the NN-vs-exact row of one data set (``quality``: its
    :class:`ImageQuality`, images only)."""
    train, held, kind, _ = load(name, tc)
    n = int(tc.n_samples[kind])
    seed = int(tc.seed)
    sigmas = [*(tc.sigmas_points if kind == "points" else tc.sigmas_images)]
    sigmas += [*tc.sigmas_extra.get(name, [])]
    loo = leave_one_out_distances(train)
    sd_default = float(tc.default.sigma_points if kind == "points" else tc.default.sigma_images)
    default = (sd_default, int(tc.default.M))
    memo = {}

    def samples(sigma_s, M, estimator, seed):
        key = (sigma_s, M, estimator, seed)
        if key not in memo:
            memo[key] = draw(source(train, sigma_s, M, estimator, tc), n, seed, tc)
        return memo[key]

    rows = []
    for sigma_s in sigmas:
        for M in tc.Ms:
            x, rate = samples(float(sigma_s), int(M), "exact", seed)
            x_nn, rate_nn = samples(float(sigma_s), int(M), "nn", seed)
            mem = memorisation_stats(x, train, reference=held, train_loo=loo)
            row = {
                "sigma_s": float(sigma_s),
                "M": int(M),
                "rate": rate,
                "rate_nn": rate_nn,
                "copy_rate": mem["copy_rate"],
                "nn_ratio": mem["nn_mean_ratio"],
                "nn_vs_exact_mean": mean_paired_distance(x_nn, x),
            }
            if kind == "points":
                d = sample_distances(x, held, seed=seed)
                row.update(energy=d["energy"], sw2=d["sw2"])
            else:  # the C2ST (a minute per set here) at the default configuration only
                row.update(quality(x, classify=(float(sigma_s), int(M)) == default))
            rows.append(row)
            log(
                f"[{name}] sigma_s={sigma_s} M={M}: {rate:.0f} samples/s exact, "
                f"{rate_nn:.0f} NN, copy {mem['copy_rate']:.2f}"
            )
    sd = float(tc.default.sigma_points if kind == "points" else tc.default.sigma_images)
    M = int(tc.default.M)
    x, _ = samples(sd, M, "exact", seed)
    x_nn, _ = samples(sd, M, "nn", seed)
    x2, _ = samples(sd, M, "exact", seed + 1)
    w2 = {
        "sigma_s": sd,
        "M": M,
        "N": int(len(train)),
        "n": n,
        "w2_nn_exact": exact_w2(x_nn, x),
        "w2_exact_exact": exact_w2(x2, x),
    }
    shown = x[: 200 if kind == "points" else 8]
    if kind == "images":
        shown = quantise(shown, quality.levels)
    _, idx = nearest_neighbours(shown, train, k=1)
    fig = {
        "kind": kind,
        "samples": shown.tolist(),
        "nearest": train[idx[:, 0]].tolist(),
        "train": train.tolist() if kind == "points" else None,
    }
    out = {"name": name, "kind": kind, "N": int(len(train)), "rows": rows, "w2": w2, "figure": fig}
    if quality is not None:
        out["floors"] = quality.floors
    return out


def objective_rows(name: str, tc: DictConfig, quality=None, log=print) -> list:
    """EDM loss vs smoothed closed-form score matching, same MLP and budget, Heun samples."""
    oc = tc.objective
    train, held, kind, _ = load(name, tc)
    n, seed = int(tc.n_samples[kind]), int(tc.seed)
    sd = float(tc.default.sigma_points if kind == "points" else tc.default.sigma_images)
    M = int(tc.default.M)
    process = EDM()
    teacher = SmoothedScore.create(
        NeighbourScore.create(
            EmpiricalScore.create(process, train, chunk=4096), k=int(tc.nn.k), l=int(tc.nn.l)
        ),
        sigma_s=sd,
        M=M,
    )
    objectives = {
        "EDM loss": EDMLoss(process),
        "smoothed CF score matching": SmoothedScoreMatching.create(teacher),
    }
    steps, batch = int(oc.steps), int(oc.batch_size)
    opt = make_optimizer(float(oc.lr), 100, 1.0)
    ema = EMA(batch_size=batch, halflife_nimg=0.05 * steps * batch, rampup_ratio=0.05)
    shape = train.shape[1:]
    model = MLP(
        shape,
        width=int(oc.width),
        depth=int(oc.depth),
        emb_dim=64,
        embedding="fourier",
        rngs=nnx.Rngs(seed),
    )
    graphdef, state = init_state(model, opt, seed)
    data = jax.device_put(np.asarray(train, np.float32))
    t0 = time.perf_counter()
    final, info = train_seeds(
        objectives,
        network_source(process, graphdef, 0.5),
        opt,
        ema,
        lambda i: get_batch(data, batch, seed=seed, step=i),
        [state],
        steps,
    )
    log(f"[{name}] trained {list(objectives)} x {steps} steps in {time.perf_counter() - t0:.0f} s")
    rows = []
    heun, grid = get_sampler("heun"), edm_grid(int(oc.sampler_steps))
    for obj_name, st in final.items():
        params = jax.tree.map(lambda a: a[0], st.ema_params)
        src = NetworkScore(process=process, graphdef=graphdef, params=params, sigma_data=0.5)
        x, _ = draw_samples(
            heun,
            src,
            jax.random.key(seed),
            shape,
            num_samples=n,
            batch_size=int(tc.batch_size),
            grid=grid,
        )
        rows.append(
            _quality_row(
                f"{obj_name} (Heun, {oc.sampler_steps} steps)", x, train, held, kind, quality, seed
            )
        )
    x, _ = draw(source(train, sd, M, "exact", tc), n, seed, tc)
    rows.append(
        _quality_row("sigma-CFDM sampler (no network)", x, train, held, kind, quality, seed)
    )
    for r in rows:
        r.update(data=name, sigma_s=sd, M=M, steps=steps)
    rows[-1]["steps"] = None  # no training
    return rows


def _quality_row(label, x, train, held, kind, quality, seed) -> dict:
    mem = memorisation_stats(x, train, reference=held)  # objective rows: no C2ST (cost)
    row = {"model": label, "copy_rate": mem["copy_rate"], "nn_ratio": mem["nn_mean_ratio"]}
    if kind == "points":
        d = sample_distances(x, held, seed=seed)
        row.update(energy=d["energy"], sw2=d["sw2"])
    else:
        row.update(quality(x, classify=False))
    return row


def make_figure(results: list, path: Path) -> None:
    """Samples and their nearest training points, one panel per data set: for 2-D, each
    sample joined by a segment to its nearest training point (training set in grey); for
    images, pairs side by side (sample | nearest training image), four pairs per row."""
    plt = pyplot()
    from matplotlib.collections import LineCollection  # matplotlib on first use: pyplot()

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        f = r["figure"]
        s, nn = np.asarray(f["samples"]), np.asarray(f["nearest"])
        if f["kind"] == "points":
            t = np.asarray(f["train"])
            ax.scatter(t[:, 0], t[:, 1], s=3, c="0.7", label="training points")
            ax.add_collection(
                LineCollection(np.stack([s, nn], 1), colors="C0", linewidths=0.6, alpha=0.8)
            )
            ax.scatter(s[:, 0], s[:, 1], s=4, c="C3", label="samples (segment: nearest)")
            ax.legend(loc="lower left", fontsize=7)
        else:
            gap = np.ones_like(s[0, :, :1, 0])  # a white column between pairs
            pairs = [
                np.concatenate([a[..., 0], b[..., 0], gap], 1) for a, b in zip(s, nn, strict=True)
            ]
            rows = [np.concatenate(pairs[i : i + 4], 1) for i in range(0, len(pairs), 4)]
            rows = [np.concatenate([r, np.ones_like(r[:1])], 0) for r in rows]  # row gaps
            ax.imshow(np.concatenate(rows, 0), cmap="gray", vmin=-1, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_xlabel("pairs: sample | nearest training image", fontsize=7)
        w = r["w2"]
        ax.set_title(f"{r['name']} (N={r['N']}), sigma_s={w['sigma_s']}, M={w['M']}", fontsize=9)
    save_figure(fig, path, dpi=110)


def report(results: list, tc: DictConfig, objective: list | None = None) -> dict:
    """The tables, notes and seeds of the run."""
    sweep_cols = [
        "data",
        "sigma_s",
        "M",
        "samples/s exact",
        "samples/s NN",
        "copy rate",
        "NN-dist ratio (samples/held-out)",
        *(column for column, _ in QUALITY_COLUMNS),
        "mean |NN - exact|",
    ]
    sweep = []
    for r in results:
        for row in r["rows"]:
            sweep.append(
                [
                    r["name"],
                    row["sigma_s"],
                    row["M"],
                    row["rate"],
                    row["rate_nn"],
                    row["copy_rate"],
                    row["nn_ratio"],
                    *(row.get(key) for _, key in QUALITY_COLUMNS),
                    row["nn_vs_exact_mean"],
                ]
            )
    w2_cols = [
        "data",
        "N",
        "n",
        "sigma_s",
        "M",
        "k",
        "l",
        "W2(NN, exact)",
        "W2(exact, exact') floor",
        "paper",
    ]
    w2 = [
        [
            r["name"],
            r["N"],
            r["w2"]["n"],
            r["w2"]["sigma_s"],
            r["w2"]["M"],
            int(tc.nn.k),
            int(tc.nn.l),
            r["w2"]["w2_nn_exact"],
            r["w2"]["w2_exact_exact"],
            PAPER_W2 if r["kind"] == "points" else None,
        ]
        for r in results
    ]
    obj_cols = [
        "data",
        "model",
        "sigma_s",
        "M",
        "train steps",
        "copy rate",
        "NN-dist ratio",
        *(column for column, _ in QUALITY_COLUMNS),
    ]
    obj = [
        [
            r["data"],
            r["model"],
            r["sigma_s"],
            r["M"],
            r["steps"],
            r["copy_rate"],
            r["nn_ratio"],
            *(r.get(key) for _, key in QUALITY_COLUMNS),
        ]
        for r in objective or []
    ]
    floor_cols = [
        "data",
        "n samples",
        "m (two-sample)",
        "FD floor",
        "FD floor std",
        "C2ST pixels",
        "C2ST features",
        "recall pixels",
        "recall features",
        "precision pixels",
        "precision features",
    ]
    floors = [
        [
            r["name"],
            f["n"],
            f["m"],
            f["fd"],
            f["fd_std"],
            f.get("c2st_pixels"),
            f["c2st_features"],
            f["recall_pixels"],
            f["recall_features"],
            f["precision_pixels"],
            f["precision_features"],
        ]
        for r in results
        if (f := r.get("floors"))
    ]
    notes = [
        f"Sampler: Euler in rectified-flow time from an exact mixture draw at T = "
        f"{tc.sampler.T}, S = {tc.sampler.S} ({int(round((1 - tc.sampler.T) * tc.sampler.S))} "
        "steps); smoothing draws fixed per trajectory (the paper's algorithm).",
        "samples/s: after compilation, batch "
        f"{tc.batch_size}, on this machine (shared; see metadata.json), exact streamed softmax "
        f"vs the NN estimator (k = {tc.nn.k}, l = {tc.nn.l}, exact top-k in JAX).",
        "Copy rate: fraction of samples closer to a training point than 1/3 of that point's "
        "own leave-one-out NN distance (scorelib.metrics.memorisation_stats).",
        "Images: samples quantised to the data's grey levels (scorelib.data.images.quantise); "
        "FD in the bundled classifier's features; C2ST accuracy (0.5: indistinguishable) and "
        "recall (k = 3) against the test split, in features and in pixels; the C2ST (about a "
        "minute per set on this loaded CPU) only at the default configuration of each data "
        f"set, in pixels only for {list(tc.c2st_pixels)}; floors (training images vs test, "
        "same sizes) in the table image_floors.",
        "W2: exact optimal transport (POT ot.emd2) between equal-size sets; NN and exact "
        "samples share their starts and smoothing draws, the floor set uses another seed.",
        "sigma_s: the issue's grid on every data set, plus "
        f"{ {k: list(v) for k, v in tc.sigmas_extra.items()} } (the digits leave the training "
        "set from sigma_s ~ 0.8).",
    ]
    return {
        "tables": [
            {
                "name": "sweep",
                "caption": "sigma-CFDM: sigma_s x M sweep",
                "columns": sweep_cols,
                "rows": sweep,
            },
            {
                "name": "nn_vs_exact",
                "caption": "NN estimator vs exact score (exact W2)",
                "columns": w2_cols,
                "rows": w2,
            },
        ]
        + (
            [
                {
                    "name": "image_floors",
                    "caption": "Image metrics of training images vs the test split (floors)",
                    "columns": floor_cols,
                    "rows": floors,
                }
            ]
            if floors
            else []
        )
        + (
            [
                {
                    "name": "objective",
                    "caption": "Smoothed closed-form score matching vs the EDM loss (same MLP "
                    "and budget) and the sigma-CFDM sampler",
                    "columns": obj_cols,
                    "rows": obj,
                }
            ]
            if obj
            else []
        ),
        "notes": notes,
        "seeds": [int(tc.seed), int(tc.seed) + 1],
    }


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Compute the table into ``run_dir`` (``results.json``, ``figure.png``)."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cache = {}
    results = [
        run_dataset(name, tc, image_quality(name, tc, cache), log=log) for name in tc.datasets
    ]
    objective = [
        r
        for name in tc.objective.datasets
        for r in objective_rows(name, tc, image_quality(name, tc, cache), log=log)
    ]
    wall = time.perf_counter() - t0
    atomic_write_text(
        run_dir / "results.json",
        json.dumps({"results": results, "objective": objective, "wall_s": wall}, indent=1),
    )
    fig = run_dir / "figure.png"
    make_figure(results, fig)
    return {**report(results, tc, objective), "figure": str(fig)}
