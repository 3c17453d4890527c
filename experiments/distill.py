"""One-step f-distillation: ``python -m experiments.distill [experiment=<preset>] [overrides]``.

The teacher is an ``experiments.train`` run (``teacher.run_dir=``) or the exact score of a
target (``data=target``); see ``configs/distill.yaml``. The run directory,
``outputs/<preset>/<overrides>``, is a pure function of the command: the same command
resumes the run bit for bit (``scorelib.training.train`` with the whole
:class:`scorelib.distill.DistillState` checkpointed), a larger ``trainer.steps`` continues
it. Every check (the config fields, the teacher's checkpoint against its model, an
existing run's config and checkpoint against this command's) runs before anything is
compiled or written. ``metrics.jsonl`` logs the losses, the ratios ``r_mean``/``r_min``/
``r_max``, the largest weight ``h_max`` and the per-bin ratio means ``ratio_bin<k>``; a
non-finite loss stops the run with its step number. At the end one-step samples of the
student's EMA are written under ``samples/step<k>/onestep_1_n<num>_seed<seed>/``;
``python -m experiments.sample run_dir=<run>`` and ``python -m experiments.evaluate
run_dir=<run>`` work on the run as on a training run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments import build, schema
from experiments.cluster_run import start_devices, train_loop
from experiments.common import clean_errors, hydra_app, write_run_info
from experiments.outputs import save_samples, saved_steps
from scorelib import distill, training
from scorelib._checks import check_int, require
from scorelib.keys import example_keys
from scorelib.nets import MLP

schema.register_configs()

#: ``distill.*`` fields that configure networks, not ``scorelib.distill.DistillConfig``.
NETWORK_FIELDS = ("disc_width", "backbone_width", "backbone_depth")
BACKBONE_FIELDS = ("backbone_width", "backbone_depth")
SAMPLER_FIELDS = ("num_samples", "batch_size", "seed")


@dataclasses.dataclass
class DistillRun:
    """Everything a distillation is made of, built and validated from its config."""

    cfg: DictConfig
    teacher: Any  # a scorelib ScoreSource
    process: Any
    data: build.Data
    sigma_data: float
    nets: distill.Networks
    dcfg: distill.DistillConfig
    state: distill.DistillState
    step_fn: Any
    fingerprint: dict

    def sample(self, params, num_samples: int, seed: int, batch_size: int) -> np.ndarray:
        """``[num_samples, *data_shape]`` one-step samples of the generator ``params``;
        example ``b`` draws its noise from ``fold_in(key(seed), b)``."""
        return draw_student(
            self.nets,
            params,
            self.dcfg.sigma_g,
            self.data.data_shape,
            num_samples=num_samples,
            seed=seed,
            batch_size=batch_size,
        )


def draw_student(nets, params, sigma_g, data_shape, *, num_samples, seed, batch_size):
    """One-step samples ``G(z)`` in batches (per-example keys: independent of batch size)."""
    key = jax.random.key(seed)

    @jax.jit
    def draw(p, first):
        keys = example_keys(key, batch_size, first)
        z = jax.vmap(lambda k: jax.random.normal(k, tuple(data_shape)))(keys)
        return distill.generate(nets.model, p, z, sigma_g, nets.sigma_data)

    out = [np.asarray(draw(params, i)) for i in range(0, num_samples, batch_size)]
    return np.concatenate(out)[:num_samples]


# --------------------------------------------------------------------------- building


def _fields(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def distill_config(cfg: DictConfig, process) -> distill.DistillConfig:
    """The :class:`scorelib.distill.DistillConfig` of ``cfg.distill``; null noise levels are
    the process's (``ve_sigma`` at ``t_min`` and ``t_max``).

    Raises:
      ValueError: an unknown ``distill.<field>``, or a value out of range (naming it).
    """
    given = _fields(cfg.distill)
    known = {f.name for f in dataclasses.fields(distill.DistillConfig)} | set(NETWORK_FIELDS)
    for key in given:
        require(key in known, f"distill.{key}", f"one of {sorted(known)}", key)
    kw = {k: v for k, v in given.items() if k not in NETWORK_FIELDS and v is not None}
    kw.setdefault("sigma_min", float(process.ve_sigma(process.t_min)))
    kw.setdefault("sigma_max", float(process.ve_sigma(process.t_max)))
    kw.setdefault("sigma_g", kw["sigma_max"])
    return distill.DistillConfig(**kw)


def _check_sections(cfg: DictConfig) -> None:
    for key in _fields(cfg.sampler):
        require(
            key in SAMPLER_FIELDS,
            f"sampler.{key}",
            f"one of {list(SAMPLER_FIELDS)} (a distilled student samples in one step)",
            key,
        )
    check_int(cfg.sampler.num_samples, "sampler.num_samples", low=1)
    check_int(cfg.sampler.batch_size, "sampler.batch_size", low=1)
    check_int(cfg.sampler.seed, "sampler.seed", low=0)
    for key in _fields(cfg.teacher):
        require(key in ("run_dir", "step"), f"teacher.{key}", "run_dir or step", key)
    for key in _fields(cfg.optim):
        require(
            key in ("lr", "weight_decay", "b1", "b2"),
            f"optim.{key}",
            "one of lr, weight_decay, b1, b2",
            key,
        )
    build.check_trainer(cfg.trainer)


def _teacher_from_run(cfg: DictConfig):
    """``(teacher, process, data, sigma_data, graphdef, params, model_cfg)`` of a train run."""
    from experiments.sample import load_run

    for group in ("data", "process", "model"):
        if cfg.get(group) is not None:
            raise ValueError(
                f"{group}: the teacher run's {group} is used with teacher.run_dir; remove "
                f"{group}= (got {group}={OmegaConf.select(cfg, group + '.name') or 'set'})"
            )
    for key in BACKBONE_FIELDS:
        if cfg.distill.get(key) is not None:
            raise ValueError(
                f"distill.{key}: the discriminator reads the teacher network's features with "
                f"teacher.run_dir, it has no backbone; set distill.{key}=null"
            )
    run_dir = Path(cfg.teacher.run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(
            f"teacher.run_dir={run_dir}: no config.yaml; it must be an experiments.train run"
        )
    step = cfg.teacher.step
    if step is not None:
        check_int(step, "teacher.step", low=0)
    run, tstate = load_run(run_dir, step=step)
    teacher = run.source(tstate.ema_params)
    return (
        teacher,
        run.process,
        run.data,
        float(run.cfg.data.sigma_data),
        run.graphdef,
        tstate.ema_params,
        _fields(run.cfg.model),
    )


def setup_distill(cfg: DictConfig) -> DistillRun:
    """Build every object of the distillation; every config error surfaces here.

    Raises:
      ValueError, FileNotFoundError: naming the config field.
    """
    _check_sections(cfg)
    tc = cfg.trainer
    seed = tc.seed
    if cfg.teacher.get("step") is not None and not cfg.teacher.get("run_dir"):
        raise ValueError("teacher.step needs teacher.run_dir; got teacher.run_dir=null")
    if cfg.teacher.get("run_dir"):
        teacher, process, data, sigma_data, graphdef, t_params, model_cfg = _teacher_from_run(cfg)
        student = fake = t_params
        teacher_net = (graphdef, t_params)
        x = jax.ShapeDtypeStruct((1, *data.data_shape), np.float32)
        c = jax.ShapeDtypeStruct((1,), np.float32)
        feats = jax.eval_shape(
            lambda p, x, c: distill.network_features(graphdef, p, x, c), t_params, x, c
        )
        disc = distill.Discriminator(
            [f.shape[1:] for f in feats], cfg.distill.disc_width, rngs=nnx.Rngs(seed + 1)
        )
        identity = {
            "teacher": str(Path(cfg.teacher.run_dir).resolve()),
            "teacher_step": cfg.teacher.get("step"),
        }
    else:
        if cfg.get("data") is None or cfg.data.get("name") != "target":
            raise ValueError(
                "teacher.run_dir=<an experiments.train run> or data=target is required: the "
                "teacher is a trained run or the exact score of a target; got "
                "teacher.run_dir=null and data="
                f"{OmegaConf.select(cfg, 'data.name')}"
            )
        for group in ("process", "model"):
            if cfg.get(group) is None:
                raise ValueError(f"{group} is required with data=target: give {group}=<option>")
        process = build.build_process(cfg)
        data = build.build_data(cfg)
        sigma_data = float(cfg.data.sigma_data)
        teacher = data.target.noisy_score(process)
        model = build.build_model(cfg, data.data_shape, seed)
        graphdef, student = nnx.split(model, nnx.Param)
        fake = nnx.split(build.build_model(cfg, data.data_shape, seed + 1), nnx.Param)[1]
        teacher_net = None
        width = check_int(cfg.distill.backbone_width, "distill.backbone_width", low=1)
        depth = check_int(cfg.distill.backbone_depth, "distill.backbone_depth", low=1)
        backbone = MLP(data.data_shape, width=width, depth=depth, rngs=nnx.Rngs(seed + 2))
        disc = distill.Discriminator(
            [(width,)] * depth, cfg.distill.disc_width, backbone, rngs=nnx.Rngs(seed + 1)
        )
        model_cfg = _fields(cfg.model)
        identity = {"teacher": _fields(cfg.data.target)}
    dcfg = distill_config(cfg, process)
    disc_graphdef, disc_params = nnx.split(disc, nnx.Param)
    oc = cfg.optim
    opts = {k: distill.make_optimizer(oc.lr, oc.weight_decay, oc.b1, oc.b2) for k in distill.PARTS}
    params = {"student": student, "fake": fake, "disc": disc_params}
    state = distill.init_distill_state(params, opts, dcfg, seed)
    nets = distill.Networks(graphdef, disc_graphdef, teacher_net, sigma_data)
    step_fn = distill.make_distill_step(
        teacher,
        nets,
        dcfg,
        opts,
        build.make_ema(tc),
        data.batch_fn(tc.batch_size, seed),
        tc.batch_size,
        data.data_shape,
    )
    fingerprint = {
        "model": model_cfg,
        "data_shape": list(data.data_shape),
        **identity,
        "distill": _fields(cfg.distill),
    }
    return DistillRun(
        cfg, teacher, process, data, sigma_data, nets, dcfg, state, step_fn, fingerprint
    )


def checkpointer(run: DistillRun, run_dir: Path) -> training.Checkpointer:
    tc = run.cfg.trainer
    return training.Checkpointer(
        Path(run_dir) / "checkpoints",
        save_every=tc.ckpt_every,
        keep_last=tc.keep_last,
        keep_every=tc.keep_every,
        config=run.fingerprint,
    )


def is_distill_run(run_dir) -> bool:
    """Whether ``run_dir`` was written by ``experiments.distill`` (its config has ``distill``)."""
    path = Path(run_dir) / "config.yaml"
    return path.is_file() and "distill" in OmegaConf.load(path)


def load_distill_run(run_dir, step: int | None = None):
    """``(run, state)`` of a distillation run directory at checkpoint ``step`` (the latest).

    Raises:
      FileNotFoundError: no checkpoint (at ``step``).
      ValueError: the checkpoint does not match the run's config.
    """
    run_dir = Path(run_dir)
    cfg = OmegaConf.load(run_dir / "config.yaml")
    steps = saved_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint to sample from")
    if step is not None and step not in steps:
        raise FileNotFoundError(f"step={step}: no such checkpoint in {run_dir}; have {steps}")
    run = setup_distill(cfg)
    ckpt = checkpointer(run, run_dir)
    try:
        abstract = training.abstract_state(run.state)
        state = ckpt.restore_latest(abstract) if step is None else ckpt.restore(step, abstract)
    finally:
        ckpt.close()
    return run, state


# --------------------------------------------------------------------------- samples


def samples_dir(run_dir: Path, *, step: int, num_samples: int, seed: int, use_ema=True) -> Path:
    """``run_dir/samples/step<step>/onestep_1_n<num>_seed<seed>[+use_ema-false]``."""
    name = f"onestep_1_n{num_samples}_seed{seed}" + ("" if use_ema else "+use_ema-false")
    return Path(run_dir) / "samples" / f"step{step}" / name


def sample_and_save(
    run: DistillRun,
    params,
    run_dir: Path,
    *,
    step: int,
    num_samples: int,
    seed: int,
    batch_size: int,
    use_ema: bool = True,
) -> Path:
    """Draw and write one-step samples (``samples.npz/json/png``); returns the directory."""
    x = run.sample(params, num_samples, seed, batch_size)
    out = samples_dir(run_dir, step=step, num_samples=num_samples, seed=seed, use_ema=use_ema)
    nonfinite = int(np.sum(~np.isfinite(x.reshape(len(x), -1)).all(1)))
    meta = {
        "sampler": {"name": "onestep", "steps": 1, "num_samples": num_samples, "seed": seed},
        "nfe": 1,
        "use_ema": use_ema,
        "checkpoint_step": step,
        "num_nonfinite": nonfinite,
        "title": f"{run.cfg.name}: {distill.describe(run.dcfg.divergence)} student, NFE 1, "
        f"step {step}",
    }
    ref = run.data.reference(2000) if run.data.images is None else None
    save_samples(out, x, meta, reference=ref)
    return out


def _overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def sample_command(cfg: DictConfig) -> Path:
    """``experiments.sample run_dir=<distill run>``: one-step samples of the student.

    Only ``sampler.num_samples``, ``sampler.batch_size`` and ``sampler.seed`` apply (the
    run's own unless given), with ``step`` and ``use_ema``.

    Raises:
      ValueError: another ``sampler`` option or a ``sampler=<name>`` given.
    """
    bad = [
        o
        for o in _overrides()
        if o.split("=", 1)[0].lstrip("+~").startswith("sampler")
        and o.split("=", 1)[0].lstrip("+~").split(".", 1)[-1] not in SAMPLER_FIELDS
    ]
    if bad:
        raise ValueError(
            f"{bad[0].split('=', 1)[0]}: a distilled student samples in one step; only "
            f"sampler.num_samples, sampler.batch_size and sampler.seed apply; got {bad[0]}"
        )
    run, state = load_distill_run(cfg.run_dir, cfg.step)
    opts = {
        k: cfg.sampler.get(k) if cfg.sampler.get(k) is not None else run.cfg.sampler[k]
        for k in SAMPLER_FIELDS
    }
    params = state.ema_params if cfg.use_ema else state.params["student"]
    out = sample_and_save(
        run, params, Path(cfg.run_dir), step=int(state.step), use_ema=cfg.use_ema, **opts
    )
    print(f"samples: {out}")
    return out


def evaluate_inputs(cfg: DictConfig) -> tuple[DictConfig, Path]:
    """For ``experiments.evaluate run_dir=<distill run>``: ``(config with the data and
    process the samples are compared against, samples.npz path)``.

    Raises:
      FileNotFoundError: the samples are not there (naming the command that draws them).
    """
    run_dir = Path(cfg.run_dir)
    run_cfg = OmegaConf.load(run_dir / "config.yaml")
    if run_cfg.teacher.get("run_dir"):
        teacher_cfg = OmegaConf.load(Path(run_cfg.teacher.run_dir) / "config.yaml")
        data_cfg = OmegaConf.create(
            {"name": run_cfg.name, "data": teacher_cfg.data, "process": teacher_cfg.process}
        )
    else:
        data_cfg = OmegaConf.create(
            {"name": run_cfg.name, "data": run_cfg.data, "process": run_cfg.process}
        )
    if cfg.samples:
        return data_cfg, Path(cfg.samples)
    steps = saved_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint, so no samples")
    step = steps[-1] if cfg.step is None else cfg.step
    opts = {
        k: cfg.sampler.get(k) if cfg.sampler.get(k) is not None else run_cfg.sampler[k]
        for k in ("num_samples", "seed")
    }
    path = samples_dir(run_dir, step=step, use_ema=cfg.use_ema, **opts) / "samples.npz"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no samples there; draw them with python -m experiments.sample "
            f"run_dir={run_dir}"
        )
    return data_cfg, path


# --------------------------------------------------------------------------- the app


def distill_in(
    run_dir: Path, cfg: DictConfig, *, progress=True, handle_signals=True, tensorboard=True
):
    """Distil (or resume, or find complete) the run of ``cfg`` in ``run_dir``.

    Returns:
      ``(run, state)``.

    Raises:
      ValueError, FileNotFoundError: naming the config field, before anything is written;
      FloatingPointError: ``non-finite loss at step N`` (``trainer.nonfinite=stop``);
      scorelib.training.Interrupted: a signal stopped the run after saving a step (after
        a time-limit signal in a Slurm job, the job is requeued first).

    Runs in one process on one device (several processes are refused; with several local
    devices JAX's default one is used): ``cfg.cluster`` is read for the accelerator checks.
    """
    from experiments.train import check_same_run, exclusive

    jax.config.update("jax_default_matmul_precision", "highest")
    start_devices(cfg, data_parallel=False)  # one process, one device (cluster_run)
    run = setup_distill(cfg)
    check_same_run(run_dir, cfg)
    steps = saved_steps(run_dir)
    if steps:
        if steps[-1] > cfg.trainer.steps:
            raise ValueError(
                f"trainer.steps must be >= {steps[-1]}, the step this run has saved "
                f"({run_dir}); got {cfg.trainer.steps}"
            )
        ckpt = checkpointer(run, run_dir)
        try:
            ckpt.check_compatible(steps[-1], training.abstract_state(run.state))
        finally:
            ckpt.close()
        if steps[-1] < cfg.trainer.steps:
            print(f"resuming {run_dir} from step {steps[-1]} of {cfg.trainer.steps}", flush=True)
    with exclusive(run_dir):
        write_run_info(run_dir, OmegaConf.create(_fields(cfg)), seed=cfg.trainer.seed)
        ckpt = checkpointer(run, run_dir)
        try:
            state = train_loop(  # saves and requeues on a time-limit signal (cluster_run)
                run.state,
                run.step_fn,
                num_steps=cfg.trainer.steps,
                ckpt=ckpt,
                log_dir=str(run_dir),
                log_every=cfg.trainer.log_every,
                nonfinite=cfg.trainer.nonfinite,
                desc=cfg.name,
                progress=progress,
                handle_signals=handle_signals,
                tensorboard=tensorboard,
            )
        finally:
            ckpt.close()
    return run, state


@clean_errors
def run_distillation(cfg: DictConfig) -> Path:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run, state = distill_in(run_dir, cfg)
    sc = cfg.sampler
    out = sample_and_save(
        run,
        state.ema_params,
        run_dir,
        step=int(state.step),
        num_samples=sc.num_samples,
        seed=sc.seed,
        batch_size=sc.batch_size,
    )
    print(f"run directory: {run_dir}\nsamples: {out}")
    return run_dir


main = hydra_app("distill")(run_distillation)


if __name__ == "__main__":
    main()
