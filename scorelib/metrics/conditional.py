"""Evaluating class-conditional samples: are they of their class, and is each class right?

Two questions that the pooled metrics (:func:`scorelib.metrics.c2st`,
:func:`scorelib.metrics.precision_recall` of all samples against all real images) cannot
answer: a sampler that ignores its labels, or draws a good digit of the wrong class, passes
every pooled test, because the union of its samples is still distributed like the data.

* :func:`conditional_accuracy`: the share of samples that a classifier trained on the real
  data assigns to the label they were drawn for, with its binomial standard error and per
  class. It is the conditional analogue of the first factor of the Inception score
  (Salimans et al. 2016, Sec. 4: ``exp E_x KL(p(y|x) || p(y))`` rewards confident class
  predictions; with the class known, the natural score is whether the prediction is that
  class). It is the reverse of the Classification Accuracy Score (Ravuri & Vinyals 2019,
  NeurIPS), which trains a classifier on samples and tests it on real data: here the
  classifier is trained on real data and tested on the samples. Read it beside the
  same classifier's accuracy on held-out real images (the floor): a perfect conditional
  sampler reaches it, not 1.
* :func:`per_class_two_sample`: for each class ``c`` the C2ST and precision/recall of the
  samples of class ``c`` against the real examples of class ``c``, beside the floor (as
  many other real examples of class ``c``), in pixels and, when given, in classifier
  features; their mean over classes, and the label-blind ("pooled") tests of the union of
  the same per-class sets. Samples with shuffled labels are at the floor pooled and far
  above it per class (``tests/metrics/test_metrics_conditional.py``).

What each per-class number says: a high C2ST of class ``c`` means its samples are told
from real ``c``; low precision, that many of them lie off the real ``c`` (wrong-class or
junk samples); low recall, that part of the variety of real ``c`` is missing (mode
dropping within a class). Recall alone does not see wrong-class samples: a set of every
digit covers the sevens as well as sevens do.

All are pure functions of host arrays. Images must be quantised like the data first
(:func:`scorelib.data.images.quantise`), as for the pooled metrics.
"""

from __future__ import annotations

import math

import numpy as np

from scorelib._checks import check_array, check_example_sets, check_int, require
from scorelib.metrics.precision_recall import precision_recall
from scorelib.metrics.two_sample import c2st, default_classifier_for

#: The per-class statistics, per feature space.
METRICS = ("c2st", "c2st_se", "precision", "recall")


def _labels(labels, field: str, n: int, of: str) -> np.ndarray:
    """``labels`` as an int64 ``[n]`` array, or ValueError naming ``field``."""
    arr = np.asarray(labels)
    if arr.shape != (n,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"{field} must be [{n}] integer class labels (one per example of {of}); got "
            f"shape {arr.shape}, dtype {arr.dtype}"
        )
    return arr.astype(np.int64)


def _binomial(right: np.ndarray) -> tuple[float, float]:
    """The mean of ``right: [n]`` bool and its binomial standard error."""
    acc = float(np.mean(right))
    return acc, math.sqrt(acc * (1.0 - acc) / right.size)


def class_shares(predictions, num_classes: int) -> np.ndarray:
    """``[num_classes]`` share of each class among ``predictions: [n]`` (class indices, e.g.
    a classifier's reading of samples), float64.

    Raises:
      ValueError: naming ``predictions`` (empty, or a class outside ``0..num_classes-1``).
    """
    p = np.asarray(predictions).reshape(-1)
    require(
        p.size >= 1
        and np.issubdtype(p.dtype, np.integer)
        and p.min() >= 0
        and p.max() < num_classes,
        "predictions",
        f"a non-empty array of class indices in [0, {num_classes - 1}]",
        p[:5].tolist(),
    )
    return np.bincount(p, minlength=num_classes) / p.size


