"""Training-free sampling: ``python -m experiments.sample experiment=cfdm_digits``.

A closed-form score of the training set (``score=cfdm``: the smoothed closed-form score,
``scorelib/scores/smoothed.py``) needs no checkpoint: this module builds it from
``cfg.score`` and ``cfg.data``, draws ``sampler=cfdm`` samples
(``scorelib/samplers/cfdm.py``) and writes, under
``<run_dir>/samples/<cfdm_T.._S.._n.._seed..[+<field>-<value>...]>``, the samples
(``samples.npz``/``.json``/``.png``) and their evaluation (``eval.json``/``eval.md``: FD and
memorisation for images, energy distance and sliced W2 for 2-D), as
``experiments.sample`` and ``experiments.evaluate`` do for a trained run.

Every field is checked before anything is compiled; an option the chosen estimator or
backend does not take is refused (``score.k`` with ``score.estimator=exact``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig

from experiments import build, schema
from experiments.evaluate import (
    evaluate_images,
    evaluate_points,
    format_image_table,
    format_points_table,
)
from experiments.outputs import _fmt, save_samples
from scorelib._checks import check_choice, check_int, require
from scorelib._io import atomic_write_text
from scorelib.data import toy_sample
from scorelib.processes.rectified import RectifiedFlow
from scorelib.samplers import draw_samples
from scorelib.samplers.cfdm import cfdm_sample, cfdm_steps
from scorelib.scores import EmpiricalScore
from scorelib.scores.neighbours import NeighbourScore
from scorelib.scores.smoothed import SmoothedScore

NN_FIELDS = ("k", "l", "backend", "index", "nlist", "nprobe", "hnsw_m", "ef_search")
TRAIN_SEED = 1234  # the toy training set's seed (held-out reference: data.reference)


def training_set(data: build.Data, sc: DictConfig) -> np.ndarray:
    """The training points: the image train split, or ``score.n_train`` toy draws.

    Raises:
      ValueError: naming ``score.n_train`` (toys only, >= 1) or ``data.name``.
    """
    if data.images is not None:
        require(
            sc.n_train is None, "score.n_train", "null for image data (the train split)", sc.n_train
        )
        return np.asarray(data.images.train)
    require(data.target is None, "data.name", "an image set or a toy", data.name)
    n = check_int(1000 if sc.n_train is None else sc.n_train, "score.n_train", low=1)
    return np.asarray(toy_sample(data.name.split(":", 1)[1], n, TRAIN_SEED))


def build_source(sc: DictConfig, train: np.ndarray) -> SmoothedScore:
    """The ``score=cfdm`` source over ``train`` on the rectified-flow process.

    Raises:
      ValueError: naming the ``score.<field>`` at fault.
    """
    check_choice(sc.name, "score.name", ("cfdm",))
    estimator = check_choice(sc.estimator, "score.estimator", ("exact", "nn"))
    chunk = check_int(sc.chunk, "score.chunk", low=1)
    table = EmpiricalScore.create(RectifiedFlow(), train, chunk=chunk)
    if estimator == "exact":
        for f in NN_FIELDS:
            require(sc[f] is None, f"score.{f}", "null with score.estimator=exact", sc[f])
        est = table
    else:
        given = {f: sc[f] for f in NN_FIELDS if sc[f] is not None}
        est = NeighbourScore.create(table, **{"k": 15, "l": 15, **given})
    return SmoothedScore.create(est, sigma_s=sc.sigma_s, M=sc.M, redraw=sc.redraw)


def samples_name(sc: DictConfig, smp: DictConfig) -> str:
    """``cfdm_T<T>_S<S>_n<num>_seed<seed>`` plus ``+<field>-<value>`` for each score field
    that differs from its default (so no two configurations share a directory)."""
    defaults = schema.CFDMScoreConfig()
    extras = [
        (f.name, sc[f.name])
        for f in dataclasses.fields(defaults)
        if f.name not in ("name", "chunk") and sc[f.name] != getattr(defaults, f.name)
    ]
    base = f"cfdm_T{_fmt(float(smp.T))}_S{smp.S}_n{smp.num_samples}_seed{smp.seed}"
    return base + "".join(f"+{k}-{_fmt(v)}" for k, v in extras)


def run_training_free(cfg: DictConfig) -> Path:
    """Sample, save and evaluate (module docstring); returns the samples directory.

    Raises:
      ValueError: naming the field, before anything is compiled.
    """
    smp, sc = cfg.sampler, cfg.score
    require(
        smp.get("name") == "cfdm",
        "sampler",
        "sampler=cfdm with a training-free score",
        smp.get("name"),
    )
    cfdm_steps(smp.T, smp.S)
    num = check_int(smp.num_samples, "sampler.num_samples", low=1)
    batch = check_int(smp.batch_size, "sampler.batch_size", low=1)
    seed = check_int(smp.seed, "sampler.seed", low=0)
    require(cfg.data is not None, "data", "a data option (data=digits, data=toy, ...)", None)
    data = build.build_data(cfg)
    train = training_set(data, sc)
    source = build_source(sc, train)

    def sample(src, key, shape, first_index=0):
        return cfdm_sample(src, key, shape[0], T=smp.T, S=smp.S, first_index=first_index)

    x, info = draw_samples(
        sample,
        source,
        jax.random.key(seed),
        data.data_shape,
        num_samples=num,
        batch_size=batch,
        progress=True,
        desc="sampling (cfdm)",
    )
    out = Path(cfg.run_dir) / "samples" / samples_name(sc, smp)
    title = (
        f"{cfg.name}: sigma-CFDM, sigma_s={sc.sigma_s}, M={sc.M}, {sc.estimator}, "
        f"T={smp.T}, {info['nfe']} steps, N={len(train)} training points"
    )
    meta = {
        "sampler": dict(smp),
        "score": dict(sc),
        "n_train": int(len(train)),
        **info,
        "title": title,
    }
    ref = data.reference(2000) if data.images is None else None
    levels = None if data.images is None else data.images.levels
    save_samples(out, x, meta, reference=ref, levels=levels)
    if data.images is not None:
        result = evaluate_images(x, data.images, data.name, seed=seed, progress=True)
        table = format_image_table(result, data.name)
    else:
        ref = data.reference(num, seed=seed + 1)
        prior = np.asarray(jax.random.normal(jax.random.key(seed), x.shape))
        result = evaluate_points(x, ref, seed=seed, prior=prior)
        table = format_points_table(result)
    atomic_write_text(out / "eval.json", json.dumps(result, indent=2))
    atomic_write_text(out / "eval.md", table + "\n")
    print(f"\n{cfg.name}: {out}\n\n{table}\n")
    return out
