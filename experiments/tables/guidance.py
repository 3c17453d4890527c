"""Class-conditional guidance: ``python -m experiments.reproduce table=guidance``.

Two parts (issue 36, items 4 and 6). This module composes runs of the library and reports;
every estimator is a tested function of ``scorelib``.

**1. A 2-D Gaussian mixture whose class is its component** (``table.mixture``: overlapping
isotropic components under the EDM process), where ``grad_x log p_t(c | x)`` and every guided
score have closed forms (``GaussianMixtureTarget.noisy_score(process, conditional=True)``: a
``PerClassScore`` whose ``class_log_prob`` is the exact noisy classifier). Per seed:

* a cross-entropy and a DLSM noise-conditional classifier (``scorelib.nets.ClassifierMLP``
  behind ``scorelib.scores.NoisyClassifier``, trained by ``scorelib.training.classifier.
  train_classifier`` with ``scorelib.objectives.classifier.NoisyCrossEntropy`` and ``DLSM``
  whose frozen score is the exact mixture score), on the same exact labelled draws;
* each classifier's guidance-gradient error against the exact one and its accuracy at
  ``table.mixture.error_sigmas`` (``scorelib.metrics.classifier_gradient_error``,
  ``noisy_classifier_accuracy``; both classifiers see the same noised points);
* samples of the library's sampler (``table.mixture.sampler`` on the EDM grid) for each
  guidance, the classes balanced: the exact conditional source (``w = 1``), classifier-free
  guidance with exact parts (``ClassifierFreeGuidance`` of the ``PerClassScore``, its guide
  the exact mixture), classifier guidance of the exact mixture score by the exact, the CE and
  the DLSM classifier (``ClassifierGuidance``); each judged by the accuracy of the clean
  mixture's Bayes classifier on the samples against their labels
  (``noisy_classifier_accuracy`` of the exact classifier at the process's lowest level) and
  by the per-class C2ST and precision/recall against exact draws of the class law
  (``scorelib.metrics.per_class_two_sample``), beside the floor (exact draws against exact
  draws).

**2. The digits** (the class-conditional digits model, ``experiment=digits_edm_cond``, one
per seed: given in ``table.models`` or trained here into ``runs/cond_seed<s>``; the CE and
DLSM classifier presets of ``experiments.train_classifier`` trained here into
``runs/ce_seed<s>`` and ``runs/dlsm_seed<s>``, DLSM's frozen score the seed's model at its
null label). The reference row is the conditional model unguided (``w = 1``); then plain
CFG, interval CFG (``table.interval``), TCFG and classifier guidance with each classifier
over their scales. Every row is the samples ``python -m experiments.sample`` draws with the
same ``sampler.labels=balanced`` and ``sampler.guidance.*`` (the config is turned into the
source by ``experiments.runs.conditioning.conditioned_source``), judged by
``experiments.runs.evaluation.evaluate_images`` against the test digits: the bundled
classifier's accuracy against the labels, the pooled and per-class pixel C2ST, pixel
precision/recall and FD, each beside its floor.
"""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from omegaconf import DictConfig, OmegaConf

from experiments.build import build_guidance
from experiments.classifier_schema import register_classifier_configs
from experiments.runs import load_run, train_run
from experiments.runs.classifier import ClassifierRun, pin_score_step, score_record
from experiments.runs.conditioning import conditioned_source, sample_labels
from experiments.runs.evaluation import CLASSIFIERS, accuracy_rows, evaluate_images
from experiments.runs.layout import pyplot, save_figure
from experiments.tables.common import (
    check_digits_run,
    check_seeds,
    compose_config,
    quoted_path,
    relative_path,
    scaled,
)
from experiments.tables.digits_models import cells, check, train_model
from scorelib._checks import check_int, check_real, require
from scorelib._io import atomic_write_text
from scorelib.data.images import quantise
from scorelib.data.targets import GaussianMixtureTarget
from scorelib.metrics import (
    FeatureExtractor,
    classifier_gradient_error,
    noisy_classifier_accuracy,
)
from scorelib.metrics.classifier import default_cache_dir
from scorelib.metrics.conditional import per_class_two_sample
from scorelib.nets.classifier import ClassifierMLP
from scorelib.objectives.classifier import DLSM, NoisyCrossEntropy
from scorelib.processes import EDM
from scorelib.samplers import draw_samples, get_sampler, make_grid
from scorelib.scores import Labels, NoisyClassifier
from scorelib.scores.guidance import ClassifierFreeGuidance, ClassifierGuidance
from scorelib.training.classifier import train_classifier

#: The digits methods (``table.methods``): name -> (row label, ``sampler.guidance`` fields
#: besides the scale; the interval is ``table.interval``, the classifier the seed's run of
#: that objective). CFG methods take ``table.cfg_scales``, classifier ones
#: ``table.classifier_scales``.
METHODS = {
    "cfg": ("CFG", {"kind": "cfg"}),
    "interval_cfg": ("interval CFG", {"kind": "cfg", "interval": None}),
    "tcfg": ("TCFG", {"kind": "cfg", "filter": "tangential"}),
    "ce": ("CE classifier guidance", {"kind": "classifier", "classifier": "ce"}),
    "dlsm": ("DLSM classifier guidance", {"kind": "classifier", "classifier": "dlsm"}),
}
CFG_LABELS = tuple(label for label, g in METHODS.values() if g["kind"] == "cfg")
REFERENCE = "conditional model, unguided"

#: The digits columns: (column, evaluate_images key of the samples, of the floor).
DIGITS_COLUMNS = (
    ("accuracy (bundled classifier)", "accuracy_samples", "accuracy_floor"),
    ("C2ST pixels, pooled", "c2st_pixels_samples", "c2st_pixels_floor"),
    ("recall pixels", "recall_pixels_samples", "recall_pixels_floor"),
    ("precision pixels", "precision_pixels_samples", "precision_pixels_floor"),
    ("C2ST pixels, per class", "per_class_c2st_pixels_samples", "per_class_c2st_pixels_floor"),
    ("FD (read last)", "fd", "fd_floor"),
)

