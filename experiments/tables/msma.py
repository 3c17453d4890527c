"""Out-of-distribution detection by multiscale score matching on the digits:
``python -m experiments.reproduce table=msma``.

Mahmood, Oliva and Styner, "Multiscale score matching for out-of-distribution detection",
ICLR 2021 (arXiv 2010.13132); abstract: "our method can effectively separate CIFAR-10
(inlier) and SVHN (OOD) images, a setting which has been previously shown to be difficult for
deep likelihood models".

The main job's model (``table.model``: an ``experiments.train`` run of the digits, or, when
null, the ``experiment=digits_edm`` preset with ``data.holdout=0.25`` trained here into
``<run_dir>/model``) maps each image to its score norms at ``table.levels`` noise levels
(``scorelib.metrics.score_norms``); a Gaussian mixture is fitted on in-distribution vectors
(``fit_norm_density``) and its negative log-likelihood is the OOD score (``ood_scores``) of the
test digits (in-distribution) and of each out-of-distribution set. Each protocol of
``table.protocols`` fixes the split the mixture is fitted on, its components and the levels:

* ``authors``: the held-out quarter of the training split, which the model never saw (the
  authors fit on CIFAR-10.1 beside CIFAR-10's training set); 2-20 components by 10-fold
  cross-validation (``select_components``); levels 0.02-2 on the digits' [-1, 1] scale,
  their 0.01-1 on [0, 1];
* ``first``: the table's first protocol, the model's own training digits, 4 components,
  levels 0.05-5, on the same model.

The sets:

* the MNIST-subset test digits brought to the digits' 8x8 grid and 17 levels
  (``scorelib.data.downsample_to_digits``; ``table.ood_size`` of them);
* noise images, uniform on the 17 levels (``table.ood_size``, a new draw per seed);
* the test digits shifted by each of ``table.shifts`` (``scorelib.data.shift_images``);
* a control that is not OOD: training digits (``table.ood_size``; AUROC 0.5 expected,
  below 0.5 where the model or the mixture remembers its training set).

AUROC per set (``scorelib.metrics.auroc``, OOD the positive class), beside a baseline, the
PF-ODE bits/dim of each image as its OOD score (``scorelib.metrics.bits_per_dim``), and beside
the same two detectors on a model-free reference source, the Gaussian fitted to the
dequantised training digits (``scorelib.scores.fit_gaussian``). Mean ± std over
``table.seeds`` (the mixture's initialisation, the noise set, the bits/dim keys). This module
runs the library and writes the results; it computes nothing itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig

from experiments.runs import load_run
from experiments.runs.evaluation import BPD_OPTIONS
from experiments.runs.layout import pyplot, save_figure
from experiments.tables.common import (
    check_digits_run,
    check_seeds,
    compose_config,
    given_or_trained,
    pm,
    run_revision,
    scaled,
)
from scorelib._checks import check_choice, check_int, check_real, require
from scorelib._io import atomic_write_text, portable_path
from scorelib.data import downsample_to_digits, load_digits, load_mnist_subset, shift_images
from scorelib.data.images import quantise
from scorelib.metrics import (
    auroc,
    bits_per_dim,
    dequantise,
    fit_norm_density,
    ood_scores,
    select_components,
)
from scorelib.metrics.ood import COVARIANCE_TYPES, check_sigmas, score_norms
from scorelib.scores import fit_gaussian

PAPER = "CIFAR-10 vs SVHN: near 1 (abstract's claim; number unverified)"
IN = "test digits (in-distribution)"
MNIST = "MNIST-subset digits, 8x8"
NOISE = "uniform noise on the 17 levels"
CONTROL = "training digits (control, not OOD)"
PROTOCOL_FIELDS = ("fit", "n_components", "sigma_min", "sigma_max")
FITS = ("held_out", "train")
SOURCES = {"model": "model", "gaussian": "Gaussian fit"}


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, every field checked before anything is computed.

    Raises:
      ValueError, FileNotFoundError: naming ``table.<field>``.
    """
    tc = scaled(cfg)
    check_int(tc.levels, "table.levels", low=2)
    require(bool(tc.protocols), "table.protocols", "at least one protocol", tc.protocols)
    for name, p in tc.protocols.items():
        f = f"table.protocols.{name}"
        extra = sorted(set(p) - set(PROTOCOL_FIELDS))
        require(not extra, f, f"the fields {list(PROTOCOL_FIELDS)} only", extra)
        check_choice(p.get("fit"), f"{f}.fit", FITS)
        if p.get("n_components") != "cv":
            check_int(p.get("n_components"), f"{f}.n_components (an integer or cv)", low=1)
        lo = check_real(p.get("sigma_min"), f"{f}.sigma_min", low=0.0, low_open=True)
        check_real(p.get("sigma_max"), f"{f}.sigma_max", low=lo, low_open=True)
    cv = list(tc.cv_components)
    ok = len(cv) == 2 and all(isinstance(k, int) and k >= 1 for k in cv) and cv[0] <= cv[1]
    require(ok, "table.cv_components", "[lo, hi] with 1 <= lo <= hi", cv)
    folds = check_int(tc.cv_folds, "table.cv_folds", low=2)
    n_fit = fit_sizes(tc)
    for name, p in tc.protocols.items():
        n = n_fit[p.fit]
        if p.n_components == "cv" and n is not None:
            check_int(folds, f"table.cv_folds (protocol {name}: {n} digits)", high=n)
            top = n - -(-n // folds)  # a training fold's size
            check_int(cv[1], f"table.cv_components[1] (protocol {name}: folds of {top})", high=top)
    check_choice(tc.covariance_type, "table.covariance_type", COVARIANCE_TYPES)
    check_seeds(tc.seeds)
    check_int(tc.ood_size, "table.ood_size", low=2)
    if tc.test_size is not None:
        check_int(tc.test_size, "table.test_size", low=2)
    check_int(tc.bpd_probes, "table.bpd_probes", low=1)
    check_int(tc.batch_size, "table.batch_size", low=1)
    for shift in tc.shifts:
        ok = len(shift) == 2 and all(isinstance(d, int) and -8 < d < 8 for d in shift)
        require(ok, "table.shifts", "a list of [dy, dx] integer pairs, each in (-8, 8)", shift)
    if tc.model is not None:
        check_digits_run("table.model", tc.model)
    return tc


def fit_sizes(tc) -> dict:
    """``{"train", "held_out"}``: the digits each fit split holds for the model that
    ``table.model_overrides`` trains (``None`` for a given ``table.model``: known once it is
    loaded)."""
    if tc.model is not None:
        return {"train": None, "held_out": None}
    holdout = compose_config("train", list(tc.model_overrides)).data.get("holdout")
    data = load_digits() if holdout is None else load_digits().hold_out(float(holdout))
    held = None if data.held_out is None else len(data.held_out)
    return {"train": len(data.train), "held_out": held}


def noise_levels(tc, protocol) -> np.ndarray:
    """``[L]`` VE-frame noise levels of a protocol, geometric from its ``sigma_min`` to its
    ``sigma_max``."""
    return np.geomspace(float(protocol.sigma_min), float(protocol.sigma_max), int(tc.levels))


def fixed_sets(tc, dataset) -> dict:
    """The sets that do not change with the seed: ``{name: [n, 8, 8, 1]}`` (the test digits,
    the MNIST digits, each shift, the control); subsets drawn with ``default_rng(0)``."""
    rng = np.random.default_rng(0)
    test = dataset.test
    if tc.test_size is not None and tc.test_size < len(test):
        test = test[np.sort(rng.choice(len(test), int(tc.test_size), replace=False))]
    mnist = downsample_to_digits(load_mnist_subset().test)
    n = int(tc.ood_size)
    pick = lambda x: x[np.sort(rng.choice(len(x), min(n, len(x)), replace=False))]  # noqa: E731
    sets = {IN: test, MNIST: pick(mnist)}
    for dy, dx in tc.shifts:
        sets[f"test digits shifted by ({dy}, {dx})"] = shift_images(test, int(dy), int(dx))
    sets[CONTROL] = pick(dataset.train)
    return sets


def noise_set(tc, seed: int, levels: int) -> np.ndarray:
    """``table.ood_size`` images of independent uniform pixels on the data's levels."""
    u = np.random.default_rng(1000 + seed).uniform(-1.0, 1.0, (int(tc.ood_size), 8, 8, 1))
    return quantise(u.astype(np.float32), levels)


def detectors(tc) -> list[tuple[str, str, str | None]]:
    """``(detector, source, protocol or None)`` of every AUROC column, in column order."""
    out = []
    for key in SOURCES:
        out += [("msma", key, p) for p in tc.protocols]
        out.append(("bpd", key, None))
    return out


def column_key(det: str, key: str, protocol: str | None) -> str:
    return f"{det}_{key}" if protocol is None else f"{det}_{key}_{protocol}"


def components(tc, protocol, vectors: np.ndarray, seed: int) -> int:
    """A protocol's component count: its integer, or chosen by cross-validation."""
    if protocol.n_components != "cv":
        return int(protocol.n_components)
    lo, hi = (int(v) for v in tc.cv_components)
    return select_components(
        vectors,
        range(lo, hi + 1),
        folds=int(tc.cv_folds),
        covariance_type=str(tc.covariance_type),
        seed=seed,
    )["n_components"]


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Model, score norms, mixtures, bits/dim, AUROCs; writes ``results.json`` and
    ``figure.png``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    model_dir = given_or_trained(tc.model, tc.model_overrides, run_dir / "model", log)
    run_, state = load_run(model_dir)
    model = run_.source(state.ema_params)
    dataset = run_.data.images
    sigmas = {}
    for name, p in tc.protocols.items():
        sigmas[name] = noise_levels(tc, p)
        try:  # the levels inside the model's noise range (the Gaussian shares its process)
            check_sigmas(sigmas[name], model.process)
        except ValueError as e:
            raise ValueError(f"table.protocols.{name}.sigma_min, sigma_max: {e}") from e
        if p.fit == "held_out" and dataset.held_out is None:
            raise ValueError(
                f"table.protocols.{name}.fit=held_out: the model {portable_path(model_dir)} "
                "holds no digits out of training; train it with data.holdout=0.25"
            )
    fit_sets = {"train": dataset.train, "held_out": dataset.held_out}
    levels = dataset.levels
    deq = dequantise(dataset.train, jax.random.key(0), levels=levels)
    sources = {"model": model, "gaussian": fit_gaussian(model.process, np.asarray(deq))}
    sets = fixed_sets(tc, dataset)
    bs = int(tc.batch_size)

    def norms(src, x, name):
        return score_norms(src, x, sigmas[name], batch_size=bs)

    def bpd(src, x, seed):
        opts = {**BPD_OPTIONS, "probes": int(tc.bpd_probes)}
        out = [
            np.asarray(
                bits_per_dim(
                    src, x[i : i + bs], jax.random.key(seed), levels=levels, first_index=i, **opts
                )[0],
                np.float64,
            )
            for i in range(0, len(x), bs)
        ]
        return np.concatenate(out)

    protocols = dict(tc.protocols)
    fit = {
        (k, name): norms(s, fit_sets[p.fit], name)
        for k, s in sources.items()
        for name, p in protocols.items()
    }
    fixed = {
        (k, name): {set_name: norms(s, x, name) for set_name, x in sets.items()}
        for k, s in sources.items()
        for name in protocols
    }
    log(f"[norms] {len(sets)} sets and the fit sets, {len(protocols)} protocol(s)")
    first, per_seed, curves, hist = next(iter(protocols)), [], {}, {}
    for seed in (int(s) for s in tc.seeds):
        noise = noise_set(tc, seed, levels)
        all_sets = {**sets, NOISE: noise}
        row = {"seed": seed, "sets": {}, "components": {}}
        scores = {}
        for key, src in sources.items():
            for name, p in protocols.items():
                k = components(tc, p, fit[(key, name)], seed)
                row["components"][f"{key}_{name}"] = k
                density = fit_norm_density(
                    fit[(key, name)],
                    n_components=k,
                    covariance_type=str(tc.covariance_type),
                    seed=seed,
                )
                vecs = {**fixed[(key, name)], NOISE: norms(src, noise, name)}
                scores[("msma", key, name)] = {n: ood_scores(density, v) for n, v in vecs.items()}
                if seed == int(tc.seeds[0]) and name == first:
                    curves[key] = {n: np.median(v, axis=0).tolist() for n, v in vecs.items()}
            scores[("bpd", key, None)] = {n: bpd(src, x, seed) for n, x in all_sets.items()}
        for set_name in all_sets:
            entry = {"n": int(len(all_sets[set_name]))}
            for det in detectors(tc):
                s_in, s_out = scores[det][IN], scores[det][set_name]
                entry[f"{column_key(*det)}_mean"] = float(np.mean(s_out))
                if set_name != IN:
                    entry[f"{column_key(*det)}_auroc"] = auroc(s_in, s_out)
            row["sets"][set_name] = entry
            if set_name == IN:
                continue
            log(
                f"[seed {seed}] {set_name}: "
                + ", ".join(
                    f"{column_key(*d)} {entry[f'{column_key(*d)}_auroc']:.3f}"
                    for d in detectors(tc)
                )
            )
        log(f"[seed {seed}] components {row['components']}")
        per_seed.append(row)
        if seed == int(tc.seeds[0]):
            hist = {k: v.tolist() for k, v in scores[("msma", "model", first)].items()}
    results = {
        "sigmas": {name: v.tolist() for name, v in sigmas.items()},
        "n_fit": {name: int(len(fit_sets[p.fit])) for name, p in protocols.items()},
        "n_train": int(len(dataset.train)),
        "seeds": per_seed,
        "median_norms": curves,
    }
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1))
    fig = run_dir / "figure.png"
    make_figure(sigmas[first], curves["model"], hist, fig, first)
    return report(results, tc, model_dir, fig)


