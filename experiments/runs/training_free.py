"""Training-free runs: ``python -m experiments.sample experiment=cfdm_digits``.

A closed-form score of the training set (``score=cfdm``: the smoothed closed-form score,
``scorelib/scores/smoothed.py``) needs no checkpoint: :class:`TrainingFreeRun` builds it
from ``cfg.score`` and ``cfg.data``, draws ``sampler=cfdm`` samples
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
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig

from experiments import build, schema
from experiments.runs.base import Run
from experiments.runs.evaluation import evaluate_and_write
from experiments.runs.layout import fmt_value, samples_name
from scorelib._checks import check_choice, check_int, require
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


@dataclasses.dataclass(frozen=True)
class CFDMSampling:
    """``sampler=cfdm``: Euler in rectified-flow time from an exact draw at ``T`` with ``S``
    steps per unit time (:func:`scorelib.samplers.cfdm.cfdm_sample`), with the score
    fields that change the samples."""

    T: float
    S: int
    num_samples: int
    batch_size: int
    seed: int
    score: dict

    @property
    def record(self) -> dict:
        return {
            "name": "cfdm",
            "T": self.T,
            "S": self.S,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
        }


@dataclasses.dataclass
class TrainingFreeRun(Run):
    """A smoothed closed-form score of the training set and its sampler: no training, no
    checkpoint; its samples live under ``<run_dir>/samples/<name>``."""

    source: SmoothedScore
    train: np.ndarray
    sampling: CFDMSampling

    @classmethod
    def build(cls, cfg: DictConfig) -> TrainingFreeRun:
        """Every check before anything is compiled.

        Raises:
          ValueError: naming the field.
        """
        smp, sc = cfg.sampler, cfg.score
        require(
            smp.get("name") == "cfdm",
            "sampler",
            "sampler=cfdm with a training-free score",
            smp.get("name"),
        )
        cfdm_steps(smp.T, smp.S)
        sampling = CFDMSampling(
            T=float(smp.T),
            S=int(smp.S),
            num_samples=check_int(smp.num_samples, "sampler.num_samples", low=1),
            batch_size=check_int(smp.batch_size, "sampler.batch_size", low=1),
            seed=check_int(smp.seed, "sampler.seed", low=0),
            score=dict(sc),
        )
        require(cfg.data is not None, "data", "a data option (data=digits, data=toy, ...)", None)
        data = build.build_data(cfg)
        train = training_set(data, sc)
        return cls(
            cfg=cfg, data=data, source=build_source(sc, train), train=train, sampling=sampling
        )

    @classmethod
    def samples_name(cls, sampling: CFDMSampling, use_ema: bool = True) -> str:
        """``cfdm_T<T>_S<S>_n<num>_seed<seed>`` plus ``+<field>-<value>`` for each score field
        that differs from its default (so no two configurations share a directory)."""
        defaults = schema.CFDMScoreConfig()
        extras = [
            (f.name, sampling.score[f.name])
            for f in dataclasses.fields(defaults)
            if f.name not in ("name", "chunk")
            and sampling.score[f.name] != getattr(defaults, f.name)
        ]
        return samples_name(
            f"cfdm_T{fmt_value(sampling.T)}_S{sampling.S}",
            num_samples=sampling.num_samples,
            seed=sampling.seed,
            extras=extras,
        )

    def draw(self, params=None, *, progress: bool = True):
        """Samples of the smoothed closed-form score (``params`` unused: there are none)."""
        s = self.sampling

        def sample(src, key, shape, first_index=0):
            return cfdm_sample(src, key, shape[0], T=s.T, S=s.S, first_index=first_index)

        return draw_samples(
            sample,
            self.source,
            jax.random.key(s.seed),
            self.data.data_shape,
            num_samples=s.num_samples,
            batch_size=s.batch_size,
            progress=progress,
            desc="sampling (cfdm)",
        )

    def sample_and_evaluate(self, run_dir: Path) -> Path:
        """Draw, write and evaluate the samples under ``run_dir/samples/<name>``; returns
        the directory."""
        x, info = self.draw()
        sc, s = self.cfg.score, self.sampling
        title = (
            f"{self.cfg.name}: sigma-CFDM, sigma_s={sc.sigma_s}, M={sc.M}, {sc.estimator}, "
            f"T={s.T}, {info['nfe']} steps, N={len(self.train)} training points"
        )
        meta = {
            "sampler": dict(self.cfg.sampler),
            "score": dict(sc),
            "n_train": int(len(self.train)),
            **info,
            "title": title,
        }
        out = self.write_samples(x, meta, run_dir, step=None)
        prior = np.asarray(jax.random.normal(jax.random.key(s.seed), x.shape))
        evaluate_and_write(
            x,
            self.data,
            out,
            seed=s.seed,
            prior=prior,
            train=None if self.data.images is not None else self.train,
            title=f"{self.cfg.name}: {out}",
        )
        return out