#: The mixture sample columns: (column, record key of the samples, of the floor).
MIXTURE_COLUMNS = (
    ("accuracy (Bayes classifier)", "accuracy", "accuracy_floor"),
    ("C2ST vs the class law", "c2st", "c2st_floor"),
    ("recall", "recall", "recall_floor"),
    ("precision", "precision", "precision_floor"),
)

PAPER_DLSM = "DLSM's classifier gradient closer to the true one than CE's (Chao et al. 2022)"
PAPER_CFG = "accuracy up, diversity (recall) down with the scale (Ho and Salimans 2022)"


# --------------------------------------------------------------------------- settings
def _reals(values, field: str, *, low: float = -np.inf, distinct: bool = True) -> list[float]:
    require(
        OmegaConf.is_list(values) or isinstance(values, (list, tuple)),
        field,
        "a list of numbers",
        values,
    )
    out = [check_real(v, field, low=low) for v in values]
    if distinct:
        require(len(set(out)) == len(out), field, "distinct numbers", list(values))
    return out


def _overrides(values, field: str) -> list[str]:
    ok = (OmegaConf.is_list(values) or isinstance(values, (list, tuple))) and all(
        isinstance(v, str) for v in values
    )
    require(ok, field, "a list of overrides", values)
    return list(values)


def mixture_target(mc) -> GaussianMixtureTarget:
    """The mixture of ``table.mixture`` (its class is its component).

    Raises:
      ValueError: naming ``table.mixture.<field>``.
    """
    try:
        return GaussianMixtureTarget.create(
            list(mc.weights), [list(m) for m in mc.means], stds=list(mc.stds), name="mixture"
        )
    except ValueError as e:
        raise ValueError(str(e).replace("target.", "table.mixture.")) from e


def _check_mixture(mc) -> None:
    target = mixture_target(mc)
    require(target.num_classes >= 2, "table.mixture.weights", "at least 2 components", mc.weights)
    for f in ("train_points", "steps", "batch_size", "error_points", "sampler_steps"):
        check_int(mc[f], f"table.mixture.{f}", low=1)
    check_int(mc.samples_per_class, "table.mixture.samples_per_class", low=10)
    check_real(mc.lr, "table.mixture.lr", low=0.0, low_open=True, high_open=True)
    _reals(mc.error_sigmas, "table.mixture.error_sigmas", low=1e-12)
    require(len(mc.error_sigmas) >= 1, "table.mixture.error_sigmas", "at least one level", [])
    _reals(mc.cfg_scales, "table.mixture.cfg_scales")
    require(
        1.0 not in [float(w) for w in mc.cfg_scales],
        "table.mixture.cfg_scales",
        "scales other than 1 (w = 1 is the exact conditional row, shown once)",
        list(mc.cfg_scales),
    )
    _reals(mc.classifier_scales, "table.mixture.classifier_scales")
    try:
        get_sampler(mc.sampler)
    except ValueError as e:
        raise ValueError(f"table.mixture.sampler: {e}") from e
    process = EDM()
    # the objectives' own checks of the noise levels and DLSM's fields, named objective.*
    # (the network's fields are checked when it is built, before the first training step)
    try:
        NoisyCrossEntropy(process=process, **_noise(mc))
        DLSM(process=process, score=target.noisy_score(process), **_noise(mc), **_dlsm(mc))
    except (ValueError, TypeError) as e:
        raise ValueError(f"table.mixture: {e}") from e


def _noise(mc) -> dict:
    out = OmegaConf.to_container(mc.noise, resolve=True)
    if out.get("sigma_range") is not None:
        out["sigma_range"] = tuple(out["sigma_range"])
    return out


def _dlsm(mc) -> dict:
    return OmegaConf.to_container(mc.dlsm, resolve=True)


def _net(mc) -> dict:
    return OmegaConf.to_container(mc.classifier, resolve=True)