def class_share_tv(a, b) -> float:
    """Total variation ``0.5 sum_c |a_c - b_c|`` between two class-share vectors (e.g. of
    samples and of test data, :func:`class_shares`), in ``[0, 1]``.

    Raises:
      ValueError: naming ``b`` (another length than ``a``).
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    require(a.shape == b.shape, "b", f"class shares of a's length {a.shape}", b.shape)
    return float(0.5 * np.abs(a - b).sum())


def conditional_accuracy(predictions, labels) -> dict:
    """The accuracy of a classifier's predictions on conditional samples against the
    labels they were drawn for (module docstring).

    ``accuracy = mean_i [pred_i == label_i]`` with the binomial standard error
    ``sqrt(acc (1 - acc) / n)`` (samples drawn independently; 0 when every prediction is
    right or every one wrong), and the same per class of the labels.

    Usage with the bundled digits classifier (quantised samples):
    ``conditional_accuracy(FeatureExtractor.load_or_train(...).predict(x), labels)``; its
    floor is ``conditional_accuracy(ext.predict(test_images), test_labels)``.

    Args:
      predictions: ``[n]`` int predicted classes.
      labels: ``[n]`` int classes the samples were drawn for.

    Returns:
      dict: ``accuracy``, ``se`` (floats), ``n`` (int), ``classes`` (sorted classes of
      ``labels``), ``per_class_accuracy``, ``per_class_se`` (float lists) and
      ``per_class_n`` (int list), aligned with ``classes``.

    Raises:
      ValueError: naming ``predictions`` (not ``[n >= 1]`` integers) or ``labels`` (not
        ``[n]`` integers).
    """
    pred = np.asarray(predictions)
    if pred.ndim != 1 or pred.size < 1 or not np.issubdtype(pred.dtype, np.integer):
        raise ValueError(
            "predictions must be [n >= 1] integer predicted classes; got shape "
            f"{pred.shape}, dtype {pred.dtype}"
        )
    y = _labels(labels, "labels", pred.size, "predictions")
    right = pred.astype(np.int64) == y
    acc, se = _binomial(right)
    classes = np.unique(y)
    per = [_binomial(right[y == c]) for c in classes]
    return {
        "accuracy": acc,
        "se": se,
        "n": int(y.size),
        "classes": [int(c) for c in classes],
        "per_class_accuracy": [a for a, _ in per],
        "per_class_se": [s for _, s in per],
        "per_class_n": [int(np.sum(y == c)) for c in classes],
    }


def _stats(x, ref, *, folds: int, k: int, seed: int, classifier) -> dict:
    """C2ST accuracy and se and precision/recall of ``x`` against ``ref`` (equal sizes)."""
    if classifier is None:  # the default, with leaves that can split at this size
        classifier = default_classifier_for(x.shape[0], folds=folds, seed=seed)
    t = c2st(x, ref, folds=folds, seed=seed, classifier=classifier)
    pr = precision_recall(ref, x, k=k)
    return {
        "c2st": t["accuracy"],
        "c2st_se": t["se"],
        "precision": pr["precision"],
        "recall": pr["recall"],
    }


def per_class_two_sample(
    samples,
    labels,
    reference,
    reference_labels,
    *,
    floor=None,
    floor_labels=None,
    sample_features=None,
    reference_features=None,
    floor_features=None,
    folds: int = 5,
    k: int = 3,
    seed: int = 0,
    pooled: bool = True,
    classifier=None,
) -> dict:
    """Per-class C2ST and precision/recall of conditional samples against real examples of
    the same class, beside a floor of other real examples of the class (module docstring).

    For each class ``c`` of ``labels`` (sorted), with ``m_c = min(#samples of c,
    #reference of c, #floor of c)``:

    * the first ``m_c`` samples of class ``c`` (in order: a sampler's draws are i.i.d.);
    * ``m_c`` reference examples of class ``c`` (all of them when there are ``m_c``, else a
      draw without replacement);
    * ``m_c`` floor examples of class ``c`` (without replacement): what a perfect
      conditional sampler gets at the same sizes;

    and the C2ST (:func:`scorelib.metrics.c2st`, ``folds`` folds, the fold seed ``seed``)
    and precision/recall (:func:`scorelib.metrics.precision_recall`, ``k`` neighbours) of
    the samples and of the floor against that reference, in pixels and, with features, in
    feature space (the rows of the feature arrays are those of the images). The draws of
    class ``c`` come from ``np.random.default_rng((seed, c))``, so a class's numbers do not
    depend on which other classes are evaluated.

    Summaries: the mean over classes (each class counts once, whatever ``m_c``), the
    minimum and the maximum; and, with ``pooled``, the label-blind tests of the union over
    classes of the same sets (samples and floor then have the reference's class
    proportions, so class proportions cannot separate them): a sampler that ignores its
    labels is near the floor there and far above it per class.

    One class's C2ST at ``m_c`` per set has a standard error of about
    ``sqrt(1 / (8 m_c))`` (0.06 at 36); the mean over ``K`` classes about ``1/sqrt(K)`` of
    it. Precision and recall grow with ``m_c``: compare with the floor only.

    Args:
      samples: ``[n, *shape]`` (images quantised like the data).
      labels: ``[n]`` int class of each sample.
      reference: ``[r, *shape]`` held-out real examples (e.g. the test split).
      reference_labels: ``[r]`` int.
      floor: ``[f, *shape]`` other real examples (e.g. the training split), or ``None`` (no
        floor row).
      floor_labels: ``[f]`` int (with ``floor``).
      sample_features, reference_features, floor_features: ``[n, d]``, ``[r, d]``,
        ``[f, d]`` features of the same rows (e.g. a classifier's logits), all or none
        (``floor_features`` only with ``floor``).
      folds: C2ST folds, ``>= 2``.
      k: the precision/recall neighbour, ``>= 1``.
      seed: the draws of reference and floor examples, the C2ST folds and classifier.
      pooled: also the label-blind tests of the union of the per-class sets.
      classifier: an unfitted scikit-learn classifier for the C2ST (``None``: the default
        with leaves small enough for the class's size,
        :func:`scorelib.metrics.two_sample.default_classifier_for`: the default itself
        from 38 per set; below 25 its trees could not split, and its C2ST would read chance
        whatever the sets).

    Returns:
      dict with ``classes`` (int list), ``n`` (``m_c`` per class, int list), ``spaces``
      (``["pixels"]`` or ``["pixels", "features"]``), ``rows`` (``["samples"]`` or
      ``["samples", "floor"]``), and for each row:

      * ``per_class[row][f"{metric}_{space}"]``: float list over ``classes``, for
        ``metric`` in ``c2st``, ``c2st_se``, ``precision``, ``recall``;
      * ``mean[row][...]``, ``min[row][...]``, ``max[row][...]``: floats over classes;
      * with ``pooled``: ``pooled[row][...]`` (floats) and ``pooled_n`` (``sum m_c``).

    Raises:
      ValueError: one line naming the argument: ``labels``/``reference_labels``/
        ``floor_labels`` that are not ``[n]`` integers; a class of ``labels`` absent from
        ``reference_labels`` or ``floor_labels``; a class with fewer than ``max(folds, k
        + 1)`` samples, reference or floor examples (which class, how many); features
        given for some sets only, or not one row per example; ``floor_labels`` without
        ``floor``; mismatched example shapes.
    """
    check_example_sets(samples, reference, ("samples", "reference"))
    folds = check_int(folds, "folds", low=2)
    k = check_int(k, "k", low=1)
    seed = check_int(seed, "seed", low=0)
    samples, reference = np.asarray(samples), np.asarray(reference)
    labels = _labels(labels, "labels", samples.shape[0], "samples")
    ref_labels = _labels(reference_labels, "reference_labels", reference.shape[0], "reference")
    if (floor is None) != (floor_labels is None):
        raise ValueError("floor and floor_labels must be given together; got one of them")
    sets = {"samples": (samples, labels), "reference": (reference, ref_labels)}
    if floor is not None:
        check_example_sets(reference, floor, ("reference", "floor"))
        floor = np.asarray(floor)
        sets["floor"] = (floor, _labels(floor_labels, "floor_labels", floor.shape[0], "floor"))
    feats = _features(
        sets,
        {"samples": sample_features, "reference": reference_features, "floor": floor_features},
    )

    need = max(folds, k + 1)
    classes = np.unique(labels)
    for name, (_, y) in sets.items():
        missing = [int(c) for c in classes if not np.any(y == c)]
        if name != "samples" and missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise ValueError(
                f"labels must be classes present in {name}_labels "
                f"({_show_classes(np.unique(y))}); got class {missing[0]} "
                f"({int(np.sum(labels == missing[0]))} samples){more}"
            )
    for c in classes:
        for name, (_, y) in sets.items():
            count = int(np.sum(y == c))
            if count < need:
                field = "labels" if name == "samples" else f"{name}_labels"
                raise ValueError(
                    f"{field} must give at least {need} examples of each evaluated class "
                    f"({folds}-fold C2ST, k = {k} neighbours); got {count} of class {int(c)}"
                )

    spaces = ["pixels"] + (["features"] if feats else [])
    rows = ["samples"] + (["floor"] if floor is not None else [])
    keys = [f"{m}_{s}" for s in spaces for m in METRICS]
    per_class = {row: {key: [] for key in keys} for row in rows}
    ms, union = [], {name: [] for name in sets}
    for c in classes:
        rng = np.random.default_rng((seed, int(c)))
        idx = {name: np.flatnonzero(y == c) for name, (_, y) in sets.items()}
        m = min(len(i) for i in idx.values())
        picked = {"samples": idx["samples"][:m]}
        for name in sets:
            if name != "samples":
                pool = idx[name]
                picked[name] = (
                    pool if len(pool) == m else np.sort(rng.choice(pool, m, replace=False))
                )
        ms.append(int(m))
        for name in sets:
            union[name].append(picked[name])
        for space in spaces:
            data = {name: (sets[name][0] if space == "pixels" else feats[name]) for name in sets}
            ref = data["reference"][picked["reference"]]
            for row in rows:
                st = _stats(
                    data[row][picked[row]], ref, folds=folds, k=k, seed=seed, classifier=classifier
                )
                for metric, value in st.items():
                    per_class[row][f"{metric}_{space}"].append(value)

    out = {
        "classes": [int(c) for c in classes],
        "n": ms,
        "spaces": spaces,
        "rows": rows,
        "per_class": per_class,
        "mean": {r: {key: float(np.mean(v)) for key, v in per_class[r].items()} for r in rows},
        "min": {r: {key: float(np.min(v)) for key, v in per_class[r].items()} for r in rows},
        "max": {r: {key: float(np.max(v)) for key, v in per_class[r].items()} for r in rows},
    }
    if pooled:
        together = {name: np.concatenate(v) for name, v in union.items()}
        out["pooled_n"] = int(sum(ms))
        out["pooled"] = {row: {} for row in rows}
        for space in spaces:
            data = {name: (sets[name][0] if space == "pixels" else feats[name]) for name in sets}
            ref = data["reference"][together["reference"]]
            for row in rows:
                st = _stats(
                    data[row][together[row]],
                    ref,
                    folds=folds,
                    k=k,
                    seed=seed,
                    classifier=classifier,
                )
                out["pooled"][row].update({f"{m}_{space}": v for m, v in st.items()})
    return out


_FEATURE_ARGS = {
    "samples": "sample_features",
    "reference": "reference_features",
    "floor": "floor_features",
}


def _features(sets: dict, given: dict) -> dict:
    """The feature arrays of the named ``sets`` (``{}`` when none is given), checked: all
    or none, one row per example, one feature width."""
    if given["floor"] is not None and "floor" not in sets:
        raise ValueError("floor_features must be None without floor; got an array")
    have = [name for name in sets if given[name] is not None]
    if not have:
        return {}
    if len(have) != len(sets):
        args = ", ".join(_FEATURE_ARGS[name] for name in sets)
        shown = ", ".join(_FEATURE_ARGS[name] for name in have)
        raise ValueError(f"{args} must be all given or all None; got {shown} only")
    sizes, out = {}, {}
    for name in sets:
        rows = sets[name][0].shape[0]
        sizes = check_array(
            given[name],
            _FEATURE_ARGS[name],
            (rows, "d"),
            sizes=sizes,
            note=f" (one row per example of {name})",
        )
        out[name] = np.asarray(given[name])
    return out


def _show_classes(classes) -> str:
    """``[0, 1, ..., 9]`` for a contiguous run, else the list (cut)."""
    c = [int(v) for v in classes]
    if len(c) > 3 and c == list(range(c[0], c[-1] + 1)):
        return f"{c[0]}..{c[-1]}"
    return str(c if len(c) <= 12 else c[:12] + ["..."])
