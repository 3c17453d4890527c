"""Training-free runs: ``python -m experiments.sample experiment=cfdm_digits`` (or
``cfdm_moons``, ``rdmc_gmm``, ``rdmc_manywell``).

A score that needs no training needs no checkpoint: :class:`TrainingFreeRun` builds it from
``cfg.score`` and ``cfg.data`` (and ``cfg.process``), draws samples and writes, under
``<run_dir>/samples/<name>``, the samples (``samples.npz``/``.json``/``.png``) and their
evaluation (``eval_samples.json``/``.md``: FD and memorisation for images, energy distance and
sliced W2 against exact data beside another draw of the data and the prior for points), as
``experiments.sample`` and ``experiments.evaluate`` do for a trained run. Two scores:

* ``score=cfdm``: the smoothed closed-form score of the training set
  (``scorelib/scores/smoothed.py``) on the rectified-flow process, drawn with
  ``sampler=cfdm`` (``scorelib/samplers/cfdm.py``); samples
  ``cfdm_T<T>_S<S>_n<num>_seed<seed>[+<field>-<value>...]``;
* ``score=rdmc``: reverse diffusion Monte Carlo's score of ``data=target``'s log-density
  (``scorelib/scores/rdmc.py``) on ``process=`` (``process=ou``, the paper's), drawn with
  any registered sampler (its grid built on that process; the sampler's driver binds the
  source's draws to each example); samples named as a trained run's
  (``<sampler>_<steps>_n<num>_seed<seed>``) plus every score and process field that differs
  from its default; ``samples.json`` and the printed table report the target gradient and
  log-density evaluations per sample.

Every field is checked before anything is compiled; an option the chosen score, estimator,
backend or sampler does not take is refused (``score.k`` with ``score.estimator=exact``,
``score.n_proposals`` with ``score.init=scaled``, ``sampler=cfdm`` with ``score=rdmc``,
``process=`` with ``score=cfdm``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments import build, schema
from experiments.common import command_line
from experiments.runs.base import Run
from experiments.runs.evaluation import evaluate_and_write
from experiments.runs.layout import display_path, fmt_value, samples_name
from experiments.runs.score import check_sampler, sampler_name_parts
from scorelib._checks import check_choice, check_int, require
from scorelib.data import toy_sample
from scorelib.processes import Process
from scorelib.processes.rectified import RectifiedFlow
from scorelib.samplers import SAMPLERS, draw_samples
from scorelib.samplers.cfdm import cfdm_sample, cfdm_steps
from scorelib.scores import EmpiricalScore, ReverseDiffusionScore
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


def changed_fields(node: dict, defaults: dict, skip=()) -> list[tuple[str, Any]]:
    """``[(field, value)]`` of the fields of ``node`` whose value differs from ``defaults``
    (a field without a default counts as changed), in ``node``'s order."""
    return [
        (k, v) for k, v in node.items() if k not in skip and (k not in defaults or v != defaults[k])
    ]


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

    def name(self) -> str:
        """``cfdm_T<T>_S<S>_n<num>_seed<seed>`` plus ``+<field>-<value>`` for each score field
        that differs from its default (so no two configurations share a directory)."""
        defaults = dataclasses.asdict(schema.CFDMScoreConfig())
        return samples_name(
            f"cfdm_T{fmt_value(self.T)}_S{self.S}",
            num_samples=self.num_samples,
            seed=self.seed,
            extras=changed_fields(self.score, defaults, skip=("name", "chunk")),
        )

    def __call__(self, source, key, shape, first_index=0):
        return cfdm_sample(source, key, shape[0], T=self.T, S=self.S, first_index=first_index)