def _check_model(i: int, path) -> None:
    """Refuse ``table.models[i]`` unless it is a class-conditional score run of the digits
    whose null label was trained (classifier-free guidance and DLSM's score need it)."""
    field = f"table.models[{i}]"
    check_digits_run(field, path)
    run_cfg = OmegaConf.load(Path(path) / "config.yaml")
    k = int(OmegaConf.select(run_cfg, "model.num_classes") or 0)
    dropout = float(OmegaConf.select(run_cfg, "objective.label_dropout") or 0.0)
    if k == 0 or dropout <= 0:
        what = (
            "an unconditional run (model.num_classes = 0)"
            if k == 0
            else ("a run whose null label was never trained (objective.label_dropout = 0)")
        )
        raise ValueError(
            f"{field}={path}: {what}; the table needs a class-conditional run with label "
            "dropout (python -m experiments.train experiment=digits_edm_cond)"
        )


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError, FileNotFoundError: naming ``table.<field>`` (or, from Hydra and the runs'
        builds, a bad override).
    """
    tc = scaled(cfg, base="small")
    seeds = check_seeds(tc.seeds)
    _check_mixture(tc.mixture)
    models = list(tc.models or [])
    require(
        len(models) <= len(seeds),
        "table.models",
        f"at most one run per seed ({len(seeds)} seeds)",
        models,
    )
    for i, path in enumerate(models):
        _check_model(i, path)
    check_int(tc.samples, "table.samples", low=100)  # 10 per class: the per-class tests
    check_int(tc.batch_size, "table.batch_size", low=1)
    check_int(tc.floor_draws, "table.floor_draws", low=1)
    check_int(tc.two_sample_draws, "table.two_sample_draws", low=1)
    check_int(tc.grid_per_class, "table.grid_per_class", low=1)
    require(isinstance(tc.per_class, bool), "table.per_class", "true or false", tc.per_class)
    methods = list(tc.methods) if OmegaConf.is_list(tc.methods) else tc.methods
    require(
        isinstance(methods, list)
        and bool(methods)
        and set(methods) <= set(METHODS)
        and len(set(methods)) == len(methods),
        "table.methods",
        f"a list of distinct methods of {list(METHODS)}",
        methods,
    )
    cfg_scales = _reals(tc.cfg_scales, "table.cfg_scales")
    require(
        1.0 not in cfg_scales,
        "table.cfg_scales",
        "scales other than 1 (w = 1 is the reference row, the unguided conditional model, "
        "shown once)",
        list(tc.cfg_scales),
    )
    clf_scales = _reals(tc.classifier_scales, "table.classifier_scales")
    require(bool(cfg_scales), "table.cfg_scales", "at least one scale", [])
    require(bool(clf_scales), "table.classifier_scales", "at least one scale", [])
    fig = check_real(tc.figure_scale, "table.figure_scale")
    kinds = {METHODS[m][1]["kind"] for m in methods}
    require(
        (fig in cfg_scales or "cfg" not in kinds)
        and (fig in clf_scales or "classifier" not in kinds),
        "table.figure_scale",
        f"a scale of both table.cfg_scales {cfg_scales} and table.classifier_scales {clf_scales}",
        tc.figure_scale,
    )
    require(
        OmegaConf.is_list(tc.interval) and len(tc.interval) == 2,
        "table.interval",
        "a pair [lo, hi] of VE noise levels",
        tc.interval,
    )
    lo = check_real(tc.interval[0], "table.interval", low=0.0)
    hi = check_real(tc.interval[1], "table.interval", low=0.0, low_open=True)
    require(lo < hi, "table.interval", "a pair [lo, hi] with lo < hi", list(tc.interval))
    model_overrides = _overrides(tc.model_overrides, "table.model_overrides")
    ce = _overrides(tc.ce_overrides, "table.ce_overrides")
    dlsm = _overrides(tc.dlsm_overrides, "table.dlsm_overrides")
    if len(models) < len(seeds):  # a model is trained here: its overrides must build
        check([*model_overrides, f"trainer.seed={seeds[len(models)]}"])
    # the classifiers' configs build (DLSM's frozen score is loaded only once it exists)
    if "ce" in methods:
        ClassifierRun.build(classifier_config(ce, seeds[0]))
    if "dlsm" in methods:
        dlsm_cfg = classifier_config(dlsm, seeds[0], "/not/yet/trained")
        ClassifierRun._make(dlsm_cfg, None, train=False)
    return tc


def classifier_config(overrides, seed: int, score_run=None) -> DictConfig:
    """The ``experiments.train_classifier`` config of ``overrides`` with ``trainer.seed`` (and
    ``score_run``, DLSM's frozen score)."""
    register_classifier_configs()
    extra = [f"trainer.seed={seed}"]
    if score_run:
        extra.append(f"score_run={quoted_path(score_run)}")
    return compose_config("train_classifier", [*overrides, *extra])


# ---------------------------------------------------------------------------- mixture
def mixture_seed(tc: DictConfig, seed: int, log) -> tuple[list, list, dict]:
    """One seed of the mixture part: ``(gradient records, sample records, figure data)``."""
    mc = tc.mixture
    target = mixture_target(mc)
    process = EDM()
    exact = target.noisy_score(process, conditional=True)  # PerClassScore: exact classes
    prior = target.noisy_score(process)  # MixtureScore: the exact unconditional score
    k = target.num_classes
    key = jax.random.key(seed)
    keys = {
        name: jax.random.fold_in(key, i)
        for i, name in enumerate(("draws", "noise", "sample", "accuracy"))
    }
    # every exact draw of the seed in one call (one compiled sampler), then split:
    # training, held-out (gradient error), reference and floor of the two-sample tests
    n = k * int(mc.samples_per_class)
    sizes = [int(mc.train_points), int(mc.error_points), 2 * n, 2 * n]
    draws_x, draws_y = (
        np.asarray(a) for a in target.sample(keys["draws"], sum(sizes), labels=True)
    )
    cuts = np.cumsum(sizes)[:-1]
    (x, xe, ref_x, floor_x), (y, ye, ref_y, floor_y) = (
        np.split(draws_x, cuts),
        np.split(draws_y, cuts),
    )
    objectives = {
        "CE": NoisyCrossEntropy(process=process, **_noise(mc)),
        "DLSM": DLSM(process=process, score=prior, **_noise(mc), **_dlsm(mc)),
    }
    classifiers, train_s = {}, {}
    for name, objective in objectives.items():
        t0 = time.perf_counter()
        try:
            net = ClassifierMLP((target.dim,), k, **_net(mc), rngs=nnx.Rngs(seed))
        except (ValueError, TypeError) as e:
            raise ValueError(f"table.mixture: {e}") from e
        init = NoisyClassifier.create(process, net, sigma_data=target.sigma_data)
        classifiers[name], _ = train_classifier(
            objective,
            init,
            x,
            y,
            steps=int(mc.steps),
            batch_size=int(mc.batch_size),
            lr=float(mc.lr),
            seed=seed,
        )
        train_s[name] = time.perf_counter() - t0
        log(f"[mixture seed {seed}] {name} classifier: {mc.steps} steps, {train_s[name]:.0f} s")

    # the guidance gradient and accuracy of each classifier on the same noised points
    sigmas = [float(s) for s in mc.error_sigmas]
    bayes = noisy_classifier_accuracy(exact, xe, ye, sigmas, keys["noise"])
    grads = []
    for name, clf in classifiers.items():
        err = classifier_gradient_error(clf, exact, xe, ye, sigmas, keys["noise"])
        acc = noisy_classifier_accuracy(clf, xe, ye, sigmas, keys["noise"])
        for i, s in enumerate(sigmas):
            grads.append(
                {
                    "seed": seed,
                    "classifier": name,
                    "sigma": s,
                    "error": float(err["error"][i]),
                    "stderr": float(err["stderr"][i]),
                    "exact_mean_square": float(err["exact_mean_square"][i]),
                    "accuracy": float(acc["accuracy"][i]),
                    "bayes_accuracy": float(bayes["accuracy"][i]),
                    "train_s": train_s[name],
                }
            )
        log(
            f"[mixture seed {seed}] {name} gradient error "
            + ", ".join(f"{s:g}: {e:.3g}" for s, e in zip(sigmas, err["error"], strict=True))
        )

    # samples of each guidance, balanced classes, against exact draws of the class law
    rule = Labels.balanced(k)
    clean = [float(process.ve_sigma(process.t_min))]
    floor = per_class_two_sample(floor_x, floor_y, ref_x, ref_y, seed=seed, pooled=False)["mean"][
        "samples"
    ]
    # on as many exact draws as samples (the compiled classifier of the samples' size)
    floor_acc = noisy_classifier_accuracy(exact, floor_x[:n], floor_y[:n], clean, keys["accuracy"])
    floors = {
        "accuracy_floor": float(floor_acc["accuracy"][0]),
        "c2st_floor": floor["c2st_pixels"],
        "recall_floor": floor["recall_pixels"],
        "precision_floor": floor["precision_pixels"],
    }
    rows = [("exact conditional", 1.0, exact)]
    rows += [
        ("CFG, exact parts", float(w), ClassifierFreeGuidance.create(exact, scale=w))
        for w in mc.cfg_scales
    ]
    for name, clf in (("exact", exact), *classifiers.items()):
        rows += [
            (
                f"classifier guidance, {name} classifier",
                float(s),
                ClassifierGuidance.create(prior, clf, scale=s),
            )
            for s in mc.classifier_scales
        ]
    sampler = get_sampler(mc.sampler)
    grid = make_grid("edm", int(mc.sampler_steps), process, sigma_min=clean[0])
    samples, figure = [], {"samples": {}}
    for label, scale, source in rows:
        source = source.conditioned(rule)
        xs, info = draw_samples(
            sampler, source, keys["sample"], (target.dim,), num_samples=n, batch_size=n, grid=grid
        )
        labels = sample_labels(source, keys["sample"], n)
        rec = {
            "seed": seed,
            "guidance": label,
            "scale": scale,
            "n": n,
            "nfe": int(info["nfe"]),
            "num_nonfinite": int(info["num_nonfinite"]),
            **floors,
        }
        if rec["num_nonfinite"]:  # a guidance that diverged: reported, not evaluated
            log(f"[mixture seed {seed}] {label} {scale:g}: {rec['num_nonfinite']} non-finite")
            samples.append(rec)
            continue
        acc = noisy_classifier_accuracy(exact, xs, labels, clean, keys["accuracy"])
        two = per_class_two_sample(xs, labels, ref_x, ref_y, seed=seed, pooled=False)
        mean = two["mean"]["samples"]
        rec.update(
            accuracy=float(acc["accuracy"][0]),
            accuracy_se=float(acc["stderr"][0]),
            c2st=mean["c2st_pixels"],
            recall=mean["recall_pixels"],
            precision=mean["precision_pixels"],
            c2st_per_class=two["per_class"]["samples"]["c2st_pixels"],
            per_class_n=two["n"],
        )
        samples.append(rec)
        figure["samples"][(label, scale)] = (xs, labels)
        log(
            f"[mixture seed {seed}] {label} {scale:g}: accuracy {rec['accuracy']:.3f}, "
            f"C2ST {rec['c2st']:.3f} (floor {floors['c2st_floor']:.3f}), recall {rec['recall']:.3f}"
        )
    return grads, samples, figure


# ----------------------------------------------------------------------------- digits
def guidance_settings(tc: DictConfig) -> list[tuple[str, float, dict | None]]:
    """``(method, scale, sampler.guidance fields)`` of every digits row of one seed (the
    classifier given by kind, ``ce`` or ``dlsm``); the reference row first, its guidance
    ``None``."""
    out = [(REFERENCE, 1.0, None)]
    for method in tc.methods:
        name, g = METHODS[method]
        scales = tc.cfg_scales if g["kind"] == "cfg" else tc.classifier_scales
        for w in scales:
            fields = dict(g, scale=float(w))
            if "interval" in fields:
                fields["interval"] = [float(v) for v in tc.interval]
            out.append((name, float(w), fields))
    return out


def train_classifier_run(overrides, seed: int, out: Path, log, score_run=None):
    """Train (or resume, or find complete) the classifier run of ``overrides`` in ``out``, as
    ``experiments.train_classifier`` does (DLSM's score checkpoint pinned); returns its
    accuracy record (``ClassifierRun.evaluate``: clean and noisy test accuracy)."""
    t0 = time.perf_counter()
    cfg = pin_score_step(classifier_config(overrides, seed, score_run), out)
    record = score_record(cfg)
    run, state = train_run(
        ClassifierRun,
        cfg,
        out,
        progress=False,
        handle_signals=False,
        tensorboard=False,
        extra=record,
    )
    acc = run.evaluate(state, out)
    wall = time.perf_counter() - t0
    log(f"[{out.name}] {cfg.trainer.steps} steps, {wall:.0f} s")
    return dict(acc, train_s=wall)


def _relative(g: dict, run_dir: Path) -> dict:
    """The classifier run of guidance fields ``g`` as :func:`relative_path` records it."""
    return {"classifier": relative_path(g["classifier"], run_dir)} if "classifier" in g else {}


def digits_seed(tc: DictConfig, i: int, seed: int, run_dir: Path, log):
    """One seed of the digits part: ``(records, classifier records, figure samples, model
    run directory)``."""
    runs = run_dir / "runs"
    given = list(tc.models or [])
    if i < len(given):
        model_dir = Path(given[i])
        log(f"[digits seed {seed}] the given model {model_dir}")
        run, state = load_run(model_dir)
        model_s = None
    else:
        model_dir = runs / f"cond_seed{seed}"
        run, state, model_s = train_model(
            [*tc.model_overrides, f"trainer.seed={seed}"], model_dir, log
        )
    clf_dirs = {"ce": runs / f"ce_seed{seed}", "dlsm": runs / f"dlsm_seed{seed}"}
    clf_records = {}
    if "ce" in tc.methods:
        clf_records["ce"] = train_classifier_run(tc.ce_overrides, seed, clf_dirs["ce"], log)
    if "dlsm" in tc.methods:
        clf_records["dlsm"] = train_classifier_run(
            tc.dlsm_overrides, seed, clf_dirs["dlsm"], log, score_run=model_dir.resolve()
        )
    source = run.source(state.ema_params)
    key = jax.random.key(seed)
    # the bundled classifier of evaluate_images: its accuracy on the samples against their
    # labels and on the test digits (the floor), with the per-class tests or without them
    ds = run.data.images
    ext = FeatureExtractor.load_or_train(CLASSIFIERS["digits"](), default_cache_dir(os.environ))
    records, figure = [], {}
    per = int(tc.grid_per_class)
    for method, scale, fields in guidance_settings(tc):
        g = None
        if fields is not None:
            fields = dict(fields)
            if fields["kind"] == "classifier":
                fields["classifier"] = str(clf_dirs[fields["classifier"]])
            g = build_guidance(OmegaConf.create(fields))
        sampling = dataclasses.replace(run.sampling, labels="balanced", guidance=g)
        guided = conditioned_source(sampling, source, null_trained=run.null_trained)
        t0 = time.perf_counter()
        x, info = draw_samples(
            sampling,
            guided,
            key,
            run.data.data_shape,
            num_samples=int(tc.samples),
            batch_size=int(tc.batch_size),
        )
        sample_s = time.perf_counter() - t0
        labels = sample_labels(guided, key, int(tc.samples))
        rec = {
            "seed": seed,
            "method": method,
            "scale": scale,
            "guidance": None if g is None else {**g, **_relative(g, run_dir)},
            "nfe": int(info["nfe"]),
            "sample_s": sample_s,
            "num_nonfinite": int(info["num_nonfinite"]),
            "model": relative_path(model_dir, run_dir),
            "model_train_s": model_s,
        }
        if rec["num_nonfinite"]:  # a guidance that diverged: reported, not evaluated
            log(f"[digits seed {seed}] {method} {scale:g}: {rec['num_nonfinite']} non-finite")
            records.append(rec)
            continue
        t0 = time.perf_counter()
        m = evaluate_images(
            x,
            ds,
            "digits",
            seed=seed,
            labels=labels if tc.per_class else None,
            floor_draws=int(tc.floor_draws),
            two_sample_draws=int(tc.two_sample_draws),
        )
        rec.update(m, eval_s=time.perf_counter() - t0)
        if not tc.per_class:  # with the labels, evaluate_images gave these keys already
            rec.update(accuracy_rows(quantise(x, ds.levels), labels, ds, ext))
        records.append(rec)
        log(
            f"[digits seed {seed}] {method} {scale:g}: accuracy {rec['accuracy_samples']:.3f}, "
            f"C2ST {m['c2st_pixels_samples']:.3f}, recall {m['recall_pixels_samples']:.3f}, "
            f"FD {m['fd']:.3g} ({sample_s:.0f} + {rec['eval_s']:.0f} s)"
        )
        if method == REFERENCE or scale == float(tc.figure_scale):
            # the first `per` samples of each class (balanced labels: sample j is class j % 10)
            figure[(method, scale)] = (x[: per * 10], labels[: per * 10])
    clf = [{"seed": seed, "classifier": name, **r} for name, r in clf_records.items()]
    sampler = {"name": run.sampling.name, "grid": [float(v) for v in run.sampling.grid]}
    return records, clf, figure, sampler


# ---------------------------------------------------------------------------- the run
def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Both parts; writes ``results.json``, ``figure.png`` (the digits trade-off curves),
    ``mixture.png`` and ``grid.png`` (guided digits per class) into ``run_dir``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    seeds = [int(s) for s in tc.seeds]
    t0 = time.perf_counter()
    grads, mix, mix_fig = [], [], None
    for seed in seeds:
        g, s, fig = mixture_seed(tc, seed, log)
        grads += g
        mix += s
        mix_fig = mix_fig or fig
    mixture_s = time.perf_counter() - t0
    digits, classifiers, grid_fig, sampler = [], [], None, None
    for i, seed in enumerate(seeds):
        r, c, fig, s = digits_seed(tc, i, seed, run_dir, log)
        digits += r
        classifiers += c
        grid_fig = grid_fig or fig
        sampler = sampler or s
    digits_s = time.perf_counter() - t0 - mixture_s
    results = {
        "mixture_gradient": grads,
        "mixture_samples": mix,
        "digits": digits,
        "digits_classifiers": classifiers,
        "digits_sampler": sampler,
        "wall_s": {"mixture": mixture_s, "digits": digits_s},
    }
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1, default=str))
    figures = [run_dir / "figure.png", run_dir / "mixture.png", run_dir / "grid.png"]
    tradeoff_figure(digits, tc, figures[0])
    mixture_figure(grads, mix, mix_fig, figures[1])
    grid_figure(grid_fig, tc, figures[2])
    return report(results, tc, [str(f) for f in figures], run_dir)