def column_name(det: str, key: str, protocol: str | None) -> str:
    what = "MSMA" if det == "msma" else "bits/dim"
    where = SOURCES[key] if protocol is None else f"{SOURCES[key]}, {protocol}"
    return f"{what} ({where})"


def report(results: dict, tc, model_dir: Path, fig: Path) -> dict:
    """The AUROC table and the mean-score table from ``results`` (mean ± std over seeds)."""
    seeds = results["seeds"]
    names = list(seeds[0]["sets"])
    dets = detectors(tc)

    def stat(name, field):
        v = np.array([s["sets"][name][field] for s in seeds], float)
        return pm(v.mean(), v.std())

    rows, means = [], []
    for name in names:
        n = seeds[0]["sets"][name]["n"]
        means.append([name, n] + [stat(name, f"{column_key(*d)}_mean") for d in dets])
        if name == IN:
            continue
        rows.append(
            [name, n]
            + [stat(name, f"{column_key(*d)}_auroc") for d in dets]
            + [PAPER if name == MNIST else ""]
        )
    protocol_notes = []
    for pname, p in tc.protocols.items():
        sig = ", ".join(f"{s:.3g}" for s in results["sigmas"][pname])
        ks = {key: sorted({s["components"][f"{key}_{pname}"] for s in seeds}) for key in SOURCES}
        how = (
            f"chosen by {tc.cv_folds}-fold cross-validation over {list(tc.cv_components)} "
            f"(scorelib.metrics.select_components): model {ks['model']}, Gaussian fit "
            f"{ks['gaussian']} over the seeds"
            if p.n_components == "cv"
            else f"{p.n_components}, fixed"
        )
        protocol_notes.append(
            f"Protocol '{pname}': the mixture fitted on the {results['n_fit'][pname]} "
            + (
                "held-out digits (never seen by the model)"
                if p.fit == "held_out"
                else "digits the model trained on"
            )
            + f"; components {how}; L = {tc.levels} levels ({sig})."
        )
    notes = [
        f"Model: {model_note(tc, model_dir)}; it trained on {results['n_train']} digits.",
        "MSMA: the score norms ||s(x; sigma)|| at each protocol's VE-frame noise levels, a "
        f"Gaussian mixture (covariance '{tc.covariance_type}') fitted on one split's vectors, "
        "its negative log-likelihood (nats) the OOD score (scorelib.metrics.ood).",
        *protocol_notes,
        "bits/dim: the PF-ODE bits/dim of each image, uniformly dequantised, as its OOD score "
        f"(scorelib.metrics.bits_per_dim, Hutchinson with {tc.bpd_probes} probe(s), rtol "
        f"{BPD_OPTIONS['rtol']:g}).",
        "Gaussian fit: scorelib.scores.fit_gaussian of the dequantised training digits on the "
        "model's process, a model-free reference through the same detectors.",
        "AUROC: the probability that an OOD image scores higher than a test digit (1: "
        "separated, 0.5: chance, below 0.5: the OOD set looks more typical than the test "
        f"digits). In-distribution: the {seeds[0]['sets'][IN]['n']} test digits. Mean ± std "
        f"over seeds {[s['seed'] for s in seeds]} (mixture initialisation and CV folds, noise "
        "draw, bits/dim keys); the norms and the fixed sets do not change with the seed.",
        "Paper: the abstract claims MSMA 'can effectively separate CIFAR-10 (inlier) and SVHN "
        "(OOD) images, a setting which has been previously shown to be difficult for deep "
        "likelihood models'; its tables were not available offline, so 'near 1' is our "
        "reading of that claim and no number of theirs is checked here.",
    ]
    cols = [column_name(*d) for d in dets]
    return {
        "seeds": [s["seed"] for s in seeds],
        "tables": [
            {
                "name": "auroc",
                "caption": "AUROC of each OOD set against the test digits.",
                "columns": ["OOD set", "n"] + [f"AUROC {c}" for c in cols] + ["paper"],
                "rows": rows,
            },
            {
                "name": "scores",
                "caption": "Mean OOD score of each set (MSMA: nats; bits/dim: bits).",
                "columns": ["set", "n"] + [f"mean {c}" for c in cols],
                "rows": means,
            },
        ],
        "notes": notes,
        "figure": str(fig),
    }


