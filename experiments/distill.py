"""One-step f-distillation: ``python -m experiments.distill [experiment=<preset>] [overrides]``.

The teacher is an ``experiments.train`` run (``teacher.run_dir=``) or the exact score of a
target (``data=target``); see ``configs/distill.yaml``. The run directory,
``outputs/<preset>/<overrides>``, is a pure function of the command: the same command
resumes the run bit for bit (``scorelib.training.train`` with the whole
:class:`scorelib.distill.DistillState` checkpointed), a larger ``trainer.steps`` continues
it. Every check (the config fields, the teacher's checkpoint against its model, an
existing run's config and checkpoint against this command's) runs before anything is
compiled or written. ``metrics.jsonl`` logs the losses, the ratios ``r_mean``/``r_min``/
``r_max``, the largest weight ``h_max``, the R1 penalty ``loss_r1`` and the per-bin ratio
means ``ratio_bin<k>``; a non-finite loss stops the run with its step number. The run
prints what the discriminator heads read (``discriminator: 4 heads on the teacher
network's features 32x32x256, ...``). At the end one-step samples of the
student's EMA are written under ``samples/step<k>/onestep_1_n<num>_seed<seed>/``;
``python -m experiments.sample run_dir=<run>`` and ``python -m experiments.evaluate
run_dir=<run>`` work on the run as on a training run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from experiments import build, schema
from experiments.cluster_run import start_devices, train_loop
from experiments.common import clean_errors, hydra_app, unknown_key_line, write_run_info
from experiments.outputs import save_samples, saved_steps
from scorelib import distill, parallel, training
from scorelib._checks import check_int, require
from scorelib.keys import example_keys
from scorelib.nets import MLP
from scorelib.scores import EmpiricalScore, fit_gaussian

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
    disc_inputs: str = ""  # what the discriminator heads read (printed at the start)

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
        if key not in known:
            raise ValueError(unknown_key_line(f"distill.{key}", sorted(known), "distill"))
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
    for key in _fields(cfg.optim):
        require(
            key in ("lr", "weight_decay", "b1", "b2"),
            f"optim.{key}",
            "one of lr, weight_decay, b1, b2",
            key,
        )
    build.check_trainer(cfg.trainer)


#: ``teacher.kind`` -> the ``teacher.*`` fields it uses (besides ``kind``).
TEACHER_KINDS = {
    "run": ("run_dir", "step", "data_shape"),
    "target": ("data_shape",),
    "gaussian": ("data_shape",),
    "training_set": ("data_shape",),
}
TEACHER_FIELDS = ("kind", "run_dir", "step", "data_shape")


@dataclasses.dataclass
class Teacher:
    """A teacher score source and the networks a distillation of it starts from."""

    source: Any  # a scorelib ScoreSource
    process: Any
    data: build.Data
    sigma_data: float
    graphdef: Any  # of the student and the fake score
    student: Any  # initial parameters of the student ...
    fake: Any  # ... and of the fake score
    disc: distill.Discriminator
    teacher_net: tuple | None  # (graphdef, params) whose features feed the discriminator
    model_cfg: dict
    identity: dict  # what names the teacher in the checkpoint's fingerprint
    disc_inputs: str  # e.g. "4 heads on the teacher network's features 32x32x256, ..."


def _check_teacher_fields(cfg: DictConfig) -> str:
    """``teacher.kind``, after refusing the ``teacher.*`` fields it does not use."""
    tc = cfg.teacher
    for key in _fields(tc):
        require(key in TEACHER_FIELDS, f"teacher.{key}", f"one of {list(TEACHER_FIELDS)}", key)
    kind = tc.get("kind")
    require(kind in TEACHER_KINDS, "teacher.kind", f"one of {list(TEACHER_KINDS)}", kind)
    for key in TEACHER_FIELDS[1:]:
        if tc.get(key) is not None and key not in TEACHER_KINDS[kind]:
            raise ValueError(
                f"teacher.{key} is not used by teacher.kind={kind} (it uses "
                f"{', '.join('teacher.' + k for k in TEACHER_KINDS[kind]) or 'none'}); got "
                f"teacher.{key}={tc.get(key)}"
            )
    if kind == "run" and not tc.get("run_dir"):
        raise ValueError(
            "teacher.run_dir must be an experiments.train run with teacher.kind=run; got null "
            "(or choose teacher.kind=target, gaussian or training_set with data=...)"
        )
    if tc.get("step") is not None:
        check_int(tc.step, "teacher.step", low=0)
    if tc.get("data_shape") is not None:
        shape = list(tc.data_shape)
        require(
            len(shape) >= 1 and all(isinstance(n, int) and n >= 1 for n in shape),
            "teacher.data_shape",
            "null or a list of positive integers",
            shape,
        )
    return kind


def check_teacher_run(run_cfg: DictConfig, data_shape, expected, field: str) -> None:
    """Refuse a teacher run whose data shape or model does not fit the distillation.

    Args:
      run_cfg: the teacher run's ``config.yaml``.
      data_shape: the shape of one example of the run's data.
      expected: ``teacher.data_shape`` (``None``: any shape).
      field: the field that named the run (``teacher.run_dir``, ``table.teacher``).

    Raises:
      ValueError: ``<field>=<run>: ...`` naming ``teacher.data_shape`` or the run's model.
    """
    data_name = OmegaConf.select(run_cfg, "data.name")
    if expected is not None and list(data_shape) != list(expected):
        raise ValueError(
            f"{field}: a run of data={data_name} with examples of shape {list(data_shape)}; "
            f"teacher.data_shape={list(expected)} expects examples of shape {list(expected)}"
        )
    target = OmegaConf.select(run_cfg, "model._target_") or ""
    try:
        cls = get_object(target)
    except Exception:  # noqa: BLE001 - Hydra raises ImportError or its own
        cls = None
    if not callable(getattr(cls, "features", None)):
        raise ValueError(
            f"{field}: its model ({target or 'none'}) has no features(x, c_noise) for the "
            "discriminator heads; the teacher network must be a scorelib.nets MLP, LocalMLP "
            "or UNet"
        )


def _refuse_groups(cfg: DictConfig, kind: str) -> None:
    for group in ("data", "process", "model"):
        if cfg.get(group) is not None:
            raise ValueError(
                f"{group}: the teacher run's {group} is used with teacher.kind={kind}; remove "
                f"{group}= (got {group}={OmegaConf.select(cfg, group + '.name') or 'set'})"
            )
    for key in BACKBONE_FIELDS:
        if cfg.distill.get(key) is not None:
            raise ValueError(
                f"distill.{key}: the discriminator reads the teacher network's features with "
                f"teacher.kind={kind}, it has no backbone; set distill.{key}=null"
            )


def _teacher_from_run(cfg: DictConfig) -> Teacher:
    """The EMA network of an ``experiments.train`` run; student and fake start from it."""
    from experiments.sample import load_run

    _refuse_groups(cfg, "run")
    run_dir = Path(cfg.teacher.run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(
            f"teacher.run_dir={run_dir}: no config.yaml; it must be an experiments.train run"
        )
    run_cfg = OmegaConf.load(run_dir / "config.yaml")
    if "distill" in run_cfg:
        raise ValueError(
            f"teacher.run_dir={run_dir}: an experiments.distill run; the teacher must be an "
            "experiments.train run"
        )
    expected = cfg.teacher.get("data_shape")
    check_teacher_run(
        run_cfg, build.build_data(run_cfg).data_shape, expected, f"teacher.run_dir={run_dir}"
    )
    run, tstate = load_run(run_dir, step=cfg.teacher.get("step"))
    params = tstate.ema_params
    graphdef, data = run.graphdef, run.data
    x = jax.ShapeDtypeStruct((1, *data.data_shape), np.float32)
    c = jax.ShapeDtypeStruct((1,), np.float32)
    feats = jax.eval_shape(
        lambda p, x, c: distill.network_features(graphdef, p, x, c), params, x, c
    )
    shapes = [f.shape[1:] for f in feats]
    disc = distill.Discriminator(
        shapes, cfg.distill.disc_width, rngs=nnx.Rngs(cfg.trainer.seed + 1)
    )
    return Teacher(
        source=run.source(params),
        process=run.process,
        data=data,
        sigma_data=float(run.cfg.data.sigma_data),
        graphdef=graphdef,
        student=params,
        fake=params,
        disc=disc,
        teacher_net=(graphdef, params),
        model_cfg=_fields(run.cfg.model),
        identity={
            "teacher": str(run_dir.resolve()),
            "teacher_step": cfg.teacher.get("step"),
        },
        disc_inputs=_heads_on("the teacher network's", shapes),
    )


def _heads_on(whose: str, shapes) -> str:
    """``'3 heads on the teacher network's features 32x32x8, 16x16x16, 8x8x16'``."""
    heads = f"{len(shapes)} head{'s' if len(shapes) > 1 else ''}"
    return f"{heads} on {whose} features " + ", ".join("x".join(map(str, s)) for s in shapes)


