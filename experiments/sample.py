"""Sample from a run: ``python -m experiments.sample run_dir=<run> [sampler=...]``.

Rebuilds the run from its ``config.yaml``, restores a checkpoint (the newest readable one,
or ``step=``; a checkpoint of a different config is refused with a clear error), and
writes ``samples.{npz,json,png}`` under
``<run>/samples/step<k>/<sampler>_<steps>_n<num>_seed<seed>[+<field>-<value>...]``: every
field that changes the samples (each option that differs from its default, the grid and
its options, ``float64``, ``use_ema=false``) is in the name, so no samples overwrite
others. ``sampler=run`` (the default) is the run's own sampler, with any
``sampler.<field>=`` on top (``sampler.seed=1`` redraws the run's samples with another
seed); ``sampler=<name>`` picks another, keeping the run's ``num_samples`` and
``batch_size`` unless given. A distillation run draws one-step samples of its student
(only ``sampler.num_samples``/``batch_size``/``seed`` apply). With a training-free score
(``experiment=cfdm_*``: σ-CFDM; ``experiment=rdmc_*``: reverse diffusion Monte Carlo on a
target, with any registered sampler) there is no run to load: the samples are drawn and
evaluated (:class:`experiments.runs.TrainingFreeRun`).

From Python: ``experiments.runs.load_run``.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.common import clean_errors, console_to_log, hydra_app
from experiments.runs import TrainingFreeRun, configure_jax, read_config, run_kind
from experiments.runs.layout import display_path
from experiments.schema import register_configs

register_configs()


def sampler_of(cfg: DictConfig):
    """``(kind, sampler config)`` of the trained run ``cfg.run_dir`` and this command.

    Raises:
      ValueError: ``process=`` or ``data=`` given (a trained run samples its own), or as
        ``kind.sampler_config``.
    """
    for field in ("process", "data"):  # a trained run samples its own
        if cfg.get(field) is not None:
            raise ValueError(
                f"{field} must be null when sampling a trained run (it uses the run's own "
                f"{field}); {field}= is for training-free scores (score=cfdm | rdmc)"
            )
    kind = run_kind(cfg.run_dir)
    overrides = list(HydraConfig.get().overrides.task)
    return kind, kind.sampler_config(cfg, read_config(cfg.run_dir), overrides)


@console_to_log
@clean_errors
def run_sampling(cfg: DictConfig) -> Path:
    configure_jax()
    if cfg.get("score") is not None:  # training-free: no run, no checkpoint
        return TrainingFreeRun.build(cfg).sample_and_evaluate(Path(cfg.run_dir))
    kind, sampler = sampler_of(cfg)
    run, state = kind.load(cfg.run_dir, step=cfg.step, sampler_cfg=sampler)
    out = run.save_samples(state, Path(cfg.run_dir), use_ema=cfg.use_ema)
    print(f"samples: {display_path(out)}")
    return out


def check_sampling(cfg: DictConfig) -> None:  # a sweep's check of each job before any starts
    if cfg.get("score") is not None:
        TrainingFreeRun.build(cfg)
    else:
        kind, sampler = sampler_of(cfg)
        kind.prepare(cfg.run_dir, step=cfg.step, sampler_cfg=sampler)


main = hydra_app("sample", check=check_sampling)(run_sampling)


if __name__ == "__main__":
    main()