def model_note(tc, model_dir: Path) -> str:
    """Where the model came from, with the revision its run recorded (no absolute paths)."""
    rev = run_revision(model_dir)
    if tc.model is not None:
        return (
            f"`table.model={portable_path(tc.model)}` (an experiments.train run at revision {rev})"
        )
    return (
        f"trained in this run (`model/`, experiments.train with {list(tc.model_overrides)}, "
        f"revision {rev})"
    )


def make_figure(sigmas, curves: dict, hist: dict, path: Path, protocol: str) -> None:
    """Left: the median score norm per noise level of each set (model, the first protocol's
    levels). Right: the empirical distribution of the MSMA OOD score of each set (model,
    first protocol, first seed)."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, med in curves.items():
        a.plot(sigmas, med, marker="o", ms=3, label=name, lw=2.5 if name == IN else 1.2)
    a.set_xscale("log"), a.set_yscale("log")
    a.set_xlabel("noise level sigma"), a.set_ylabel("median ||s(x; sigma)||")
    a.legend(fontsize=6)
    for name, v in hist.items():
        v = np.sort(np.asarray(v))
        b.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=name)
    b.set_xscale("symlog", linthresh=10.0)
    b.set_xlabel(f"MSMA OOD score -log p(norms), nats (symlog; protocol {protocol})")
    b.set_ylabel("fraction of the set below")
    b.legend(fontsize=6)
    save_figure(fig, path, dpi=120)