# ---------------------------------------------------------------------------- report
def _mean_std(rs, key) -> tuple[float, float]:
    v = np.array([r[key] for r in rs if r.get(key) is not None], float)
    return (float(v.mean()), float(v.std())) if v.size else (np.nan, np.nan)


def _order(records, keys) -> list:
    return list(dict.fromkeys(tuple(r[k] for k in keys) for r in records))


def _diverged(rs) -> str | None:
    bad = [r for r in rs if r.get("num_nonfinite")]
    if not bad:
        return None
    return f"diverged: {sum(r['num_nonfinite'] for r in bad)} non-finite samples"


def mixture_gradient_table(grads) -> dict:
    cols = [
        "sigma (VE)",
        "CE: relative gradient error",
        "CE: MC s.e.",
        "DLSM: relative gradient error",
        "DLSM: MC s.e.",
        "DLSM / CE",
        "accuracy CE / DLSM / Bayes",
        "mean |grad log p_t(c|x)|^2",
        "paper",
    ]
    rows = []
    for (sigma,) in _order(grads, ("sigma",)):
        by = {
            c: [r for r in grads if r["sigma"] == sigma and r["classifier"] == c]
            for c in ("CE", "DLSM")
        }
        ce, dl = by["CE"], by["DLSM"]
        acc = "/".join(f"{_mean_std(rs, 'accuracy')[0]:.3f}" for rs in (ce, dl))
        rows.append(
            [
                sigma,
                *cells(ce, ["error"]),
                _mean_std(ce, "stderr")[0],
                *cells(dl, ["error"]),
                _mean_std(dl, "stderr")[0],
                _mean_std(dl, "error")[0] / _mean_std(ce, "error")[0],
                f"{acc}/{_mean_std(ce, 'bayes_accuracy')[0]:.3f}",
                _mean_std(ce, "exact_mean_square")[0],
                PAPER_DLSM if sigma == grads[0]["sigma"] else "",
            ]
        )
    return {
        "name": "mixture_gradient",
        "caption": "2-D Gaussian mixture, class = component: each noise-conditional "
        "classifier's guidance-gradient error against the exact grad_x log p_t(c | x), "
        "sum |g - g*|^2 / sum |g*|^2 (0 exact, 1 a zero gradient), and its accuracy on the "
        "same noised points.",
        "columns": cols,
        "rows": rows,
    }


