"""A run's samples conditioned on class labels and guided: ``sampler.labels`` and
``sampler.guidance`` applied to the run's score source.

The library does the work (``scorelib.scores.conditional``: labels bound per example by
global index; ``scorelib.scores.guidance``: classifier-free and classifier guidance as
sources); this module turns the config into those sources and refuses, in one line naming
the field and before anything is compiled, what cannot be drawn:

* labels for a model without classes, or outside its classes (``sampler.labels``);
* a class-conditional model sampled without labels when its null label (the unconditional
  score) was never trained (``objective.label_dropout = 0``);
* classifier-free guidance of an unconditional model, or without a trained null label;
* any guidance without labels (guidance towards which class?).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.build import Sampling, build_labels
from scorelib.scores.conditional import ConditionalScore
from scorelib.scores.guidance import ClassifierFreeGuidance, ClassifierGuidance


def num_classes_of(source) -> int:
    """The classes of a score source (0: unconditional)."""
    return source.num_classes if isinstance(source, ConditionalScore) else 0


def _null_untrained(what: str) -> ValueError:
    return ValueError(
        f"{what}: the run's null label (the unconditional score) was never trained "
        "(objective.label_dropout = 0); give sampler.labels (e.g. sampler.labels=balanced) "
        "without classifier-free guidance, or train with objective.label_dropout > 0"
    )


def conditioned_source(sampling: Sampling, source, *, null_trained: bool):
    """The source ``sampling`` draws from: ``source`` (a run's score source) conditioned on
    ``sampling.labels`` and guided by ``sampling.guidance``.

    Args:
      sampling: the validated sampler (:func:`experiments.build.build_sampler`).
      source: the run's score source (a class-conditional ``NetworkScore`` or not).
      null_trained: whether the run trained its null label (``objective.label_dropout > 0``).

    Returns:
      a score source; every sampler draws from it unchanged (the driver binds the labels).

    Raises:
      ValueError: naming ``sampler.labels`` or ``sampler.guidance.<field>`` (module
        docstring).
    """
    k = num_classes_of(source)
    g = sampling.guidance
    unlabelled = sampling.labels is None or sampling.labels == "none"
    if g is None:
        if k > 0 and unlabelled and not null_trained:
            raise _null_untrained(f"sampler.labels is {sampling.labels or 'null'}")
        rule = build_labels(sampling.labels, k)
        return source if rule is None else source.conditioned(rule)
    if g["kind"] == "cfg" and k == 0:  # first: no labels would help
        raise ValueError(
            "sampler.guidance.kind=cfg: the run's model is unconditional "
            "(model.num_classes = 0); classifier-free guidance needs a class-conditional "
            "model trained with label dropout (or use sampler.guidance.kind=classifier)"
        )
    if unlabelled:
        raise ValueError(
            f"sampler.labels: guidance (sampler.guidance.kind={g['kind']}) needs the classes "
            "to guide towards; give sampler.labels (balanced | uniform | a class | a list)"
        )
    interval = g.get("interval")
    if g["kind"] == "cfg":
        if not null_trained:
            raise _null_untrained("sampler.guidance.kind=cfg")
        guided = ClassifierFreeGuidance.create(
            source, scale=g["scale"], interval=interval, filter=g["filter"]
        )
        return guided.conditioned(build_labels(sampling.labels, k))
    classifier = load_guidance_classifier(g["classifier"])
    kc = int(classifier.num_classes)
    if k > 0 and not null_trained:
        raise _null_untrained("sampler.guidance.kind=classifier (its prior is the null label)")
    if k > 0 and k != kc:
        raise ValueError(
            f"sampler.guidance.classifier={g['classifier']}: a classifier of {kc} classes for "
            f"a model of {k}"
        )
    # the classifier reads x / alpha at the VE level: valid on the run's process too
    classifier = classifier.with_process(source.process)
    guided = ClassifierGuidance.create(source, classifier, scale=g["scale"], interval=interval)
    return guided.conditioned(build_labels(sampling.labels, kc))


def load_guidance_classifier(run_dir: str):
    """The noise-conditional classifier of an ``experiments.train_classifier`` run (its EMA
    parameters).

    Raises:
      FileNotFoundError: naming ``sampler.guidance.classifier`` when there is no such run.
    """
    from experiments.runs.classifier import load_classifier  # the classifier run kind

    if not (Path(run_dir) / "config.yaml").is_file():
        raise FileNotFoundError(
            f"sampler.guidance.classifier={run_dir}: not an experiments.train_classifier run "
            f"(no {Path(run_dir) / 'config.yaml'})"
        )
    try:
        return load_classifier(run_dir)
    except ValueError as e:  # the run's own check names run_dir: name the field given
        raise ValueError(f"sampler.guidance.classifier={run_dir}: {e}") from None


def sample_labels(source, key, num_samples: int) -> np.ndarray | None:
    """``[num_samples]`` the class of each sample of a draw with ``key`` from ``source``
    (``None`` when the source is not conditioned): the labels the sampler's driver binds to
    global indices ``0 .. num_samples - 1``."""
    if not isinstance(source, ConditionalScore) or source.condition is None:
        return None
    return np.asarray(source.condition.take(key, 0, num_samples))
