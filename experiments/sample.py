"""Sample from a trained run: ``python -m experiments.sample run_dir=<run> [sampler=...]``.

Rebuilds the model from the run's ``config.yaml``, restores a checkpoint (the latest, or
``step=``; a checkpoint of a different model config is refused with a clear error), and
writes ``samples.{npz,json,png}`` under
``<run>/samples/step<k>/<sampler>_<steps>_n<num>_seed<seed>[+<field>-<value>...]``: every
field that changes the samples (each option that differs from its default, the grid and
its options, ``float64``, ``use_ema=false``) is in the name, so no samples overwrite
others. ``sampler=run`` (the default) is the run's own sampler, with any
``sampler.<field>=`` on top (``sampler.seed=1`` redraws the run's samples with another
seed); ``sampler=<name>`` picks another, keeping the run's ``num_samples`` and
``batch_size`` unless given.

From Python, :func:`load_run` gives the run's objects and a checkpoint's state::

    run, state = load_run("outputs/toy_dsm")
    source = run.source(state.ema_params)  # a scorelib ScoreSource
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments import schema
from experiments.build import Run, checkpointer, setup
from experiments.common import clean_errors, hydra_app
from experiments.outputs import samples_dir, save_samples, saved_steps
from scorelib import training
from scorelib.samplers import draw_samples

schema.register_configs()


# --------------------------------------------------------------------------- drawing


def sample_and_save(
    run: Run, params, run_dir: Path, *, step: int, use_ema: bool = True, progress: bool = True
) -> Path:
    """Draw ``sampler.num_samples`` samples from ``params`` and write them under
    ``run_dir/samples`` (see :func:`experiments.outputs.samples_dir`); returns the directory.
    Each batch is split over this process's devices (``draw_samples(devices=...)``: the
    samples of one device with batches of ``ceil(batch_size / devices)``)."""
    sc = run.cfg.sampler
    x, info = draw_samples(
        run.sampling,
        run.source(params),
        jax.random.key(sc.seed),
        run.data.data_shape,
        num_samples=sc.num_samples,
        batch_size=sc.batch_size,
        progress=progress,
        desc=f"sampling ({run.sampling.name})",
        devices=jax.local_devices(),  # each batch split over this process's devices
    )
    record = run.sampling.record
    out_dir = samples_dir(Path(run_dir), record, use_ema=use_ema, step=step)
    weights = "EMA" if use_ema else "raw params"
    title = (
        f"{_display(Path(run_dir))}\n{type(run.process).__name__}, {record['name']} "
        f"{record['steps']} steps (NFE {info.get('nfe')}), step {step}, {weights}"
    )
    meta = {
        "sampler": record,
        "use_ema": use_ema,
        "checkpoint_step": step,
        "grid_ve_sigma": [float(s) for s in run.sampling.grid],
        **info,
        "title": title,
    }
    ref = run.data.reference(2000) if run.data.images is None else None
    levels = None if run.data.images is None else run.data.images.levels
    save_samples(out_dir, x, meta, reference=ref, levels=levels)
    if info["num_nonfinite"]:
        print(
            f"warning: {info['num_nonfinite']} of {len(x)} samples are not finite "
            "(their trajectories diverged); they are kept in samples.npz"
        )
    return out_dir


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- the run's sampler


def run_sampler(run_cfg: DictConfig) -> DictConfig:
    """A run's stored sampler config, typed by its sampler's schema.

    Keys the schema lacks, and grid options the run's grid does not take, are dropped:
    configs written before the per-sampler schemas hold every option of every sampler.

    Raises:
      ValueError: naming ``sampler.name`` for an unknown sampler.
    """
    stored = OmegaConf.to_container(run_cfg.sampler, resolve=True)
    typ = schema.sampler_schema(stored["name"])
    fields = {f.name for f in dataclasses.fields(typ)}
    grid = stored.get("grid") or typ.__dataclass_fields__["grid"].default
    unused = set(schema.GRID_FIELDS) - set(schema.GRID_OPTIONS.get(grid, ()))
    kept = {k: v for k, v in stored.items() if k in fields and k not in unused}
    return OmegaConf.merge(OmegaConf.structured(typ), kept)


def sampler_config(cfg: DictConfig, run_cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The sampler config to sample with.

    Args:
      cfg: this app's composed config; ``cfg.sampler`` is ``sampler=run`` (every field null
        unless given) or the group the command line chose.
      run_cfg: the training run's ``config.yaml``.
      overrides: the command-line overrides (``HydraConfig.get().overrides.task``).

    Returns:
      For ``sampler=run``, the run's sampler with each field given on top; for
      ``sampler=<name>``, ``cfg.sampler`` with the run's ``num_samples`` and
      ``batch_size`` unless the command line gives them, so results stay comparable.

    Raises:
      ValueError: a field the run's sampler does not have, or ``sampler.name`` changed.
    """
    if not issubclass(OmegaConf.get_type(cfg.sampler) or dict, schema.RunSamplerConfig):
        out = cfg.sampler.copy()
        keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        for field in ("num_samples", "batch_size"):
            if f"sampler.{field}" not in keys and field in run_cfg.sampler:
                out[field] = run_cfg.sampler[field]
        return out
    out = run_sampler(run_cfg)
    name = out.name
    for key, value in cfg.sampler.items():
        if value is None:
            continue
        if key == "name" and value != name:
            raise ValueError(
                f"sampler.name cannot change the run's sampler ({name}): choose another with "
                f"sampler={value}; got sampler.name={value!r}"
            )
        if key not in out:
            options = sorted(schema.sampler_options(name))
            raise ValueError(
                f"sampler.{key} is not an option of sampler={name}, the run's sampler (its "
                f"options: {options or 'none'}); another sampler is chosen with sampler=<name>"
            )
        out[key] = value
    if cfg.sampler.get("grid") is not None:  # a new grid: the old grid's options go
        for key in set(schema.GRID_FIELDS) - set(schema.GRID_OPTIONS.get(out.grid, ())):
            if cfg.sampler.get(key) is None:
                out[key] = None
    return out


