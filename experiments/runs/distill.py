"""Distillation runs (``experiments.distill``): a one-step student trained from a teacher
score source by f-divergence distillation (``scorelib.distill``).

The teacher (``teacher.kind``, ``configs/distill.yaml``) is an ``experiments.train`` run
(its EMA network; the student and the fake score start from it and the discriminator heads
read its features), the exact score of a target (``data=target``), the Gaussian fitted to
a data set's training split, or that split's exact (empirical) score; without a teacher
network the student and the fake score are fresh ``model`` networks and the discriminator
has its own backbone. What this kind adds to the lifecycle (:mod:`experiments.runs.base`):
the teacher and the networks, the :class:`scorelib.distill.DistillState` it checkpoints
whole, one-step sampling (``samples/step<k>/onestep_1_n<num>_seed<seed>``; with a refining
stage ``onestep_nfe2_...``: its two network evaluations), and, for
evaluation, the teacher's data.

Conditioning comes from the teacher: a teacher run trained class-conditionally (its
``model.num_classes = K > 0``, ``data.labels=true``), or an analytic teacher of labelled data
(``data.labels=true`` with ``model.num_classes = K``: a target's components, the per-class
Gaussians or training examples of a data set) makes a class-conditional student
(``scorelib.distill``: each example draws its class, the real batch brings its own). Its
one-step samples are drawn for ``sampler.labels`` (null: ``balanced``; a one-step student has
no trained null label) and saved with their ``labels``; ``distill.teacher_guidance`` guides
the teacher (classifier-free, lerp weight; it needs a null label the teacher run trained,
``objective.label_dropout > 0``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from experiments import build
from experiments.common import unknown_key_line
from experiments.runs.base import TrainedRun, override_keys
from experiments.runs.layout import read_config, samples_name
from experiments.runs.score import ScoreRun, conditioning_name_parts, model_fingerprint_defaults
from scorelib import distill, parallel
from scorelib._checks import check_int, require
from scorelib.nets import MLP
from scorelib.samplers import draw_samples, get_sampler, make_grid
from scorelib.scores import EmpiricalScore, Labels, PerClassScore, fit_gaussian
from scorelib.scores.conditional import ConditionalScore

#: ``distill.*`` fields that configure networks, not ``scorelib.distill.DistillConfig``.
NETWORK_FIELDS = ("disc_width", "backbone_width", "backbone_depth")
BACKBONE_FIELDS = ("backbone_width", "backbone_depth")
#: The ``sampler`` fields of a distillation run: a one-step student has no other
#: (``labels``: a class-conditional student's classes).
SAMPLER_FIELDS = ("num_samples", "batch_size", "seed", "labels")
#: The ``sampler.labels`` of a class-conditional student when none is given.
DEFAULT_LABELS = "balanced"
#: The teacher's few-step rows beside a student's evaluation: DPM-Solver++(2M) at these NFE.
TEACHER_FEW_STEP_NFE = (1, 2, 4)


@dataclasses.dataclass(frozen=True)
class OneStep:
    """One-step sampling of the student: ``num_samples`` samples, drawn ``batch_size`` at a
    time (the samples do not depend on it), example ``b`` from ``fold_in(key(seed), b)``;
    ``labels`` is ``sampler.labels`` as given (``None``: none given; a class-conditional
    student then draws :data:`DEFAULT_LABELS`); ``nfe`` the network evaluations of a sample
    (2 with a refining stage, ``distill.sigma_refine``: still one step)."""

    num_samples: int
    batch_size: int
    seed: int
    labels: Any = None
    nfe: int = 1

    @property
    def head(self) -> str:
        """How the samples' directory name starts: ``onestep_1`` (one step, one network
        evaluation), ``onestep_nfe2`` with a refining stage."""
        return "onestep_1" if self.nfe == 1 else f"onestep_nfe{self.nfe}"

    @property
    def record(self) -> dict:
        out = {"name": "onestep", "steps": 1, "num_samples": self.num_samples, "seed": self.seed}
        if self.nfe != 1:
            out["nfe"] = self.nfe
        if self.labels is not None:
            out["labels"] = self.labels
        return out


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


#: The ``optim`` fields of a distillation (:func:`scorelib.distill.make_optimizer`).
OPTIM_FIELDS = ("lr", "weight_decay", "b1", "b2", "grad_clip")


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
            key in OPTIM_FIELDS,
            f"optim.{key}",
            f"one of {', '.join(OPTIM_FIELDS)}",
            key,
        )
    build.check_trainer(cfg.trainer)


#: ``teacher.kind`` -> the ``teacher.*`` fields it uses (besides ``kind``).
TEACHER_KINDS = {
    "run": ("run_dir", "step", "data_shape", "num_classes"),
    "target": ("data_shape", "num_classes"),
    "gaussian": ("data_shape", "num_classes"),
    "training_set": ("data_shape", "num_classes"),
}
TEACHER_FIELDS = ("kind", "run_dir", "step", "data_shape", "num_classes")


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
    num_classes: int = 0  # K > 0: a class-conditional teacher (and student)
    null_trained: bool = False  # whether the teacher has a trained null label (guidance)


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
    if tc.get("num_classes") is not None:
        check_int(tc.num_classes, "teacher.num_classes", low=0)
    return kind


def check_teacher_classes(num_classes: int, expected, where: str) -> None:
    """Refuse a teacher of other classes than ``teacher.num_classes`` (``None``: any).

    Raises:
      ValueError: ``<where>: ...`` naming ``teacher.num_classes``.
    """
    if expected is None or int(expected) == num_classes:
        return
    what = f"{num_classes} classes" if num_classes else "unconditional (no classes)"
    raise ValueError(
        f"{where}: the teacher is {what}; teacher.num_classes={expected} expects "
        + (
            f"a class-conditional teacher of {expected} classes"
            if expected
            else "an unconditional one"
        )
    )


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
    check_teacher_classes(
        int(OmegaConf.select(run_cfg, "model.num_classes") or 0),
        cfg.teacher.get("num_classes"),
        f"teacher.run_dir={run_dir}",
    )
    run, tstate = ScoreRun.load(run_dir, step=cfg.teacher.get("step"))
    params = tstate.ema_params
    graphdef, data = run.graphdef, run.data
    source = run.source(params)
    k = source.num_classes if isinstance(source, ConditionalScore) else 0
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
        source=source,
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
        num_classes=k,
        null_trained=run.null_trained,
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
    build.check_conditioning(cfg, data)  # model.num_classes: the data's classes, or 0
    k = data.num_classes
    check_teacher_classes(k, cfg.teacher.get("num_classes"), f"data={cfg.data.get('name')}")
    if kind == "target":
        if k:  # the components' exact scores, weighted by the mixture (a PerClassScore)
            source = data.target.noisy_score(process, conditional=True)
        else:
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
        fit = (
            (lambda x: fit_gaussian(process, x))
            if kind == "gaussian"
            else (lambda x: EmpiricalScore.create(process, x))
        )
        labels = data.images.train_labels
        source = PerClassScore.from_labelled(fit, train, labels, k) if k else fit(train)
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
    backbone = MLP(
        data.data_shape, width=width, depth=depth, num_classes=k, rngs=nnx.Rngs(seed + 2)
    )
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
        num_classes=k,
        null_trained=k > 0,  # an exact teacher's null label is its pooled law
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


def student_labels(sampling: OneStep, num_classes: int) -> Labels | None:
    """The :class:`scorelib.scores.Labels` rule of the student's one-step samples:
    ``sampler.labels`` (:func:`experiments.build.build_labels`), :data:`DEFAULT_LABELS` when
    it is null for a class-conditional student (whose null label was never trained: a
    one-step student is only ever conditioned on a class), ``None`` for an unconditional one.

    Raises:
      ValueError: naming ``sampler.labels`` for labels of an unconditional student, or
        classes outside ``[0, num_classes)``.
    """
    value = sampling.labels
    if value is None and num_classes > 0:
        value = DEFAULT_LABELS
    return build.build_labels(value, num_classes, "sampler.labels")


def check_teacher_guidance(dcfg: distill.DistillConfig, teacher: Teacher) -> None:
    """Refuse ``distill.teacher_guidance != 1`` for an unconditional teacher or a teacher run
    whose null label was never trained (``objective.label_dropout = 0``: its unconditional
    score is untrained), before anything is compiled.

    Raises:
      ValueError: naming ``distill.teacher_guidance``.
    """
    w = dcfg.teacher_guidance
    if w == 1:
        return
    if teacher.num_classes == 0:
        raise ValueError(
            f"distill.teacher_guidance must be 1 for an unconditional teacher (classifier-free "
            f"guidance needs a class-conditional teacher: model.num_classes > 0); got {w}"
        )
    if not teacher.null_trained:
        raise ValueError(
            "distill.teacher_guidance must be 1: the teacher run's null label (its "
            "unconditional score) was never trained (objective.label_dropout = 0); got "
            f"{w} (train the teacher with objective.label_dropout > 0)"
        )


# --------------------------------------------------------------------------- the run


@dataclasses.dataclass
class DistillRun(TrainedRun):
    """Everything a distillation is made of, built and validated from its config.

    ``run.sampling`` is its :class:`OneStep`; ``run.teacher`` the teacher score source;
    ``run.nets`` the networks' graph definitions; ``run.dcfg`` the
    :class:`scorelib.distill.DistillConfig`.
    """

    teacher: Any  # a scorelib ScoreSource
    sigma_data: float
    nets: distill.Networks
    dcfg: distill.DistillConfig
    sampling: OneStep
    disc_inputs: str = ""  # what the discriminator heads read (printed at the start)
    labels: Labels | None = None  # a class-conditional student's classes (sampler.labels)

    @classmethod
    def build(cls, cfg: DictConfig, mesh=None) -> DistillRun:
        """Build every object of the distillation; every config error surfaces here.

        With a ``mesh`` (``scorelib.parallel.make_mesh``) the step is data-parallel: the
        state, the teacher and the training images are replicated on every device, and
        each step's per-example draws and real batch are split along the mesh's ``data``
        axis (``scorelib.distill.make_distill_step``'s ``batch_sharding``).

        Raises:
          ValueError, FileNotFoundError: naming the config field (``trainer.batch_size``
            not a multiple of the number of devices; ``sampler.labels`` for an
            unconditional student or outside the classes; ``distill.teacher_guidance`` of
            an unconditional teacher or of a teacher run without a trained null label).
        """
        _check_sections(cfg)
        tc = cfg.trainer
        seed = tc.seed
        if mesh is not None:
            parallel.check_batch_size(tc.batch_size, mesh)
        t = build_teacher(cfg)
        dcfg = distill_config(cfg, t.process)
        check_teacher_guidance(dcfg, t)
        sampling = cls.sampling_of(cfg)
        labels = student_labels(sampling, t.num_classes)
        disc_graphdef, disc_params = nnx.split(t.disc, nnx.Param)
        oc = cfg.optim
        opts = {
            k: distill.make_optimizer(oc.lr, oc.weight_decay, oc.b1, oc.b2, oc.get("grad_clip"))
            for k in distill.PARTS
        }
        params = {"student": t.student, "fake": t.fake, "disc": disc_params}
        state = distill.init_distill_state(params, opts, dcfg, seed)
        source, teacher_net = t.source, t.teacher_net
        if mesh is not None:
            state, source = parallel.shard(state, mesh), parallel.shard(source, mesh)
            if teacher_net is not None:
                teacher_net = (teacher_net[0], parallel.shard(teacher_net[1], mesh))
        nets = distill.Networks(t.graphdef, disc_graphdef, teacher_net, t.sigma_data, t.num_classes)
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
        return cls(
            cfg=cfg,
            data=t.data,
            state=state,
            step_fn=step_fn,
            fingerprint=fingerprint,
            teacher=source,
            process=t.process,
            sigma_data=t.sigma_data,
            nets=nets,
            dcfg=dcfg,
            sampling=sampling,
            disc_inputs=t.disc_inputs,
            labels=labels,
        )

    def announce(self) -> None:
        print(f"discriminator: {self.disc_inputs}", flush=True)

    def sample_params(self, state, use_ema: bool):
        return state.ema_params if use_ema else state.params["student"]

    def sample(self, params, num_samples: int, seed: int, batch_size: int) -> np.ndarray:
        """``[num_samples, *data_shape]`` one-step samples of the generator ``params``
        (:func:`scorelib.distill.one_step_sampler`); example ``b`` draws its noise from
        ``fold_in(key(seed), b)``, so the samples do not depend on ``batch_size``."""
        return self._one_step(params, num_samples, seed, batch_size, progress=False)[0]

    def draw(self, params, *, progress: bool = True):
        """The run's one-step samples and their info; for a class-conditional student
        ``info["labels"]``, the ``[num_samples]`` class of each sample (saved beside them)."""
        s = self.sampling
        x, info = self._one_step(params, s.num_samples, s.seed, s.batch_size, progress=progress)
        if self.labels is not None:
            info["labels"] = np.asarray(self.labels.take(jax.random.key(s.seed), 0, len(x)))
        return x, info

    def _one_step(self, params, num_samples, seed, batch_size, *, progress):
        sample = distill.one_step_sampler(
            self.nets.model,
            self.dcfg.sigma_g,
            self.sigma_data,
            self.dcfg.sigma_refine,
            labels=self.labels,
        )
        return draw_samples(
            sample,
            params,
            jax.random.key(seed),
            self.data.data_shape,
            num_samples=num_samples,
            batch_size=batch_size,
            progress=progress,
            desc="sampling (one step)",
        )

    def fingerprint_defaults(self) -> dict:
        """A checkpoint written before a field existed had its default: no refining stage
        (``distill.sigma_refine``), no teacher guidance (``distill.teacher_guidance``), the
        student EMA's warm-up in global steps (``distill.ema_clock``), an
        unconditional model (``model.num_classes``; the other fields of the model's schema,
        :func:`experiments.runs.score.model_fingerprint_defaults`, for the kinds without a
        teacher run) and unlabelled data (``data.labels``, in the identity of the Gaussian
        and training-set teachers)."""
        return {
            # model.num_classes: 0, ... (the command's model: teachers without a run)
            **(model_fingerprint_defaults(self.cfg) if self.cfg.get("model") else {}),
            "model.num_classes": 0,
            "distill.sigma_refine": None,
            "distill.teacher_guidance": 1.0,
            "distill.ema_clock": "steps",
            "data.labels": False,
        }

    def title(self, run_dir: Path, step: int, info: dict, use_ema: bool) -> str:
        nfe = distill.generator_nfe(self.dcfg.sigma_refine)
        return (
            f"{self.cfg.name}: {distill.describe(self.dcfg.divergence)} student, NFE {nfe}, "
            f"step {step}"
        )

    @classmethod
    def samples_name(cls, sampling: OneStep, use_ema: bool = True) -> str:
        """``onestep_1_n<num>_seed<seed>[+labels-<labels>][+use_ema-false]`` (``labels`` when
        ``sampler.labels`` is given: a list joined by ``_``); ``onestep_nfe2_...`` for a
        student with a refining stage (one step, two network evaluations)."""
        return samples_name(
            sampling.head,
            num_samples=sampling.num_samples,
            seed=sampling.seed,
            extras=conditioning_name_parts(sampling.record),
            use_ema=use_ema,
        )

    @classmethod
    def sampling_of(cls, cfg: DictConfig) -> OneStep:
        sc = cfg.sampler
        labels = sc.get("labels")
        if OmegaConf.is_config(labels):
            labels = OmegaConf.to_container(labels, resolve=True)
        return OneStep(
            num_samples=check_int(sc.num_samples, "sampler.num_samples", low=1),
            batch_size=check_int(sc.batch_size, "sampler.batch_size", low=1),
            seed=check_int(sc.seed, "sampler.seed", low=0),
            labels=labels,
            nfe=distill.generator_nfe((cfg.get("distill") or {}).get("sigma_refine")),
        )

    @classmethod
    def sampler_config(cls, cmd: DictConfig, run_cfg: DictConfig, overrides: list[str]):
        """The run's ``sampler`` (``num_samples``, ``batch_size``, ``seed``) with those the
        command line gives on top.

        Raises:
          ValueError: another ``sampler`` option or a ``sampler=<name>`` given.
        """
        for key in override_keys(overrides):
            if key.startswith("sampler") and key.split(".", 1)[-1] not in SAMPLER_FIELDS:
                guidance = " (the teacher's guidance is distilled: distill.teacher_guidance)"
                raise ValueError(
                    f"{key}: a distilled student samples in one step; only "
                    "sampler.num_samples, sampler.batch_size, sampler.seed and sampler.labels "
                    f"apply{guidance if 'guidance' in key else ''}; got "
                    f"{next(o for o in overrides if key in o)}"
                )
        given = {k: cmd.sampler.get(k) for k in SAMPLER_FIELDS}
        return OmegaConf.create(
            {k: run_cfg.sampler.get(k) if v is None else v for k, v in given.items()}
        )

    @classmethod
    def comparison_rows(cls, run_cfg: DictConfig, *, num_samples: int, seed: int) -> dict:
        """The teacher beside its student, at the student's sample count and seed: the
        teacher run's own sampler (Heun, 35 NFE for the digits preset) and DPM-Solver++(2M)
        at :data:`TEACHER_FEW_STEP_NFE` on the EDM grid down to the teacher sampler's lowest
        level (its ``sigma_min`` on the EDM grid, else 0.002; not tuned on the test split).
        A class-conditional teacher draws each sample for the class the run's own one-step
        samples have (``sampler.labels``, the same key). None without a teacher run (an
        analytic teacher has no sampler to compare).

        Returns:
          ``{label: (nfe, samples [num_samples, *data_shape])}``.
        """
        if not run_cfg.teacher.get("run_dir"):
            return {}
        teacher, state = ScoreRun.load(run_cfg.teacher.run_dir, step=run_cfg.teacher.get("step"))
        source = teacher.source(state.ema_params)
        k = source.num_classes if isinstance(source, ConditionalScore) else 0
        rule = student_labels(cls.sampling_of(run_cfg), k)
        if rule is not None:  # the teacher draws the classes the student's samples have
            source = source.conditioned(rule)
        own = teacher.sampling
        sigma_min = own.record.get("sigma_min") if own.record["grid"] == "edm" else None
        samplings = {f"teacher, {own.name} {own.record['steps']} steps": own}
        for n in TEACHER_FEW_STEP_NFE:
            grid = make_grid("edm", n, teacher.process, sigma_min=sigma_min or 0.002)
            name = f"teacher, dpmpp_2m {n} step{'s' if n > 1 else ''}"
            samplings[name] = build.Sampling("dpmpp_2m", get_sampler("dpmpp_2m"), grid, {})
        rows = {}
        for label, sampling in samplings.items():
            x, info = draw_samples(
                sampling,
                source,
                jax.random.key(seed),
                teacher.data.data_shape,
                num_samples=num_samples,
                batch_size=teacher.cfg.sampler.batch_size,
                progress=True,
                desc=f"sampling ({label})",
            )
            rows[label] = (int(info["nfe"]), x)
        return rows

    @classmethod
    def data_config(cls, run_cfg: DictConfig) -> DictConfig:
        """The teacher run's data and process (or the run's own, without a teacher run)."""
        src = run_cfg
        if run_cfg.teacher.get("run_dir"):
            src = read_config(run_cfg.teacher.run_dir)
        return OmegaConf.create({"name": run_cfg.name, "data": src.data, "process": src.process})
