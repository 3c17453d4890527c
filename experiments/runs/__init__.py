"""Runs as objects: one lifecycle for every kind of run, under thin Hydra entry points.

A run is built from its config, validated before anything is compiled or written, and
lives in a directory that is a pure function of the command (:mod:`.base`: identity and
lock, resume with checkpoint fallback, the signal-aware loop, loading at a step, naming
and saving samples; :mod:`.layout`: the directory layout; :mod:`.evaluation`: every
metric of a run's samples beside its floor). The kinds implement only what differs:

* :class:`ScoreRun` (``experiments.train``): a score network trained with an objective;
* :class:`DistillRun` (``experiments.distill``): a one-step student distilled from a
  teacher score source;
* :class:`ClassifierRun` (``experiments.train_classifier``): a noise-conditional classifier
  for classifier guidance (no samples; :func:`experiments.runs.classifier.load_classifier`);
* :class:`TrainingFreeRun` (``experiments.sample experiment=cfdm_*`` or ``rdmc_*``): a score
  that needs no training (σ-CFDM's closed form of the training set, rdMC's estimate for a
  target with a log-density), sampled without a checkpoint.

From Python::

    from experiments.runs import load_run
    run, state = load_run("outputs/digits_edm")      # the newest readable checkpoint
    source = run.source(state.ema_params)           # a scorelib ScoreSource
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from experiments.runs.base import (
    Run,
    TrainedRun,
    check_run,
    configure_jax,
    train_and_sample,
    train_run,
)
from experiments.runs.classifier import ClassifierRun
from experiments.runs.distill import DistillRun
from experiments.runs.layout import read_config, saved_steps
from experiments.runs.score import ScoreRun
from experiments.runs.training_free import TrainingFreeRun


def run_kind(run_dir: str | Path) -> type[TrainedRun]:
    """The kind of the run in ``run_dir``: :class:`DistillRun` when its config has a
    ``distill`` section, :class:`ClassifierRun` when it has a ``classifier`` section, else
    :class:`ScoreRun`.

    Raises:
      FileNotFoundError: ``run_dir`` has no ``config.yaml``.
    """
    cfg = read_config(run_dir)
    if "distill" in cfg:
        return DistillRun
    return ClassifierRun if "classifier" in cfg else ScoreRun


def load_run(run_dir: str | Path, step: int | None = None, sampler_cfg: DictConfig | None = None):
    """``(run, state)`` of a run directory at checkpoint ``step`` (default: the newest
    readable checkpoint).

    Args:
      run_dir: a directory written by ``experiments.train`` or ``experiments.distill``.
      step: a checkpoint step.
      sampler_cfg: a sampler config to build ``run.sampling`` with; default the run's own.

    Returns:
      ``(run, state)``. For a score run ``run.source(state.ema_params)`` is the trained score
      source, ``run.process`` its process, ``run.cfg`` the run's config, ``run.data`` its
      data; ``state`` the :class:`scorelib.training.TrainState` (``params``,
      ``ema_params``, ``step``).

    Raises:
      FileNotFoundError: no ``config.yaml`` or no checkpoint (at ``step``) in ``run_dir``.
      ValueError: the checkpoint does not match the run's config.
    """
    return run_kind(run_dir).load(run_dir, step=step, sampler_cfg=sampler_cfg)


__all__ = [
    "Run",
    "TrainedRun",
    "ScoreRun",
    "ClassifierRun",
    "DistillRun",
    "TrainingFreeRun",
    "check_run",
    "configure_jax",
    "load_run",
    "read_config",
    "run_kind",
    "saved_steps",
    "train_and_sample",
    "train_run",
]