@dataclasses.dataclass(frozen=True)
class RDMCSampling:
    """A registered sampler (``sampler=<name>``, its grid on the run's process) on a random
    score source (the sampler's driver binds its draws to each block's examples), with the score
    and process fields that change the samples."""

    sampler: build.Sampling
    batch_size: int
    score: dict
    process: dict

    @property
    def record(self) -> dict:
        return self.sampler.record

    @property
    def num_samples(self) -> int:
        return self.record["num_samples"]

    @property
    def seed(self) -> int:
        return self.record["seed"]

    def name(self) -> str:
        """The sampler's name as a trained run's (:func:`sampler_name_parts`) plus
        ``+<field>-<value>`` for each score and process field that differs from its default
        (a process other than ``process=ou`` adds ``+process-<function or class>``)."""
        head, extras = sampler_name_parts(self.record)
        extras += changed_fields(self.score, schema_defaults_of("score"), skip=("name",))
        target = self.process.get("_target_")
        ou = schema.OUProcessConfig._target_
        if target != ou:
            extras.append(("process", str(target).rsplit(".", 1)[-1]))
        defaults = schema_defaults_of("process") if target == ou else {}
        extras += changed_fields(self.process, defaults, skip=("_target_",))
        return samples_name(head, num_samples=self.num_samples, seed=self.seed, extras=extras)

    def __call__(self, source, key, shape, first_index=0, **kw):
        return self.sampler(source, key, shape, first_index=first_index, **kw)


def schema_defaults_of(group: str) -> dict:
    """The defaults of ``score=rdmc`` (``group='score'``) or ``process=ou`` (``'process'``)."""
    typ = schema.RDMCScoreConfig if group == "score" else schema.OUProcessConfig
    return OmegaConf.to_container(OmegaConf.structured(typ))


def build_cfdm(cfg: DictConfig, data: build.Data) -> dict:
    """The fields of a ``score=cfdm`` :class:`TrainingFreeRun`.

    Raises:
      ValueError: naming the field (``sampler`` other than ``sampler=cfdm``, ``process``
        given, a ``score.<field>``).
    """
    smp, sc = cfg.sampler, cfg.score
    require(smp.get("name") == "cfdm", "sampler", "sampler=cfdm with score=cfdm", smp.get("name"))
    require(
        cfg.get("process") is None,
        "process",
        "null with score=cfdm (it runs on the rectified-flow process)",
        OmegaConf.select(cfg, "process._target_"),
    )
    cfdm_steps(smp.T, smp.S)
    sampling = CFDMSampling(
        T=float(smp.T),
        S=int(smp.S),
        num_samples=check_int(smp.num_samples, "sampler.num_samples", low=1),
        batch_size=check_int(smp.batch_size, "sampler.batch_size", low=1),
        seed=check_int(smp.seed, "sampler.seed", low=0),
        score=OmegaConf.to_container(sc, resolve=True),
    )
    train = training_set(data, sc)
    return {
        "source": build_source(sc, train),
        "train": train,
        "sampling": sampling,
        "process": RectifiedFlow(),
    }


def build_rdmc(cfg: DictConfig, data: build.Data) -> dict:
    """The fields of a ``score=rdmc`` :class:`TrainingFreeRun`: the source, and the sampler
    traced once on it (its options checked) without compiling.

    Raises:
      ValueError: naming the field (``data`` not a target with a log-density, ``process``
        missing, ``sampler=cfdm``, a ``score.<field>``, a ``sampler.<field>``).
    """
    sc = cfg.score
    require(
        data.target is not None,
        "data",
        "data=target, a target with a log-density (dim, log_prob, score) for score=rdmc",
        f"data={data.name}",
    )
    require(
        cfg.get("process") is not None,
        "process",
        "a noise process for score=rdmc (process=ou: the paper's Ornstein-Uhlenbeck process)",
        None,
    )
    name = cfg.sampler.get("name")
    require(
        name in SAMPLERS,
        "sampler",
        f"a registered sampler with score=rdmc (one of {sorted(SAMPLERS)})",
        name,
    )
    process = build.build_process(cfg)
    opts = {k: v for k, v in OmegaConf.to_container(sc, resolve=True).items() if k != "name"}
    source = ReverseDiffusionScore.create(data.target, process=process, **opts)
    sampler = build.build_sampler(cfg, process)
    require(
        not sampler.conditional,
        "sampler.labels",
        "null with a training-free score (score=rdmc is unconditional: no labels, no guidance)",
        sampler.labels if sampler.labels is not None else sampler.guidance,
    )
    sampling = RDMCSampling(
        sampler=sampler,
        batch_size=int(cfg.sampler.batch_size),
        score=OmegaConf.to_container(sc, resolve=True),
        process=OmegaConf.to_container(cfg.process, resolve=True),
    )
    check_sampler(sampling, source, data.data_shape)
    return {"source": source, "train": None, "sampling": sampling, "process": process}