def _teacher_without_network(cfg: DictConfig, kind: str) -> Teacher:
    """An analytic or exact teacher (``kind`` target, gaussian or training_set): fresh
    ``model`` networks for the student and the fake score, a discriminator with its own
    MLP backbone (``distill.backbone_*``)."""
    seed = cfg.trainer.seed
    for group in ("data", "process", "model"):
        if cfg.get(group) is None:
            raise ValueError(f"{group} is required with teacher.kind={kind}: give {group}=<option>")
    is_target = cfg.data.get("name") == "target"
    if kind == "target" and not is_target:
        raise ValueError(
            "data must be target with teacher.kind=target (the exact score of a target "
            f"distribution); got data={cfg.data.get('name')}"
        )
    process = build.build_process(cfg)
    data = build.build_data(cfg)
    if kind == "target":
        source = data.target.noisy_score(process)
        identity = {"teacher": _fields(cfg.data.target)}
    else:
        if data.images is None:
            raise ValueError(
                f"data must be a data set with a training split (digits, mnist, npz) with "
                f"teacher.kind={kind}: it is fitted to the training images; got "
                f"data={cfg.data.get('name')}"
            )
        train = data.images.train
        if kind == "gaussian":
            source = fit_gaussian(process, train)
        else:
            source = EmpiricalScore.create(process, train)
        identity = {"teacher": kind, "data": _fields(cfg.data)}
    expected = cfg.teacher.get("data_shape")
    if expected is not None and list(data.data_shape) != list(expected):
        raise ValueError(
            f"data: examples of shape {list(data.data_shape)}; teacher.data_shape="
            f"{list(expected)} expects examples of shape {list(expected)}"
        )
    graphdef, student = nnx.split(build.build_model(cfg, data.data_shape, seed), nnx.Param)
    fake = nnx.split(build.build_model(cfg, data.data_shape, seed + 1), nnx.Param)[1]
    width = check_int(cfg.distill.backbone_width, "distill.backbone_width", low=1)
    depth = check_int(cfg.distill.backbone_depth, "distill.backbone_depth", low=1)
    backbone = MLP(data.data_shape, width=width, depth=depth, rngs=nnx.Rngs(seed + 2))
    disc = distill.Discriminator(
        [(width,)] * depth, cfg.distill.disc_width, backbone, rngs=nnx.Rngs(seed + 1)
    )
    return Teacher(
        source=source,
        process=process,
        data=data,
        sigma_data=float(cfg.data.sigma_data),
        graphdef=graphdef,
        student=student,
        fake=fake,
        disc=disc,
        teacher_net=None,
        model_cfg=_fields(cfg.model),
        identity=identity,
        disc_inputs=_heads_on("its MLP backbone's", [(width,)] * depth),
    )


