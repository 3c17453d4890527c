"""Table ``gaussian_teleport_cifar10``: the ``gaussian_teleport`` analysis at paper scale.

``python -m experiments.reproduce table=gaussian_teleport_cifar10
table.data_path=/data/cifar10.npz table.checkpoint=outputs/cifar10_edm/<run>``

Inputs, both required and checked before anything is loaded or compiled:

* ``table.data_path``: a ``.npz`` with CIFAR-10 as ``uint8`` NHWC ``[50000, 32, 32, 3]``
  under key ``images`` (optional ``test_images``), the layout of
  :func:`scorelib.data.load_npz`.
* ``table.checkpoint``: a training run directory of this library trained on that data
  (``python -m experiments.train data=npz data.path=... model=unet ...``); its EMA
  parameters are restored. The run's own ``data.path`` is replaced by ``table.data_path``
  so that the run can be moved between machines.

Features for FD: ``table.features: pixels`` (default) is the Fréchet distance of raw
pixels (``FD_pixels``: comparable between skips, *not* FID); ``module:function`` names a
user function ``images [n, 32, 32, 3] in [-1, 1] -> features [n, f]`` (e.g. an Inception
wrapper loading local weights) to get FID-like numbers. The paper reports FID 1.93 with
teleportation on EDM CIFAR-10 (Wang & Vastola 2024) and skips the first 15-30% of steps.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments.runs import ScoreRun, saved_steps
from experiments.tables import gaussian_teleport as gt

EXPECT_DATA = (
    "a .npz with CIFAR-10 as uint8 NHWC [n, 32, 32, 3] under key 'images' (optional "
    "'test_images'), e.g. np.savez('cifar10.npz', images=train_uint8, test_images=test_uint8)"
)
EXPECT_CKPT = (
    "a training run directory of this library (with config.yaml and checkpoints/), e.g. from "
    "`python -m experiments.train data=npz data.path=<npz> model=unet name=cifar10_edm`"
)


def check_inputs(tc: DictConfig) -> tuple[Path, Path]:
    """Fail fast: ``(data_path, checkpoint)`` or an error naming the missing one.

    Raises:
      ValueError: a required field is unset.
      FileNotFoundError: the path does not exist or is not what is expected.
    """
    data_path, ckpt = tc.get("data_path"), tc.get("checkpoint")
    if not data_path:
        raise ValueError(f"table.data_path is required: {EXPECT_DATA}")
    if not ckpt:
        raise ValueError(f"table.checkpoint is required: {EXPECT_CKPT}")
    data_path, ckpt = Path(str(data_path)).expanduser(), Path(str(ckpt)).expanduser()
    if not data_path.is_file():
        raise FileNotFoundError(
            f"table.data_path={data_path}: no such file; expected {EXPECT_DATA}"
        )
    if not (ckpt / "config.yaml").is_file():
        raise FileNotFoundError(
            f"table.checkpoint={ckpt}: no config.yaml there; expected {EXPECT_CKPT}"
        )
    if not (ckpt / "checkpoints").is_dir():
        raise FileNotFoundError(
            f"table.checkpoint={ckpt}: no checkpoints/ directory; expected {EXPECT_CKPT}"
        )
    return data_path, ckpt


def load_cifar_model(ckpt: Path, data_path: Path):
    """``(run, source, step)`` of the run in ``ckpt`` with its data path replaced."""
    cfg = OmegaConf.load(ckpt / "config.yaml")
    if cfg.data.name != "npz":
        raise ValueError(
            f"table.checkpoint={ckpt} was trained on data {cfg.data.name!r}; "
            "expected data=npz (CIFAR-10 from a .npz)"
        )
    cfg.data.path = str(data_path)
    run = ScoreRun.build(cfg)
    if not saved_steps(ckpt):
        raise FileNotFoundError(
            f"table.checkpoint={ckpt}: no checkpoint saved yet; expected {EXPECT_CKPT}"
        )
    state = run.restore(ckpt)
    return run, run.source(state.ema_params), int(state.step)


def feature_function(spec: str | None):
    """``images -> features``: raw pixels, or the user function ``module:function``."""
    if not spec or spec == "pixels":
        return "pixels", lambda x: np.asarray(x, np.float32).reshape(x.shape[0], -1)
    if ":" not in spec:
        raise ValueError(f"table.features must be 'pixels' or 'module:function'; got {spec!r}")
    mod, fn = spec.split(":", 1)
    try:
        return spec, getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"table.features={spec!r}: cannot import ({e})") from e


def compute(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Check the inputs, load the model and run the analysis; as
    :func:`experiments.tables.gaussian_teleport.compute`."""
    tc = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    data_path, ckpt = check_inputs(tc)
    feat_name, features = feature_function(tc.get("features"))
    tc = gt._settings(tc)
    t0 = time.perf_counter()
    run, source, step = load_cifar_model(ckpt, data_path)
    dataset = run.data.images
    if dataset.test is None:  # FD and part (a) use the held-out split; fall back to train
        dataset = dataclasses.replace(dataset, test=dataset.train)
    res = gt.analyse_dataset("cifar10", source, run.process, dataset, features, tc, log=log)
    res.model = {
        "run_dir": str(ckpt),
        "step": step,
        "trained": "given",
        "model": OmegaConf.to_container(run.cfg.model, resolve=True),
        "features": feat_name,
        "train_steps": int(run.cfg.trainer.steps),
        "batch_size": int(run.cfg.trainer.batch_size),
    }
    return {"settings": tc, "results": {"cifar10": res}, "wall_s": time.perf_counter() - t0}


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """As :func:`experiments.tables.gaussian_teleport.run`, for CIFAR-10."""
    run_dir = Path(run_dir)
    out = compute(cfg, run_dir, log=log)  # fails fast before creating anything
    gt.write_results(run_dir, out)
    fig = run_dir / "figure.png"
    gt.make_figure(out["results"], fig)
    rep = gt.report(out)
    feat = out["results"]["cifar10"].model["features"]
    rep["notes"].insert(
        0,
        f"FD features: {feat} ('pixels' is FD on raw pixels, not FID); "
        "paper: FID 1.93 on CIFAR-10 with teleportation, 15-30% of steps "
        "skipped at no loss.",
    )
    return {**rep, "figure": str(fig), "raw": out}
