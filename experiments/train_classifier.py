"""Train a noise-conditional classifier for classifier guidance:
``python -m experiments.train_classifier [experiment=<preset>] [overrides]``.

``objective=ce`` (cross-entropy on noised inputs) or ``objective=dlsm score_run=<an
experiments.train run>`` (DLSM plus cross-entropy against the run's frozen EMA score), on
labelled images (``data=digits | mnist | npz``); see ``configs/train_classifier.yaml``. The run
directory, ``outputs/<preset name>/<overrides>``, is a pure function of the command: the same
command resumes it bit for bit, a larger ``trainer.steps`` continues it; every check runs
before anything is written. At the end the run reports its accuracy on the test split, clean
and at a few noise levels (``accuracy.json``). Guide a score run with it:
``python -m experiments.sample run_dir=<score run> sampler.guidance.kind=classifier
sampler.guidance.classifier=<this run> sampler.labels=balanced``.

The run's lifecycle is :func:`experiments.runs.classifier.train_and_evaluate` with
:class:`experiments.runs.classifier.ClassifierRun`.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.classifier_schema import register_classifier_configs
from experiments.common import clean_errors, hydra_app
from experiments.runs import check_run
from experiments.runs.classifier import ClassifierRun, train_and_evaluate
from experiments.schema import register_configs

register_configs()
register_classifier_configs()


@clean_errors
def run_training(cfg: DictConfig) -> Path:
    return train_and_evaluate(cfg, Path(HydraConfig.get().runtime.output_dir))


def check_training(cfg: DictConfig) -> None:  # a sweep's check of each job before any starts
    check_run(ClassifierRun, cfg, Path(HydraConfig.get().runtime.output_dir))


main = hydra_app("train_classifier", check=check_training)(run_training)


if __name__ == "__main__":
    main()
