"""Evaluate samples of a run: ``python -m experiments.evaluate run_dir=<run> [samples=<npz>]``.

Which samples: ``samples=<path>``, or else the samples that ``experiments.sample`` writes
with the same ``sampler``/``step``/``use_ema`` arguments (by default the run's own sampler,
its newest checkpoint, EMA parameters: what ``experiments.train`` drew at its end). If
they are not there, the command says which directory it looked in.

The metrics, each beside its floor and a baseline, are those of
:mod:`experiments.runs.evaluation` (images: FD, the classifier two-sample test,
precision/recall, bits/dim of a score run's model, memorisation; 2-D data and targets:
energy distance and sliced W2). Conditional samples (a ``labels`` array beside ``samples``
in the ``.npz``) of image data also get the bundled classifier's accuracy against their
labels and the two-sample tests per class. Writes ``eval.json`` and ``eval.md`` beside the
samples and prints the table.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments import build
from experiments.common import clean_errors, hydra_app
from experiments.runs import configure_jax, read_config, run_kind
from experiments.runs.base import override_keys, selects_samples
from experiments.runs.evaluation import (
    check_sample_labels,
    describe_samples,
    evaluate_and_write,
    load_labels,
    load_samples,
    sample_meta,
)
from experiments.runs.layout import display_path
from experiments.schema import register_configs

register_configs()


def samples_path(cfg: DictConfig, kind, overrides: list[str]) -> Path:
    """``samples=`` when given (then no sampler/step/use_ema argument), else the samples
    ``experiments.sample`` writes for the same arguments.

    Raises:
      ValueError: ``samples=`` given together with ``sampler``/``step``/``use_ema``.
      FileNotFoundError: the file is not there (the message names the directory).
    """
    if not cfg.samples:
        return kind.find_samples(cfg, overrides)
    selectors = [k for k in override_keys(overrides) if selects_samples(k)]
    if selectors:
        raise ValueError(
            f"samples= names the file to evaluate; {selectors[0]}= selects samples by how "
            "they were drawn: give one or the other"
        )
    path = Path(cfg.samples)
    if not path.is_file():
        raise FileNotFoundError(f"samples={path}: no such file")
    return path


@clean_errors
def run_evaluation(cfg: DictConfig) -> dict:
    configure_jax()
    kind = run_kind(cfg.run_dir)
    overrides = list(HydraConfig.get().overrides.task)
    path = samples_path(cfg, kind, overrides)
    samples, labels = load_samples(path), load_labels(path)
    print(f"evaluating {describe_samples(path)}", flush=True)
    data_cfg = kind.data_config(read_config(cfg.run_dir))
    data = build.build_data(data_cfg)
    if labels is not None and data.images is not None:  # refused before anything is computed
        labels = check_sample_labels(labels, len(samples), data.images, f"samples={path}: labels")
    prior, source, rows, meta = None, None, None, sample_meta(path)
    if data.images is None:
        process = build.build_process(data_cfg)
        prior = np.asarray(process.prior_sample(jax.random.key(cfg.seed), samples.shape))
    else:  # the model's bits/dim, and other samplers beside these samples (a teacher)
        source = kind.evaluation_source(Path(cfg.run_dir), cfg.step, cfg.use_ema)
        seed = int(meta.get("sampler", {}).get("seed", 0))
        rows = kind.comparison_rows(read_config(cfg.run_dir), num_samples=len(samples), seed=seed)
    return evaluate_and_write(
        samples,
        data,
        path.parent,
        seed=cfg.seed,
        cache_dir=cfg.cache_dir,
        source=source,
        prior=prior,
        title=f"{data_cfg.name}: {display_path(path)}",
        extra={"samples": str(path)},
        rows=rows,
        nfe=meta.get("nfe"),
        labels=labels,
    )


main = hydra_app("evaluate")(run_evaluation)


if __name__ == "__main__":
    main()
