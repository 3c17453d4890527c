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
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import sys
from pathlib import Path

import jax
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments.build import Run, checkpointer, model_fingerprint, setup
from experiments.cluster_run import start_devices, train_loop
from experiments.common import clean_errors, hydra_app, write_run_info
from experiments.outputs import saved_steps
from experiments.sample import sample_and_save
from experiments.schema import GRID_FIELDS, TRAINER_NOT_IDENTITY, register_configs
from scorelib import parallel, training

register_configs()

# Run, setup, checkpointer live in experiments.build; importable from here as before.
__all__ = ["Run", "setup", "checkpointer", "main", "run_training"]


# --------------------------------------------------------------------------- run identity


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def identity(cfg: DictConfig) -> dict:
    """``{field: value}`` of everything that defines the trained model: the resolved config
    without the sampler, the cluster, the preset's name and the trainer fields that do not
    change the model (``schema.TRAINER_NOT_IDENTITY``)."""
    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    tree = {k: v for k, v in tree.items() if k not in ("sampler", "name", "cluster")}
    tree["trainer"] = {
        k: v for k, v in tree.get("trainer", {}).items() if k not in TRAINER_NOT_IDENTITY
    }
    return _flatten(tree)


_ABSENT = "<absent>"


def schema_default(cfg: DictConfig, key: str):
    """The structured-config default of the dotted field ``key`` of ``cfg`` (its schema
    dataclass's field default), or ``_ABSENT`` when there is none."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if not dataclasses.is_dataclass(kind):
        return _ABSENT
    field = next((f for f in dataclasses.fields(kind) if f.name == name), None)
    if field is None:
        return _ABSENT
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return OmegaConf.to_container(OmegaConf.create({"v": field.default_factory()}))["v"]
    return _ABSENT


def identity_diffs(old: dict, new: dict, cfg: DictConfig) -> list[str]:
    """The fields where two identities differ. A field absent from ``old`` (a run written
    before the field existed) counts as equal when ``new`` holds its schema default: a new
    option's default keeps the behaviour the library had before it."""
    diffs = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, _ABSENT), new.get(k, _ABSENT)
        if a == b or (a == _ABSENT and b == schema_default(cfg, k)):
            continue
        diffs.append(f"{k}: run {a!r}, this command {b!r}")
    return diffs


def check_same_run(run_dir: Path, cfg: DictConfig) -> None:
    """Refuse to train into ``run_dir`` when its ``config.yaml`` defines another model
    (:func:`identity_diffs`: fields added to the schema since the run was written do not
    count while they hold their defaults).

    Raises:
      ValueError: naming up to three differing fields.
    """
    path = run_dir / "config.yaml"
    if not path.is_file():
        return
    old, new = identity(OmegaConf.to_container(OmegaConf.load(path))), identity(cfg)
    diffs = identity_diffs(old, new, cfg)
    if diffs:
        more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
        raise ValueError(
            f"config {'; '.join(diffs[:3])}{more}: {run_dir} holds a run of another config "
            "(choose another hydra.run.dir, or the run's own overrides)"
        )


def check_resume(run: Run, run_dir: Path) -> None:
    """Before anything is written: the saved step is not past ``trainer.steps`` and the
    newest checkpoint fits the model.

    Raises:
      ValueError: naming ``trainer.steps``, or the config/state fields that differ.
    """
    steps = saved_steps(run_dir)
    if not steps:
        return
    want = run.cfg.trainer.steps
    if steps[-1] > want:
        raise ValueError(
            f"trainer.steps must be >= {steps[-1]}, the step this run has saved "
            f"({run_dir}); got {want} (to sample an earlier checkpoint: python -m "
            f"experiments.sample run_dir={run_dir} step=<one of {steps}>)"
        )
    ckpt = checkpointer(run, run_dir)
    try:
        ckpt.check_compatible(steps[-1], training.abstract_state(run.state))
    finally:
        ckpt.close()


