"""Train a score model: ``python -m experiments.train [experiment=<preset>] [overrides]``.

The run directory (``outputs/<preset name>/<overrides>``) is a pure function of the
command, so running the same command again resumes from its latest checkpoint. At the
end the run draws samples with ``sampler`` from the EMA parameters and writes them
(``samples/<sampler>_<steps>/samples.npz`` and ``.png``) beside the checkpoints,
``metrics.jsonl``, TensorBoard events, ``config.yaml`` and ``run_info.json``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import hydra
import jax
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments import build
from experiments.common import clean_errors, write_run_info
from experiments.outputs import samples_dir, save_samples
from experiments.sampling import check_sampler, draw
from experiments.schema import register_configs
from scorelib import training

register_configs()


@dataclasses.dataclass
class Run:
    """Everything a training run is made of, built and validated from its config."""

    cfg: DictConfig
    process: object
    data: build.Data
    graphdef: object
    state: training.TrainState
    step_fn: object
    sampling: build.Sampling
    optimizer: object

    def source(self, params):
        """The score source of the network with ``params`` (e.g. the EMA parameters)."""
        return training.network_source(self.process, self.graphdef, self.cfg.data.sigma_data)(
            params, None
        )


def model_fingerprint(cfg: DictConfig, data_shape) -> dict:
    """What must match between a checkpoint and the model it is restored into."""
    return {"model": build.to_container(cfg.model), "data_shape": list(data_shape)}


def setup(cfg: DictConfig) -> Run:
    """Build every object of the run; every config error surfaces here, before compiling."""
    tc = cfg.trainer
    for field in ("steps", "batch_size", "log_every", "ckpt_every", "keep_last"):
        if tc[field] < 1:
            raise ValueError(f"trainer.{field} must be >= 1; got {tc[field]}")
    process = build.build_process(cfg)
    objective = build.build_objective(cfg, process)
    sampling = build.build_sampler(cfg, process)
    data = build.build_data(cfg)
    model = build.build_model(cfg, data.data_shape, tc.seed)
    optimizer = training.make_optimizer(
        cfg.optim.lr,
        cfg.optim.warmup_steps,
        cfg.optim.grad_clip,
        cfg.optim.b1,
        cfg.optim.b2,
        cfg.optim.eps,
    )
    ema = training.EMA(
        batch_size=tc.batch_size,
        decay=tc.ema_decay,
        halflife_nimg=tc.ema_halflife_nimg,
        rampup_ratio=tc.ema_rampup_ratio,
    )
    graphdef, state = training.init_state(model, optimizer, tc.seed)
    dropout = float(cfg.model.get("dropout", 0.0)) > 0
    make_source = training.network_source(process, graphdef, cfg.data.sigma_data, dropout=dropout)
    step_fn = training.make_train_step(
        objective,
        make_source,
        optimizer,
        ema,
        data.batch_fn(tc.batch_size, tc.seed),
        lr_schedule=training.warmup_schedule(cfg.optim.lr, cfg.optim.warmup_steps),
    )
    run = Run(cfg, process, data, graphdef, state, step_fn, sampling, optimizer)
    check_sampler(sampling, run.source(state.params), data.data_shape)
    return run


def checkpointer(run: Run, run_dir: Path) -> training.Checkpointer:
    tc = run.cfg.trainer
    return training.Checkpointer(
        run_dir / "checkpoints",
        save_every=tc.ckpt_every,
        keep_last=tc.keep_last,
        config=model_fingerprint(run.cfg, run.data.data_shape),
    )


def sample_and_save(run: Run, params, out_root: Path, *, step: int) -> Path:
    """Draw ``sampler.num_samples`` samples from ``params`` and write them under ``out_root``."""
    sc = run.cfg.sampler
    x, info = draw(
        run.sampling,
        run.source(params),
        run.data.data_shape,
        num_samples=sc.num_samples,
        batch_size=sc.batch_size,
        seed=sc.seed,
    )
    out_dir = samples_dir(out_root, build.to_container(sc))
    meta = {
        "sampler": build.to_container(sc),
        "checkpoint_step": step,
        **info,
        "title": f"{run.cfg.name}: {sc.name}, {sc.steps} steps, NFE {info.get('nfe')}",
    }
    ref = run.data.reference(2000) if run.data.images is None else None
    save_samples(out_dir, x, meta, reference=ref)
    if info["num_nonfinite"]:
        print(
            f"warning: {info['num_nonfinite']} of {len(x)} samples are not finite "
            "(their trajectories diverged); they are kept in samples.npz"
        )
    return out_dir


@clean_errors
def run_training(cfg: DictConfig) -> Path:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run = setup(cfg)
    write_run_info(run_dir, cfg, seed=cfg.trainer.seed)
    ckpt = checkpointer(run, run_dir)
    try:
        state = training.train(
            run.state,
            run.step_fn,
            num_steps=cfg.trainer.steps,
            ckpt=ckpt,
            log_dir=str(run_dir),
            log_every=cfg.trainer.log_every,
            nonfinite=cfg.trainer.nonfinite,
            desc=cfg.name,
        )
    finally:
        ckpt.close()
    out = sample_and_save(run, state.ema_params, run_dir / "samples", step=int(state.step))
    print(f"run directory: {run_dir}\nsamples: {out}")
    return run_dir


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    jax.config.update("jax_default_matmul_precision", "highest")
    run_training(cfg)


if __name__ == "__main__":
    main()