def build_teacher(cfg: DictConfig) -> Teacher:
    """The :class:`Teacher` of ``cfg.teacher`` (``teacher.kind``: run, target, gaussian,
    training_set; see ``configs/distill.yaml``).

    Raises:
      ValueError, FileNotFoundError: naming the config field, before any compute.
    """
    kind = _check_teacher_fields(cfg)
    if kind == "run":
        return _teacher_from_run(cfg)
    return _teacher_without_network(cfg, kind)


def setup_distill(cfg: DictConfig, mesh=None) -> DistillRun:
    """Build every object of the distillation; every config error surfaces here.

    With a ``mesh`` (``scorelib.parallel.make_mesh``) the step is data-parallel: the state,
    the teacher and the training images are replicated on every device, and each step's
    per-example draws and real batch are split along the mesh's ``data`` axis
    (``scorelib.distill.make_distill_step``'s ``batch_sharding``).

    Raises:
      ValueError, FileNotFoundError: naming the config field (``trainer.batch_size`` not
        a multiple of the number of devices, too).
    """
    _check_sections(cfg)
    tc = cfg.trainer
    seed = tc.seed
    if mesh is not None:
        parallel.check_batch_size(tc.batch_size, mesh)
    t = build_teacher(cfg)
    dcfg = distill_config(cfg, t.process)
    disc_graphdef, disc_params = nnx.split(t.disc, nnx.Param)
    oc = cfg.optim
    opts = {k: distill.make_optimizer(oc.lr, oc.weight_decay, oc.b1, oc.b2) for k in distill.PARTS}
    params = {"student": t.student, "fake": t.fake, "disc": disc_params}
    state = distill.init_distill_state(params, opts, dcfg, seed)
    source, teacher_net = t.source, t.teacher_net
    if mesh is not None:
        state, source = parallel.shard(state, mesh), parallel.shard(source, mesh)
        if teacher_net is not None:
            teacher_net = (teacher_net[0], parallel.shard(teacher_net[1], mesh))
    nets = distill.Networks(t.graphdef, disc_graphdef, teacher_net, t.sigma_data)
    step_fn = distill.make_distill_step(
        source,
        nets,
        dcfg,
        opts,
        build.make_ema(tc),
        t.data.batch_fn(tc.batch_size, seed, mesh),
        tc.batch_size,
        t.data.data_shape,
        batch_sharding=None if mesh is None else parallel.batch_sharding(mesh),
    )
    fingerprint = {
        "model": t.model_cfg,
        "data_shape": list(t.data.data_shape),
        **t.identity,
        "distill": _fields(cfg.distill),
    }
    return DistillRun(
        cfg,
        source,
        t.process,
        t.data,
        t.sigma_data,
        nets,
        dcfg,
        state,
        step_fn,
        fingerprint,
        t.disc_inputs,
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

    Data-parallel over every device of every process, as ``experiments.train``: the
    processes (``srun`` tasks, or explicit ``cluster.*`` settings) all run this; process 0
    alone writes ``run_info.json``, the logs and holds the lock, and all of them save the
    checkpoints together. The global batch gives the one-device run's losses up to the
    order of the floating-point reductions.
    """
    from experiments.train import check_same_run, exclusive

    jax.config.update("jax_default_matmul_precision", "highest")
    mesh = start_devices(cfg)
    run = setup_distill(cfg, mesh)
    lead = jax.process_index() == 0
    if lead:
        print(f"discriminator: {run.disc_inputs}", flush=True)
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
        if lead and steps[-1] < cfg.trainer.steps:
            print(f"resuming {run_dir} from step {steps[-1]} of {cfg.trainer.steps}", flush=True)
    with exclusive(run_dir) if lead else contextlib.nullcontext():
        if lead:
            write_run_info(run_dir, OmegaConf.create(_fields(cfg)), seed=cfg.trainer.seed)
        ckpt = checkpointer(run, run_dir)
        try:
            state = train_loop(  # saves and requeues on a time-limit signal (cluster_run)
                run.state,
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
def run_distillation(cfg: DictConfig) -> Path:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run, state = distill_in(run_dir, cfg)
    if jax.process_index() != 0:  # samples are drawn by process 0 alone
        return run_dir
    sc = cfg.sampler
    ema = state.ema_params if jax.device_count() == 1 else parallel.to_host(state.ema_params)
    out = sample_and_save(
        run,
        ema,
        run_dir,
        step=int(parallel.to_host(state.step)),
        num_samples=sc.num_samples,
        seed=sc.seed,
        batch_size=sc.batch_size,
    )
    print(f"run directory: {run_dir}\nsamples: {out}")
    return run_dir


main = hydra_app("distill")(run_distillation)


if __name__ == "__main__":
    main()