def used_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` resolved, without the grid options that are not set (they are not used)."""
    tree = OmegaConf.to_container(cfg, resolve=True)
    tree["sampler"] = {
        k: v for k, v in tree["sampler"].items() if not (k in GRID_FIELDS and v is None)
    }
    return OmegaConf.create(tree)


def parse_init_from(value: str) -> tuple[Path, int | None]:
    """``'<run_dir>'`` or ``'<run_dir>@<step>'`` -> ``(run_dir, step or None)``."""
    head, sep, tail = str(value).rpartition("@")
    if sep and tail.isdigit():
        return Path(head), int(tail)
    return Path(value), None


def initial_state(run: Run, init_from: str | None) -> training.TrainState:
    """The fresh state, with params and EMA params from ``init_from``'s checkpoint
    (its EMA parameters for both) when given; the optimizer state and step stay new.

    Raises:
      FileNotFoundError: no such run or checkpoint.
      ValueError: the other run's model config differs (naming the fields).
    """
    if not init_from:
        return run.state
    src, step = parse_init_from(init_from)
    steps = saved_steps(src)
    if not steps:
        raise FileNotFoundError(f"init_from={init_from}: no checkpoint in {src / 'checkpoints'}")
    if step is not None and step not in steps:
        raise FileNotFoundError(
            f"init_from={init_from}: no checkpoint at step {step}; have {steps}"
        )
    step = steps[-1] if step is None else step
    fingerprint = model_fingerprint(run.cfg, run.data.data_shape)
    got = training.restore_params(
        src / "checkpoints", run.state, step=step, expected_fingerprint=fingerprint
    )
    ema = got.ema_params
    copy = lambda tree: jax.tree.map(lambda x: x.copy(), tree)  # noqa: E731
    return run.state.replace(params=copy(ema), ema_params=copy(ema))


@contextlib.contextmanager
def exclusive(run_dir: Path):
    """Hold an exclusive lock on ``run_dir`` (``.lock``): a second command on the same run
    (a sweep over samplers, say) waits until the first is done, then resumes from its
    checkpoint."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another command training {run_dir}", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


# --------------------------------------------------------------------------- the app


def train_in(
    run_dir: Path,
    cfg: DictConfig,
    *,
    progress: bool = True,
    handle_signals: bool = True,
    tensorboard: bool = True,
    extra: dict | None = None,
):
    """Train (or resume, or find complete) the run of ``cfg`` in ``run_dir``.

    Every check runs before anything is written (same run, resume compatibility,
    ``init_from``); then ``run_info.json`` and ``config.yaml`` are written and
    :func:`scorelib.training.train` runs under an exclusive lock on ``run_dir``.
    Used by ``experiments.train`` and by tables that train their own models.

    Returns:
      ``(run, state)``: the built run (:class:`experiments.build.Run`) and the final
      train state.

    Raises:
      ValueError, FileNotFoundError: naming the config field, before anything is written;
      scorelib.training.Interrupted: a signal stopped training after saving a step (after
        a time-limit signal in a Slurm job, the job is requeued first).

    Several processes (``srun`` tasks, or explicit ``cluster.*`` settings) all run this;
    process 0 alone writes ``run_info.json``, ``config.yaml``, the logs and holds the lock,
    and all of them save the checkpoints together.
    """
    jax.config.update("jax_default_matmul_precision", "highest")
    mesh = start_devices(cfg)
    run = setup(cfg, mesh)
    check_same_run(run_dir, cfg)
    check_resume(run, run_dir)
    saved = saved_steps(run_dir)
    state = run.state if saved else initial_state(run, cfg.get("init_from"))
    if mesh is not None:
        state = parallel.shard(state, mesh)
    lead = jax.process_index() == 0
    if lead and saved and saved[-1] < cfg.trainer.steps:
        print(f"resuming {run_dir} from step {saved[-1]} of {cfg.trainer.steps}", flush=True)
    with exclusive(run_dir) if lead else contextlib.nullcontext():
        if lead:
            write_run_info(run_dir, used_config(cfg), seed=cfg.trainer.seed, extra=extra)
        ckpt = checkpointer(run, run_dir)
        try:
            state = train_loop(
                state,
                run.step_fn,
                num_steps=cfg.trainer.steps,
                ckpt=ckpt,
                log_dir=str(run_dir) if lead else None,
                log_every=cfg.trainer.log_every,
                nonfinite=cfg.trainer.nonfinite,
                desc=cfg.name,
                progress=progress and lead,
                handle_signals=handle_signals,
                tensorboard=tensorboard,
            )
        finally:
            ckpt.close()
    return run, state


@clean_errors
def run_training(cfg: DictConfig) -> Path:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run, state = train_in(run_dir, cfg)
    if jax.process_index() != 0:  # samples are drawn by process 0 alone
        return run_dir
    ema = state.ema_params if jax.device_count() == 1 else parallel.to_host(state.ema_params)
    out = sample_and_save(run, ema, run_dir, step=int(parallel.to_host(state.step)))
    print(f"run directory: {run_dir}\nsamples: {out}")
    return run_dir


main = hydra_app("train")(run_training)


if __name__ == "__main__":
    main()
