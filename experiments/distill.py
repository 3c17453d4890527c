"""One-step f-distillation: ``python -m experiments.distill [experiment=<preset>] [overrides]``.

The teacher is an ``experiments.train`` run (``teacher.run_dir=``) or the exact score of a
target (``data=target``), the Gaussian fitted to a data set or its training split's exact
score; see ``configs/distill.yaml``. The run directory, ``outputs/<preset>/<overrides>``,
is a pure function of the command: the same command resumes the run bit for bit (the
whole :class:`scorelib.distill.DistillState` is checkpointed), a larger ``trainer.steps``
continues it. Every check (the config fields, the teacher's checkpoint against its model,
an existing run's config and checkpoint against this command's) runs before anything is
compiled or written. ``metrics.jsonl`` logs the losses, the ratios ``r_mean``/``r_min``/
``r_max``, the largest weight ``h_max``, the R1 penalty ``loss_r1`` and the per-bin ratio
means ``ratio_bin<k>``; a non-finite loss stops the run with its step number. The run
prints what the discriminator heads read (``discriminator: 4 heads on the teacher
network's features 32x32x256, ...``). At the end one-step samples of the student's EMA are
written under ``samples/step<k>/onestep_1_n<num>_seed<seed>/`` (``onestep_nfe2_...`` with a
refining stage, ``distill.sigma_refine``: one step, two network evaluations); ``python -m
experiments.sample run_dir=<run>`` and ``python -m experiments.evaluate run_dir=<run>``
work on the run as on a training run.

The run's lifecycle is :func:`experiments.runs.train_and_sample` with
:class:`experiments.runs.DistillRun`; data-parallel over every device of every process, as
``experiments.train``.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.common import clean_errors, hydra_app
from experiments.runs import DistillRun, check_run, train_and_sample
from experiments.schema import register_configs

register_configs()


@clean_errors
def run_distillation(cfg: DictConfig) -> Path:
    return train_and_sample(DistillRun, cfg, Path(HydraConfig.get().runtime.output_dir))


def check_distillation(cfg: DictConfig) -> None:  # a sweep's check of each job before any starts
    check_run(DistillRun, cfg, Path(HydraConfig.get().runtime.output_dir))


main = hydra_app("distill", check=check_distillation)(run_distillation)


if __name__ == "__main__":
    main()