#: ``score.name`` -> the builder of that score's run fields.
SCORES = {"cfdm": build_cfdm, "rdmc": build_rdmc}


@dataclasses.dataclass
class TrainingFreeRun(Run):
    """A score that needs no training and its sampler: no checkpoint; its samples live
    under ``<run_dir>/samples/<name>``.

    Attributes:
      source: the score source (a ``SmoothedScore`` or a ``ReverseDiffusionScore``).
      train: the training points a closed-form score is made of (``None`` for rdMC).
      sampling: :class:`CFDMSampling` or :class:`RDMCSampling`.
      process: the process the samples are drawn on (its prior is the baseline row).
    """

    source: Any
    train: np.ndarray | None
    sampling: CFDMSampling | RDMCSampling
    process: Process

    @classmethod
    def build(cls, cfg: DictConfig) -> TrainingFreeRun:
        """Every check before anything is compiled.

        Raises:
          ValueError: naming the field.
        """
        kind = check_choice(cfg.score.get("name"), "score.name", tuple(SCORES))
        require(cfg.data is not None, "data", "a data option (data=digits, data=toy, ...)", None)
        data = build.build_data(cfg)
        return cls(cfg=cfg, data=data, **SCORES[kind](cfg, data))

    @classmethod
    def samples_name(cls, sampling: CFDMSampling | RDMCSampling, use_ema: bool = True) -> str:
        """The samples directory's name (:meth:`CFDMSampling.name`, :meth:`RDMCSampling.name`):
        a pure function of what the samples depend on."""
        return sampling.name()

    def draw(self, params=None, *, progress: bool = True):
        """Samples of the score (``params`` unused: there are none); for a source that
        counts them, ``info["target_evaluations"]`` holds the target gradient and
        log-density evaluations per sample."""
        s = self.sampling
        x, info = draw_samples(
            s,
            self.source,
            jax.random.key(s.seed),
            self.data.data_shape,
            num_samples=s.num_samples,
            batch_size=s.batch_size,
            progress=progress,
            desc=f"sampling ({s.record['name']}, {self.cfg.score.name})",
        )
        if hasattr(self.source, "target_evaluations"):
            info["target_evaluations"] = self.source.target_evaluations(int(info["nfe"]))
        return x, info

    def title(self, info: dict) -> str:
        """What the samples are, for the PNG and the printed table."""
        sc, s = self.cfg.score, self.sampling
        if sc.name == "cfdm":
            return (
                f"{self.cfg.name}: sigma-CFDM, sigma_s={sc.sigma_s}, M={sc.M}, {sc.estimator}, "
                f"T={s.T}, {info['nfe']} steps, N={len(self.train)} training points"
            )
        ev = info["target_evaluations"]
        return (
            f"{self.cfg.name}: rdMC ({sc.method}, {sc.n_samples} chains x {sc.n_steps} steps, "
            f"init={sc.init}), {s.record['name']} NFE {info['nfe']}: {ev['grad']} target "
            f"gradients + {ev['density']} log-densities per sample"
        )

    def sample_and_evaluate(self, run_dir: Path) -> Path:
        """Draw, write and evaluate the samples under ``run_dir/samples/<name>``; returns
        the directory."""
        x, info = self.draw()
        s = self.sampling
        meta = {
            "sampler": dict(s.record),
            "score": OmegaConf.to_container(self.cfg.score, resolve=True),
            **({} if self.train is None else {"n_train": int(len(self.train))}),
            **({"process": s.process} if isinstance(s, RDMCSampling) else {}),
            **info,
            "title": self.title(info),
            "command": command_line(),  # read when run_dir is given to sample or evaluate
        }
        out = self.write_samples(x, meta, run_dir, step=None)
        prior = np.asarray(self.process.prior_sample(jax.random.key(s.seed), x.shape))
        cost = {k: info[k] for k in ("target_evaluations", "nfe") if k in info}
        evaluate_and_write(
            x,
            self.data,
            out,
            seed=s.seed,
            prior=prior,
            train=None if self.data.images is not None or self.train is None else self.train,
            title=f"{self.cfg.name}: {display_path(out)}",
            extra=cost if "target_evaluations" in cost else None,
        )
        return out
