"""Structured (dataclass) config schemas for every config group.

Each YAML option under ``configs/<group>/`` starts from one of these schemas
(``defaults: [<schema name>]``), so a wrong type in a file or on the command
line fails when Hydra composes the config. Value ranges are checked when the
library objects are built, at start-up and before anything is compiled; their
errors name the config field (``sampler.steps must be >= 1; got 0``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

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


@dataclass
class DSMConfig:
    _target_: str = "scorelib.objectives.DSM"
    weighting: str = "sigma2"
    reduce: str = "mean"


# --- sampler -------------------------------------------------------------------


@dataclass
class SamplerConfig:
    """One schema for every sampler; options a sampler does not use are ignored."""

    name: str = "heun"
    steps: int = 18
    grid: str = "edm"  # edm | uniform_t | log_snr
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    rho: float = 7.0
    num_samples: int = 1000
    batch_size: int = 1000
    seed: int = 0
    float64: bool = False
    # EDM Heun (Karras et al. 2022, Algorithm 2)
    S_churn: float = 0.0
    S_min: float = 0.0
    S_max: float = float("inf")
    S_noise: float = 1.0
    # predictor-corrector and annealed Langevin
    snr: float = 0.16
    n_corrector: int = 1
    n_steps_each: int = 100
    eps: float | None = None  # annealed Langevin base step; None: the sampler's default


# --- data ----------------------------------------------------------------------


@dataclass
class DataConfig:
    name: str = "digits"  # digits | mnist | toy | npz | target
    # for name=toy: 8gaussians | checkerboard | moons | swissroll | rings | pinwheel
    toy: str = "checkerboard"
    path: str | None = None  # for name=npz
    key: str = "images"  # array key in the .npz
    sigma_data: float = 0.5
    # for name=target: kwargs of scorelib.data.targets.make_target (with its _target_)
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
    steps: int = 7000
    batch_size: int = 256
    seed: int = 0
    log_every: int = 100
    ckpt_every: int = 1000
    keep_last: int = 3
    ema_decay: float | None = 0.999
    ema_halflife_nimg: float | None = None
    ema_rampup_ratio: float | None = None
    nonfinite: str = "stop"  # stop | skip


@dataclass
class TrainConfig:
    """The primary config of ``experiments.train`` (composed in ``configs/train.yaml``)."""

    name: str = MISSING
    process: Any = MISSING
    model: Any = MISSING
    objective: Any = MISSING
    sampler: SamplerConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING


@dataclass
class SampleConfig:
    """The primary config of ``experiments.sample``."""

    run_dir: str = MISSING  # a training run directory
    step: int | None = None  # checkpoint step to sample from; None: the latest
    use_ema: bool = True
    sampler: SamplerConfig = MISSING


@dataclass
class EvaluateConfig:
    """The primary config of ``experiments.evaluate``."""

    run_dir: str = MISSING  # a training run directory
    samples: str | None = None  # a samples.npz; default: the newest under run_dir/samples
    seed: int = 0
    cache_dir: str | None = None  # classifier cache; default $SCORELIB_CACHE or ~/.cache/scorelib


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    for group, name, node in [
        ("process", "edm_schema", EDMProcessConfig),
        ("process", "ve_schema", VEProcessConfig),
        ("process", "vp_schema", VPProcessConfig),
        ("process", "subvp_schema", SubVPProcessConfig),
        ("model", "mlp_schema", MLPConfig),
        ("model", "unet_schema", UNetConfig),
        ("objective", "edm_schema", EDMLossConfig),
        ("objective", "dsm_schema", DSMConfig),
        ("sampler", "sampler_schema", SamplerConfig),
        ("data", "data_schema", DataConfig),
        ("optim", "optim_schema", OptimConfig),
        ("trainer", "trainer_schema", TrainerConfig),
    ]:
        cs.store(group=group, name=name, node=node)
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="sample_schema", node=SampleConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