def mixture_samples_table(mix) -> dict:
    cols = ["guidance", "scale", *(c for c, _, _ in MIXTURE_COLUMNS), "compared with", "paper"]
    rows = []
    for label, scale in _order(mix, ("guidance", "scale")):
        rs = [r for r in mix if (r["guidance"], r["scale"]) == (label, scale)]
        bad = _diverged(rs)
        if bad:
            rows.append([label, scale, bad, *([None] * (len(MIXTURE_COLUMNS) - 1)), "", ""])
            continue
        against = "the class law (departure from it)"
        if label == "exact conditional" or (label.endswith("exact classifier") and scale == 1.0):
            against = "the class law (the target)"
        elif label.startswith("classifier guidance") and scale == 1.0:
            against = "the class law (the target were the classifier exact)"
        elif label.startswith("CFG") and scale == 0.0:
            against = "the class law (w = 0: the unconditional law, known-bad)"
        paper = ""
        if label.startswith("CFG") and scale == max(
            r["scale"] for r in mix if r["guidance"] == label
        ):
            paper = PAPER_CFG
        rows.append([label, scale, *cells(rs, [k for _, k, _ in MIXTURE_COLUMNS]), against, paper])
    first = [r for r in mix if r["guidance"] == "exact conditional"]
    rows.append(
        [
            "exact draws (floor)",
            None,
            *cells(first, [k for _, _, k in MIXTURE_COLUMNS]),
            "the class law",
            "",
        ]
    )
    return {
        "name": "mixture_samples",
        "caption": "2-D Gaussian mixture: samples of each guidance (balanced classes) judged "
        "by the clean mixture's Bayes classifier (accuracy against their labels) and per "
        "class against exact draws of the class law (C2ST, precision/recall; mean over "
        "classes), beside exact draws against exact draws (the floor).",
        "columns": cols,
        "rows": rows,
    }


