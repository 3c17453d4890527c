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
labels and the two-sample tests per class. Writes ``eval_<stem>.json`` and
``eval_<stem>.md`` beside the samples file ``<stem>.npz`` (``eval_samples.*`` for
``experiments.sample``'s, so evaluating ``a.npz`` and ``b.npz`` of one directory keeps both;
evaluating the same file again replaces its evaluation and says so) and prints the table.
``reuse=true`` prints the saved evaluation of the same file and seed, written after the
samples, instead of computing it again (``make demo``).

The samples are checked against the run's data before anything is computed, in one line
naming ``samples=``: a ``.npz`` holding ``samples`` as float ``[n, *data_shape]``, finite;
images on the data's scale ``[-1, 1]`` (:func:`experiments.runs.evaluation.check_samples`:
a model's samples may overshoot it a little, which the evaluation clips; integer images,
``0 .. 255`` or ``[0, 1]`` are refused).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments import build
from experiments.common import clean_errors, console_to_log, hydra_app
from experiments.runs import configure_jax, read_config, run_kind
from experiments.runs.base import override_keys, selects_samples
from experiments.runs.evaluation import (
    check_sample_labels,
    check_samples,
    describe_samples,
    eval_paths,
    evaluate_and_write,
    load_labels,
    load_samples,
    sample_meta,
    saved_evaluation,
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


@console_to_log
@clean_errors
def run_evaluation(cfg: DictConfig) -> dict:
    configure_jax()
    kind = run_kind(cfg.run_dir)
    overrides = list(HydraConfig.get().overrides.task)
    path = samples_path(cfg, kind, overrides)
    samples, labels = load_samples(path), load_labels(path)
    data_cfg = kind.data_config(read_config(cfg.run_dir))
    data = build.build_data(data_cfg)
    # refused before anything is computed: dtype, shape and range, then the labels
    samples = check_samples(samples, data, f"samples={path}")
    if labels is not None and data.images is not None:
        labels = check_sample_labels(labels, len(samples), data.images, f"samples={path}: labels")
    title = f"{data_cfg.name}: {display_path(path)}"
    if cfg.reuse and (saved := saved_evaluation(path, cfg.seed)) is not None:
        json_path, md_path = eval_paths(path)
        print(f"evaluated earlier: {describe_samples(path)}\n\n{title}\n\n{saved}\n")
        print(
            f"evaluation: {display_path(md_path)} and {json_path.name} (reused: seed "
            f"{cfg.seed}, written after the samples; without reuse=true it is computed again)"
        )
        return json.loads(json_path.read_text())
    print(f"evaluating {describe_samples(path)}", flush=True)
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
        title=title,
        extra={"samples": str(path)},
        rows=rows,
        nfe=meta.get("nfe"),
        labels=labels,
        stem=path.stem,
    )


main = hydra_app("evaluate")(run_evaluation)


if __name__ == "__main__":
    main()
