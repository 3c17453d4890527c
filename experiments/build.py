"""Build the library objects of a run from its config, validating everything up front.

Every check that can fail on a bad config runs here, before anything is compiled:
the process, objective and model constructors, the sampler's grid and options, the
data files. Errors name the config field.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from flax import nnx
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from scorelib.data import get_batch, load_digits, load_mnist_subset, load_npz, toy_batch
from scorelib.data.images import ImageDataset
from scorelib.data.toy import TOY_NAMES
from scorelib.samplers import edm_grid, get_sampler, log_snr_grid, uniform_t_grid

DATA_NAMES = ("digits", "mnist", "toy", "npz", "target")
GRIDS = ("edm", "uniform_t", "log_snr")
SAMPLER_OPTIONS = {
    "heun": ("S_churn", "S_min", "S_max", "S_noise"),
    "dpmpp_2m": (),
    "euler_maruyama": (),
    "pf_ode_euler": (),
    "pc": ("snr", "n_corrector"),
    "annealed_langevin": ("n_steps_each", "eps"),
}


@dataclasses.dataclass
class Data:
    """Training data of a run: a dataset (images) or a stream (toy), and a batch function."""

    name: str
    data_shape: tuple[int, ...]
    images: ImageDataset | None  # None for toy streams and targets
    target: Any = None  # a scorelib.data.targets target for name=target

    def batch_fn(self, batch_size: int, seed: int):
        """A pure jnp function ``step -> [batch_size, *data_shape]`` usable inside jit."""
        if self.target is not None:
            return functools.partial(_target_batch, self.target, batch_size, seed)
        if self.images is None:
            toy = self.name.split(":", 1)[1]
            return functools.partial(_toy_batch, toy, batch_size, seed)
        train = jax.device_put(self.images.train)
        return functools.partial(_image_batch, train, batch_size, seed)

    def reference(self, n: int, seed: int = 12345) -> np.ndarray:
        """Held-out reference samples: the test split, or fresh toy or target samples."""
        if self.target is not None:
            key = jax.random.key(seed)
            return np.asarray(self.target.sample(key, n, needed_by="reference samples"))
        if self.images is None:
            from scorelib.data import toy_sample

            return toy_sample(self.name.split(":", 1)[1], n, seed)
        return self.images.test


def _toy_batch(name, batch_size, seed, step):
    return toy_batch(name, batch_size, seed=seed, step=step)


def _target_batch(target, batch_size, seed, step):
    return target.batch(batch_size, seed=seed, step=step)


def _image_batch(train, batch_size, seed, step):
    return get_batch(train, batch_size, seed=seed, step=step)


def build_data(cfg: DictConfig) -> Data:
    """Load the data named by ``cfg.data`` (ValueError/FileNotFoundError on a bad config)."""
    name = cfg.data.name
    if name == "digits":
        ds = load_digits()
    elif name == "mnist":
        ds = load_mnist_subset()
    elif name == "npz":
        if not cfg.data.path:
            raise ValueError("data.path must name a .npz file for data=npz")
        ds = load_npz(cfg.data.path, key=cfg.data.key)
    elif name == "target":
        if not cfg.data.get("target"):
            raise ValueError("data.target must describe a target for data=target")
        target = instantiate(cfg.data.target, _convert_="all")
        target.require_samples("data=target (training batches)")
        return Data(f"target:{target.name}", (target.dim,), images=None, target=target)
    elif name == "toy":
        if cfg.data.toy not in TOY_NAMES:
            raise ValueError(f"data.toy must be one of {list(TOY_NAMES)}; got {cfg.data.toy!r}")
        return Data(name=f"toy:{cfg.data.toy}", data_shape=(2,), images=None)
    else:
        raise ValueError(f"data.name must be one of {list(DATA_NAMES)}; got {name!r}")
    return Data(name=name, data_shape=ds.data_shape, images=ds)


def build_process(cfg: DictConfig):
    return instantiate(cfg.process)


def build_model(cfg: DictConfig, data_shape: tuple[int, ...], seed: int) -> nnx.Module:
    # _partial_: Hydra would turn objects passed as kwargs into configs.
    make = instantiate(cfg.model, _partial_=True, _convert_="all")
    return make(data_shape=tuple(data_shape), rngs=nnx.Rngs(seed))


def build_objective(cfg: DictConfig, process):
    return instantiate(cfg.objective, _partial_=True, _convert_="all")(process=process)


@dataclasses.dataclass
class Sampling:
    """A sampler, its grid and options, validated."""

    name: str
    fn: Any
    grid: np.ndarray
    opts: dict

    def __call__(self, source, key, shape, **kw):
        return self.fn(source, key, shape, grid=self.grid, **self.opts, **kw)


def build_sampler(cfg: DictConfig, process) -> Sampling:
    """The sampler of ``cfg.sampler`` with its grid; raises ValueError naming the field."""
    sc = cfg.sampler
    fn = get_sampler(sc.name)
    if sc.grid == "edm":
        grid = edm_grid(sc.steps, sc.sigma_min, sc.sigma_max, sc.rho)
    elif sc.grid == "uniform_t":
        grid = uniform_t_grid(process, sc.steps)
    elif sc.grid == "log_snr":
        grid = log_snr_grid(process, sc.steps)
    else:
        raise ValueError(f"sampler.grid must be one of {list(GRIDS)}; got {sc.grid!r}")
    for field in ("num_samples", "batch_size"):
        if sc[field] < 1:
            raise ValueError(f"sampler.{field} must be >= 1; got {sc[field]}")
    opts = {k: sc[k] for k in SAMPLER_OPTIONS[sc.name] if sc[k] is not None}
    opts["float64"] = bool(sc.float64)
    return Sampling(name=sc.name, fn=fn, grid=grid, opts=opts)


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