def digits_table(digits, tc) -> dict:
    cols = ["method", "scale", *(c for c, _, _ in DIGITS_COLUMNS), "paper"]
    rows = []
    for method, scale in _order(digits, ("method", "scale")):
        rs = [r for r in digits if (r["method"], r["scale"]) == (method, scale)]
        bad = _diverged(rs)
        if bad:
            rows.append([method, scale, bad, *([None] * (len(DIGITS_COLUMNS) - 1)), ""])
            continue
        paper = PAPER_CFG if (method == "CFG" and scale == max(map(float, tc.cfg_scales))) else ""
        rows.append([method, scale, *cells(rs, [k for _, k, _ in DIGITS_COLUMNS]), paper])
    first = [r for r in digits if r["method"] == REFERENCE]
    rows.append(
        [
            "training / test digits (floor)",
            None,
            *cells(first, [k for _, _, k in DIGITS_COLUMNS]),
            "",
        ]
    )
    return {
        "name": "digits",
        "caption": "Guided samples of the class-conditional digits model (balanced classes) "
        "against the test digits: the bundled classifier's accuracy against the labels, "
        "pooled and per-class pixel C2ST (0.5 = indistinguishable), pixel recall and "
        "precision, FD in the classifier's features; mean ± std over the seeds. The floor "
        "row: the classifier on the test digits, training digits against test digits.",
        "columns": cols,
        "rows": rows,
    }


def classifiers_table(classifiers) -> dict:
    sigmas = classifiers[0]["sigma"]
    cols = ["classifier", *(f"test accuracy, sigma {s:.3g}" for s in sigmas), "train s"]
    rows = []
    for name, label in (("ce", "cross-entropy (CE)"), ("dlsm", "DLSM + CE")):
        rs = [r for r in classifiers if r["classifier"] == name]
        if not rs:
            continue
        accs = np.array([r["accuracy"] for r in rs], float)
        acc_cells = [
            float(accs[0, j])
            if len(rs) == 1
            else f"{accs[:, j].mean():.3f} ± {accs[:, j].std():.2g}"
            for j in range(accs.shape[1])
        ]
        rows.append([label, *acc_cells, _mean_std(rs, "train_s")[0]])
    return {
        "name": "digits_classifiers",
        "caption": "The digits' noise-conditional classifiers of the guidance rows: accuracy "
        "on the test digits, clean (the process's lowest level) and noised "
        "(experiments.train_classifier's report).",
        "columns": cols,
        "rows": rows,
    }


def _interval_levels(tc, sampler: dict) -> str:
    """The levels of the digits model's grid inside ``table.interval`` (the first seed's)."""
    grid = np.asarray(sampler["grid"], float)
    lo, hi = (float(v) for v in tc.interval)
    inside = [f"{s:.3g}" for s in grid if lo < s <= hi]
    return (
        f"{len(inside)} of the {int(np.sum(grid > 0))} positive levels of the model's "
        f"{sampler['name']} grid ({', '.join(inside) or 'none'})"
    )


def _sampler(results: dict) -> str:
    """The digits model's sampler in words (the first seed's)."""
    sampler = results.get("digits_sampler")
    if not sampler:
        return "none"
    grid = np.asarray(sampler["grid"], float)
    return (
        f"{sampler['name']}, {len(grid) - 1} steps from sigma {grid[0]:g} to "
        f"{grid[grid > 0].min():g}, then 0"
    )


