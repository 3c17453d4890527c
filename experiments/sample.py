"""Sample from a trained run: ``python -m experiments.sample run_dir=<run> [sampler=...]``.

Rebuilds the model from the run's ``config.yaml``, restores its latest checkpoint (a
checkpoint from a different model config is refused with a clear error), and writes
``<run>/samples/<sampler>_<steps>_seed<seed>/samples.{npz,json,png}``. Without
``sampler=<name>`` the run's own sampler config is used, with any ``sampler.<field>=``
overrides applied (``sampler.seed=1`` redraws the run's samples with another seed).
"""

from __future__ import annotations

from pathlib import Path

import hydra
import jax
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments import train
from experiments.common import clean_errors
from experiments.schema import register_configs
from scorelib import training

register_configs()


def load_run(run_dir: str | Path, sampler_cfg: DictConfig | None = None, step: int | None = None):
    """The ``train.Run`` of a run directory (optionally with another sampler) and its state
    at checkpoint ``step`` (default: the latest).

    Raises:
      FileNotFoundError: no ``config.yaml`` or no checkpoint (at ``step``) in ``run_dir``.
      ValueError: the checkpoint does not match the run's model config.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: not found; run_dir must be a training run directory")
    cfg = OmegaConf.load(cfg_path)
    if sampler_cfg is not None:
        cfg.sampler = sampler_cfg
    run = train.setup(cfg)
    ckpt = train.checkpointer(run, run_dir)
    try:
        steps = ckpt.all_steps()
        if not steps:
            raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint to sample from")
        if step is not None and step not in steps:
            raise FileNotFoundError(f"step={step}: no such checkpoint in {run_dir}; have {steps}")
        state = ckpt.restore(
            steps[-1] if step is None else step, training.abstract_state(run.state)
        )
    finally:
        ckpt.close()
    return run, state


def sampler_config(cfg: DictConfig, run_cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The sampler config to sample with.

    Args:
      cfg: this app's composed config (its ``sampler`` group defaults to heun).
      run_cfg: the training run's ``config.yaml``.
      overrides: the command-line overrides (``HydraConfig.get().overrides.task``).

    Returns:
      ``cfg.sampler`` when the command line chose a group (``sampler=pc``), with the
      run's ``num_samples`` and ``batch_size``, so results stay comparable; otherwise the
      run's sampler. Either way each ``sampler.<field>=`` of the command line is
      taken from ``cfg``.
    """
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    if "sampler" in keys:
        out = cfg.sampler.copy()
        for field in ("num_samples", "batch_size"):
            if field in run_cfg.sampler:
                out[field] = run_cfg.sampler[field]
    else:
        out = run_cfg.sampler.copy()
    for key in keys:
        if key.startswith("sampler."):
            field = key.removeprefix("sampler.")
            OmegaConf.update(out, field, OmegaConf.select(cfg.sampler, field), merge=False)
    return out


@clean_errors
def run_sampling(cfg: DictConfig) -> Path:
    run_cfg_path = Path(cfg.run_dir) / "config.yaml"
    sampler_cfg = cfg.sampler
    if run_cfg_path.is_file():
        sampler_cfg = sampler_config(
            cfg, OmegaConf.load(run_cfg_path), list(HydraConfig.get().overrides.task)
        )
    run, state = load_run(cfg.run_dir, sampler_cfg, cfg.step)
    params = state.ema_params if cfg.use_ema else state.params
    root = Path(cfg.run_dir) / "samples"
    if cfg.step is not None:
        root = root / f"step{cfg.step}"
    out = train.sample_and_save(run, params, root, step=int(state.step))
    print(f"samples: {out}")
    return out


@hydra.main(config_path="../configs", config_name="sample", version_base="1.3")
def main(cfg: DictConfig) -> None:
    jax.config.update("jax_default_matmul_precision", "highest")
    run_sampling(cfg)


if __name__ == "__main__":
    main()