def load_run(run_dir: str | Path, sampler_cfg: DictConfig | None = None, step: int | None = None):
    """The :class:`experiments.build.Run` of a training run directory and its state at
    checkpoint ``step`` (default: the latest).

    Args:
      run_dir: a directory written by ``experiments.train``.
      sampler_cfg: a sampler config to build ``run.sampling`` with; default the run's own.
      step: a checkpoint step.

    Returns:
      ``(run, state)``: ``run.source(state.ema_params)`` is the trained score source,
      ``run.process`` its process, ``run.cfg`` the run's config; ``state`` the
      :class:`scorelib.training.TrainState` (``params``, ``ema_params``, ``step``).

    Raises:
      FileNotFoundError: no ``config.yaml`` or no checkpoint (at ``step``) in ``run_dir``.
      ValueError: the checkpoint does not match the run's model config.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: not found; run_dir must be a training run directory")
    cfg = OmegaConf.load(cfg_path)
    cfg.sampler = sampler_cfg if sampler_cfg is not None else run_sampler(cfg)
    steps = saved_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint to sample from")
    if step is not None and step not in steps:
        raise FileNotFoundError(f"step={step}: no such checkpoint in {run_dir}; have {steps}")
    run = setup(cfg)
    ckpt = checkpointer(run, run_dir)
    try:
        abstract = training.abstract_state(run.state)
        state = ckpt.restore_latest(abstract) if step is None else ckpt.restore(step, abstract)
    finally:
        ckpt.close()
    return run, state


def resolve_sampler(cfg: DictConfig) -> DictConfig:
    """The sampler of this ``sample``/``evaluate`` command (see :func:`sampler_config`)."""
    run_cfg_path = Path(cfg.run_dir) / "config.yaml"
    if not run_cfg_path.is_file():
        raise FileNotFoundError(
            f"{run_cfg_path}: not found; run_dir must be a training run directory"
        )
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return sampler_config(cfg, OmegaConf.load(run_cfg_path), overrides)


# --------------------------------------------------------------------------- the app


@clean_errors
def run_sampling(cfg: DictConfig) -> Path:
    jax.config.update("jax_default_matmul_precision", "highest")
    if cfg.get("score") is not None:  # training-free (experiment=cfdm_*): no run, no checkpoint
        from experiments.closed_form import run_training_free

        return run_training_free(cfg)
    from experiments import distill  # a distillation run: one-step samples of its student

    if distill.is_distill_run(cfg.run_dir):
        return distill.sample_command(cfg)
    run, state = load_run(cfg.run_dir, resolve_sampler(cfg), cfg.step)
    params = state.ema_params if cfg.use_ema else state.params
    out = sample_and_save(run, params, Path(cfg.run_dir), step=int(state.step), use_ema=cfg.use_ema)
    print(f"samples: {out}")
    return out


main = hydra_app("sample")(run_sampling)


if __name__ == "__main__":
    main()