def report(results: dict, tc: DictConfig, figures: list, run_dir: Path) -> dict:
    grads, mix = results["mixture_gradient"], results["mixture_samples"]
    digits, classifiers = results["digits"], results["digits_classifiers"]
    mc = tc.mixture
    seeds = [int(s) for s in tc.seeds]
    ref = [r for r in digits if r["method"] == REFERENCE and "n" in r]
    first = ref[0] if ref else {}
    lo, hi = (float(v) for v in tc.interval)
    model_note = (
        f"Digits models: {list(tc.models)} given for the first seeds"
        if tc.models
        else "Digits models: trained here"
    )
    levels = []  # (sigma, DLSM / CE, whether DLSM is lower beyond the noise)
    for (sigma,) in _order(grads, ("sigma",)):
        at = {
            c: [r for r in grads if r["sigma"] == sigma and r["classifier"] == c]
            for c in ("CE", "DLSM")
        }
        (ce, ce_sd), (dl, dl_sd) = (_mean_std(at[c], "error") for c in ("CE", "DLSM"))
        # the noise of each mean: the larger of its Monte-Carlo s.e. and its seeds' spread
        noise = max(_mean_std(at["CE"], "stderr")[0], ce_sd) + max(
            _mean_std(at["DLSM"], "stderr")[0], dl_sd
        )
        levels.append(
            (
                sigma,
                dl / ce,
                "lower"
                if ce - dl > 2 * noise
                else ("higher" if dl - ce > 2 * noise else "within the noise"),
            )
        )
    verdicts = {v: sum(1 for *_, w in levels if w == v) for v in ("lower", "higher")}
    notes = [
        f"Mixture: {len(mc.weights)} isotropic Gaussian components, weights {list(mc.weights)}, "
        f"means {[list(m) for m in mc.means]}, stds {list(mc.stds)} (overlapping: the clean "
        f"Bayes accuracy is {_mean_std(mix, 'accuracy_floor')[0]:.3f}); EDM process; the "
        "class of a draw is its component.",
        f"Mixture classifiers: ClassifierMLP {dict(_net(mc))}, {mc.steps} Adam steps of "
        f"{mc.batch_size} from {mc.train_points} exact labelled draws per seed, noise levels "
        f"{dict(_noise(mc))}; DLSM {dict(_dlsm(mc))} with the exact mixture score frozen. "
        f"Gradient error and accuracy on {mc.error_points} held-out exact draws, noised "
        "identically for both (scorelib.metrics.classifier_gradient_error; MC s.e. by the "
        "delta method, mean over seeds).",
        f"Measured: DLSM's gradient error is lower than CE's at {verdicts['lower']} and "
        f"higher at {verdicts['higher']} of {len(levels)} levels by more than twice the noise "
        "(the sum over both of the larger of the MC s.e. and the seeds' std); DLSM / CE by "
        f"sigma: {', '.join(f'{s:g}: {v:.2f}' for s, v, _ in levels)}.",
        f"Mixture samples: {mc.sampler} on the EDM grid ({mc.sampler_steps} steps, sigma 80 "
        f"to 0.002, a final step to 0), {mc.samples_per_class} per class. Accuracy: the "
        "exact classifier of the clean mixture (noisy_classifier_accuracy at sigma 0.002) "
        "against the labels. C2ST (5-fold) and precision/recall (k = 3) per class against "
        "exact draws of the class law, mean over classes. Only w = 1 (and classifier "
        "guidance with the exact classifier at s = 1, the same field) has the class law as "
        "its target; for other scales the guided field is not the score of a diffused law "
        "with a closed form, and the C2ST measures how far guidance moves the samples from "
        "the class law, not an error. CFG with exact parts at w equals exact classifier "
        "guidance at s = w (the same field).",
        f"{model_note}; otherwise experiments.train with {list(tc.model_overrides)} "
        f"(trainer.seed = seed) in runs/cond_seed<s>. Classifiers: experiments.train_classifier "
        f"with {list(tc.ce_overrides)} and {list(tc.dlsm_overrides)} (DLSM's score_run the "
        "seed's model, at its null label) in runs/ce_seed<s>, runs/dlsm_seed<s>.",
        f"Digits rows: {tc.samples} samples each, the model's own sampler ({_sampler(results)}), "
        "sampler.labels=balanced, sampling key = the seed; each row is "
        "python -m experiments.sample run_dir=<model> sampler.labels=balanced "
        f"sampler.num_samples={tc.samples} sampler.seed=<seed> sampler.guidance.kind=... "
        "sampler.guidance.scale=... (the same samples). Scales: the lerp weight w of CFG "
        "(1 = the conditional model; w = 1 + w of Ho and Salimans), the classifier scale s "
        "(score + s grad log p_t(c|x) of the model at its null label; 1 = Bayes' rule).",
        f"Interval CFG: guidance on sigma in ({lo:g}, {hi:g}], the conditional model "
        "elsewhere: the levels of the guidance-interval authors' FID-optimal EDM2-XXL command "
        "(kynkaat/guidance-interval README: Heun steps 17-22 of the 32-step EDM grid, sigma "
        "1.17 to 0.28), in sigma as the paper states it (EDM2's latents have sigma_data 0.5, "
        "as the digits); guidance at the highest levels pulls samples towards the class "
        "means and costs diversity, at the lowest it is unnecessary (Kynkäänniemi et al. "
        f"2024). On the digits it covers {_interval_levels(tc, results['digits_sampler'])}. TCFG: "
        "sampler.guidance.filter=tangential (Kwon et al. 2025).",
    ]
    if first:
        notes.append(
            f"Digits metrics (experiments.runs.evaluation.evaluate_images, floor_draws "
            f"{tc.floor_draws}): {first['n']} samples quantised to the digits' "
            f"{first['levels']} grey levels; the bundled classifier's accuracy against the "
            "labels (floor: its accuracy on the test digits); pooled C2ST and precision/recall "
            f"on {first['two_sample_n']} samples against as many test digits, mean over "
            f"{first['two_sample_draws']} disjoint slices; per-class C2ST, the mean over "
            "the classes of each class's samples against its test digits; FD on all "
            f"{first['n']} in the classifier's features. FD at this n has a finite-sample bias "
            "of order tr(cov)/n: read it beside its floor at the same n, and last.",
        )
    notes.append(
        "Cells: mean ± std over the seeds (population std), one value for one seed. "
        f"Wall time: mixture {results['wall_s']['mixture']:.0f} s, digits "
        f"{results['wall_s']['digits']:.0f} s."
    )
    tables = [mixture_gradient_table(grads), mixture_samples_table(mix)]
    if digits:
        tables.append(digits_table(digits, tc))
    if classifiers:
        tables.append(classifiers_table(classifiers))
    return {"seeds": seeds, "tables": tables, "notes": notes, "figure": figures}


