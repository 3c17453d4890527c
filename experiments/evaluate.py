"""Evaluate samples of a run: ``python -m experiments.evaluate run_dir=<run> [samples=<npz>]``.

Images (digits, MNIST subset): FD in classifier features against the test split, beside
its floor (as many training images) and a Gaussian-fit baseline, and the memorisation
statistic beside that of the test images. 2-D data: energy distance and sliced W2 to
fresh target samples, beside those of the prior. Writes ``eval.json`` and ``eval.md``
beside the samples and prints the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments import build
from experiments.common import clean_errors
from experiments.evaluation import evaluate_images, evaluate_points, format_image_table
from experiments.schema import register_configs

register_configs()


def newest_samples(run_dir: Path) -> Path:
    found = sorted((run_dir / "samples").rglob("samples.npz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(
            f"{run_dir / 'samples'}: no samples.npz; run experiments.sample first"
        )
    return found[-1]


@clean_errors
def run_evaluation(cfg: DictConfig) -> dict:
    run_dir = Path(cfg.run_dir)
    train_cfg = OmegaConf.load(run_dir / "config.yaml")
    path = Path(cfg.samples) if cfg.samples else newest_samples(run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"samples={path}: no such file")
    samples = np.load(path)["samples"]
    data = build.build_data(train_cfg)
    if data.images is not None:
        result = evaluate_images(
            samples, data.images, train_cfg.data.name, seed=cfg.seed, cache_dir=cfg.cache_dir
        )
        table = format_image_table(result, train_cfg.data.name)
    else:
        ref = data.reference(samples.shape[0], seed=cfg.seed + 1)

        process = build.build_process(train_cfg)
        rng = np.random.default_rng(cfg.seed)
        prior = process.prior_std() * rng.standard_normal(samples.shape).astype(np.float32)
        result = evaluate_points(samples, ref, seed=cfg.seed, prior=prior)
        table = (
            "| | energy distance to target | sliced W2 |\n|---|---|---|\n"
            f"| samples | {result['energy_distance']:.4f} | {result['sliced_w2']:.4f} |\n"
            f"| prior draws | {result['energy_distance_prior']:.4f} | |"
        )
    result["samples"] = str(path)
    (path.parent / "eval.json").write_text(json.dumps(result, indent=2))
    (path.parent / "eval.md").write_text(table + "\n")
    print(f"\n{train_cfg.name}: {path}\n\n{table}\n")
    return result


@hydra.main(config_path="../configs", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_evaluation(cfg)


if __name__ == "__main__":
    main()
