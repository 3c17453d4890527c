"""Train a score model: ``python -m experiments.train [experiment=<preset>] [overrides]``.

The run directory, ``outputs/<preset name>/<overrides>``, is named by what defines the
model (data, process, model, objective, optim, trainer seed and batch size, EMA,
``init_from``), not by the sampler or by ``trainer.steps``/``log_every``/``ckpt_every``/
``keep_*`` (``configs/train.yaml``). So the same command resumes the run, a larger
``trainer.steps`` continues it, and another sampler reuses its checkpoint and only draws
samples. Every check (config, identity of an existing run, checkpoint compatibility, the
step to reach) runs before anything is written. At the end the run draws samples with
``sampler`` from the EMA parameters and writes them under
``samples/step<k>/<sampler>_<steps>_n<num>_seed<seed>[+<field>-<value>...]/`` beside the
checkpoints, ``metrics.jsonl``, ``train.log``, TensorBoard events (``tb/``),
``config.yaml`` (the last launch's resolved config) and ``run_info.json`` (every launch).

The run's lifecycle is :func:`experiments.runs.train_and_sample` with
:class:`experiments.runs.ScoreRun`.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.common import clean_errors, hydra_app
from experiments.runs import ScoreRun, check_run, train_and_sample
from experiments.schema import register_configs

register_configs()


@clean_errors
def run_training(cfg: DictConfig) -> Path:
    return train_and_sample(ScoreRun, cfg, Path(HydraConfig.get().runtime.output_dir))


def check_training(cfg: DictConfig) -> None:  # a sweep's check of each job before any starts
    check_run(ScoreRun, cfg, Path(HydraConfig.get().runtime.output_dir))


main = hydra_app("train", check=check_training)(run_training)


if __name__ == "__main__":
    main()