# ---------------------------------------------------------------------------- figures
def _curves(digits, tc):
    """``{method: [(scale, {key: (mean, std)})]}`` of the digits rows, the reference row at
    the start of each CFG method's curve."""
    keys = ("accuracy_samples", "recall_pixels_samples", "c2st_pixels_samples")
    ref = [r for r in digits if r["method"] == REFERENCE and "n" in r]
    out = {}
    for method in (label for label, _ in METHODS.values()):
        if not any(r["method"] == method for r in digits):
            continue
        pts = [(1.0, ref)] if method in CFG_LABELS and ref else []
        for (scale,) in _order([r for r in digits if r["method"] == method], ("scale",)):
            rs = [r for r in digits if r["method"] == method and r["scale"] == scale and "n" in r]
            if rs:
                pts.append((scale, rs))
        out[method] = [(s, {k: _mean_std(rs, k) for k in keys}) for s, rs in pts]
    return out, ref


def tradeoff_figure(digits, tc, path: Path) -> None:
    """The trade-off curves: accuracy, recall and C2ST against the scale, and recall
    against accuracy; one curve per method, error bars over the seeds, floors dashed."""
    plt = pyplot()
    curves, ref = _curves(digits, tc)
    panels = (
        ("accuracy_samples", "accuracy (bundled classifier)", "accuracy_floor"),
        ("recall_pixels_samples", "pixel recall", "recall_pixels_floor"),
        ("c2st_pixels_samples", "pooled pixel C2ST", "c2st_pixels_floor"),
    )
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (key, name, floor) in zip(axes[:3], panels, strict=True):
        for method, pts in curves.items():
            if pts:
                s = [p[0] for p in pts]
                m = [p[1][key][0] for p in pts]
                e = [p[1][key][1] for p in pts]
                ax.errorbar(s, m, yerr=e, marker="o", capsize=3, label=method)
        if ref:
            ax.axhline(_mean_std(ref, floor)[0], ls="--", c="k", lw=0.8, label="floor")
        ax.set_xlabel("guidance scale (w for CFG, s for classifier)")
        ax.set_ylabel(name)
    ax = axes[3]
    for method, pts in curves.items():
        if pts:
            ax.errorbar(
                [p[1]["accuracy_samples"][0] for p in pts],
                [p[1]["recall_pixels_samples"][0] for p in pts],
                xerr=[p[1]["accuracy_samples"][1] for p in pts],
                yerr=[p[1]["recall_pixels_samples"][1] for p in pts],
                marker="o",
                capsize=3,
                label=method,
            )
    ax.set_xlabel("accuracy")
    ax.set_ylabel("pixel recall")
    ax.set_title("quality-diversity trade-off", fontsize=9)
    axes[0].legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def mixture_figure(grads, mix, fig_data, path: Path) -> None:
    """Left: each classifier's gradient error against sigma (error bars over the seeds).
    Then the first seed's samples of a few guidances, coloured by label."""
    plt = pyplot()
    shown = [("exact conditional", 1.0)]
    for label in (
        "CFG, exact parts",
        "classifier guidance, CE classifier",
        "classifier guidance, DLSM classifier",
    ):
        scales = sorted(s for (g, s) in fig_data["samples"] if g == label)
        if scales:
            shown.append((label, scales[-1]))
    fig, axes = plt.subplots(1, 1 + len(shown), figsize=(3.6 * (1 + len(shown)), 3.4))
    ax = axes[0]
    for name in ("CE", "DLSM"):
        sig = [s for (s,) in _order(grads, ("sigma",))]
        ms = [
            _mean_std([r for r in grads if r["sigma"] == s and r["classifier"] == name], "error")
            for s in sig
        ]
        ax.errorbar(
            sig, [m for m, _ in ms], yerr=[e for _, e in ms], marker="o", capsize=3, label=name
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sigma (VE)")
    ax.set_ylabel("relative gradient error")
    ax.legend(fontsize=7)
    for ax, key in zip(axes[1:], shown, strict=True):
        if key not in fig_data["samples"]:
            ax.axis("off")
            continue
        x, y = fig_data["samples"][key]
        x = np.asarray(x)
        ax.scatter(x[:, 0], x[:, 1], c=np.asarray(y), s=1, cmap="tab10", vmin=0, vmax=9)
        ax.set_title(f"{key[0]}, scale {key[1]:g}", fontsize=8)
        ax.set_xlim(-3.5, 3.5)
        ax.set_ylim(-2.5, 3.5)
    save_figure(fig, path, dpi=110)


def grid_figure(fig_data, tc, path: Path) -> None:
    """Guided digits per class (rows: classes 0-9), ``table.grid_per_class`` samples each,
    one block per method: the reference (w = 1) and every method at ``table.figure_scale``;
    the same per-example noise in every block."""
    plt = pyplot()
    per = int(tc.grid_per_class)
    blocks = list(fig_data.items())
    fig, axes = plt.subplots(
        1, len(blocks), figsize=(1.0 + 0.45 * per * len(blocks), 5.2), squeeze=False
    )
    for ax, ((method, scale), (x, labels)) in zip(axes[0], blocks, strict=True):
        h, w = x.shape[1:3]
        canvas = np.ones((10 * (h + 1), per * (w + 1)))
        for c in range(10):
            imgs = x[np.asarray(labels) == c][:per]
            for j, img in enumerate(imgs):
                canvas[c * (h + 1) : c * (h + 1) + h, j * (w + 1) : j * (w + 1) + w] = (
                    np.clip(img[..., 0], -1, 1) + 1
                ) / 2
        ax.imshow(canvas, cmap="gray", vmin=0, vmax=1)
        ax.set_title(textwrap.fill(f"{method}, scale {scale:g}", 16), fontsize=6)
        ax.set_xticks([])
        ax.set_yticks([(h + 1) * c + h / 2 for c in range(10)])
        ax.set_yticklabels([str(c) for c in range(10)], fontsize=6)
    save_figure(fig, path, dpi=130)
