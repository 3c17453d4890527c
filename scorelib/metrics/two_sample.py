"""Classifier two-sample test (C2ST): can a classifier tell two sample sets apart?

Label one set 0 and the other 1, train a classifier by ``k``-fold cross-validation and
report its out-of-fold accuracy (Lopez-Paz & Oquab 2017, "Revisiting classifier two-sample
tests", ICLR; the C2ST of simulation-based inference benchmarks, Lueckmann et al. 2021).
0.5 means the classifier cannot tell them apart; 1.0 means it always can. Unlike a Fréchet
distance it sees every difference the classifier can learn (speckle, grey levels, out-of-range
pixels, missing modes), not only the first two moments of a feature map.

Read it beside two numbers at the same sizes: the floor (training data vs test data, which
is what a perfect sampler gets) and a baseline that must be beaten (a Gaussian fit). A model
that copies its training set also reaches the floor: read it beside memorisation statistics
(:func:`scorelib.metrics.memorisation_stats`).
"""

from __future__ import annotations

import math

import numpy as np
from threadpoolctl import threadpool_limits

from scorelib._checks import check_example_sets, check_int


def default_classifier(seed: int = 0):
    """The default C2ST classifier: scikit-learn's ``HistGradientBoostingClassifier``
    (default hyper-parameters, ``random_state=seed``).

    Chosen by measurement (8x8 digits, 359 vs 359, 5 folds, 2 CPU cores): it needs no
    feature scaling and about 0.7 s per test, reads the floor as 0.49 and a Gaussian fit as
    0.95; on two 5-D Gaussians with a mean shift of 1 along a diagonal, 2,000 per side, it
    gets 0.66 against the Bayes accuracy 0.69. A random forest was as fast but less
    sensitive on the digits (0.77 against 0.83 for the same samples); the multilayer
    perceptron of the simulation-based-inference C2ST (two hidden layers of ``10 d``
    units, early stopping) had not finished these four tests after 4 minutes.
    """
    # scikit-learn takes about 1 s to import: paid on first use only
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(random_state=seed)


def default_classifier_for(n: int, *, folds: int = 5, seed: int = 0):
    """:func:`default_classifier` with its leaves small enough to learn from the training
    folds of a C2ST of two sets of ``n`` examples each (``min_samples_leaf = min(20,
    max(1, n_fit // 3))``, ``n_fit = 2 n - ceil(2 n / folds)`` the smallest training fold).

    The default's ``min_samples_leaf = 20`` makes every tree a constant below 40 training
    examples: its C2ST then reads chance (or below) whatever the sets, e.g. 0.50 for both
    real digits and digits of the wrong class at 15 per set (5 folds, 24 to fit). With
    ``n_fit // 3`` (8 there) the same test reads 0.45 and 0.76, and 0.48 at the floor (mean
    over the 10 classes of :func:`scorelib.metrics.per_class_two_sample`; at 8 per set: 0.50,
    0.73 and 0.53). From ``n = 38`` (5 folds) on it is the default itself, so larger tests
    keep their numbers.
    """
    n_fit = 2 * n - math.ceil(2 * n / folds)
    clf = default_classifier(seed)
    return clf.set_params(min_samples_leaf=min(20, max(1, n_fit // 3)))


def stronger_classifier(classifier, factor: int = 2):
    """A copy of a boosting classifier (:func:`default_classifier_for`) with ``factor``
    times its boosting iterations (``max_iter``; the default's 100 -> 200) and no early
    stopping (scikit-learn's ``'auto'`` turns it on above 10,000 examples, which would make
    ``max_iter`` a cap only), to check that a C2ST's verdict is not the default
    classifier's capacity: a two-sample test's accuracy is a lower bound on how far apart
    two laws are, so a classifier that finds more raises it. More iterations can also
    overfit the training folds and lower it; read the two side by side.

    Raises:
      ValueError: naming ``factor`` unless it is an integer >= 1, or ``classifier`` when it
        has no ``max_iter``.
    """
    # scikit-learn takes about 1 s to import: paid on first use only
    from sklearn.base import clone

    factor = check_int(factor, "factor", low=1)
    params = classifier.get_params()
    if "max_iter" not in params:
        raise ValueError(
            f"classifier must be a boosting classifier with max_iter (e.g. "
            f"default_classifier()); got {type(classifier).__name__}"
        )
    out = clone(classifier).set_params(max_iter=factor * int(params["max_iter"]))
    return out.set_params(early_stopping=False) if "early_stopping" in params else out


def c2st(a, b, *, folds: int = 5, seed: int = 0, classifier=None, paired: bool = False) -> dict:
    """Cross-validated accuracy of a classifier that tells ``a`` from ``b``.

    The sets must be balanced (as many examples in each), so that 0.5 is chance. Each
    example is predicted once, by the classifier trained on the other folds
    (``StratifiedKFold(folds, shuffle=True, random_state=seed)``); the accuracy is the
    fraction of the ``2 n`` out-of-fold predictions that are right.

    Paired sets (``paired=True``: ``a[i]`` and ``b[i]`` are a pair, e.g. two samplers run
    from the same initial noise) keep both members of a pair in one fold
    (``KFold(folds, shuffle=True, random_state=seed)`` over the pair indices). Split
    freely, the classifier would be tested on examples whose near-identical partner it was
    trained on with the other label, and read two sets of one law as "worse than chance"
    (0.12 for partners 0.01 apart, 500 pairs of 5-D standard normals, against 0.50 paired). The
    pairing makes the test more useful, not less valid: the same starts cancel the sampling
    noise that two independent sets would differ by. The two predictions of a pair are not
    independent (near-identical partners: one right and one wrong), so for paired sets
    ``se`` is the standard error of the ``n`` per-pair mean accuracies and ``p_value`` the
    one-sided normal p-value of ``accuracy - 0.5`` in that unit (a paired t-test of the
    pairs' scores against 1/2, normal approximation).

    The standard error is the binomial one of that fraction, ``sqrt(acc (1 - acc) / 2n)``
    (Lopez-Paz & Oquab 2017, Sec. 3: under the null the accuracy is approximately
    ``N(1/2, 1/(4 n_te))`` with ``n_te = 2 n`` test predictions here); it ignores the
    small dependence between folds that share training data. ``p_value`` is the one-sided
    p-value of that null approximation: the chance that a classifier that cannot tell the
    sets apart scores this high.

    The classifier runs on one thread (``threadpoolctl.threadpool_limits(1)``): at these
    sizes threads gain nothing, and on a shared 2-core machine two OpenMP threads of the
    default classifier took 31 s for what one thread does in 4 s (359 vs 359, 64 pixels).

    Args:
      a, b: ``[n, *shape]`` each (flattened to ``[n, d]`` features; images must be
        quantised like the data first: :func:`scorelib.data.images.quantise`).
      folds: number of cross-validation folds, ``2 <= folds <= n``.
      seed: seed of the fold split and of the default classifier.
      classifier: an unfitted scikit-learn classifier (cloned for each fold); ``None``:
        :func:`default_classifier`.
      paired: ``a[i]`` and ``b[i]`` are a pair and share a fold (see above).

    Returns:
      dict: ``accuracy``, ``se``, ``p_value`` (floats), ``n`` (examples per set),
      ``fold_accuracies`` (list of ``folds`` floats).

    Raises:
      ValueError: for sets of different sizes or example shapes, non-finite values, or
        ``folds`` out of range.
    """
    # scikit-learn takes about 1 s to import: paid on first use only
    from sklearn.base import clone
    from sklearn.model_selection import KFold, StratifiedKFold, cross_val_predict

    check_example_sets(a, b, ("a", "b"))
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape[0] < 2:
        raise ValueError(f"a and b must be [n >= 2, *shape]; got {a.shape} and {b.shape}")
    if a.shape != b.shape:
        raise ValueError(
            f"a and b must have the same shape (balanced sets of one example shape); "
            f"got {a.shape} and {b.shape}: draw as many of each"
        )
    n = a.shape[0]
    folds = check_int(folds, "folds", low=2, high=n)
    seed = check_int(seed, "seed", low=0)
    x = np.concatenate([a.reshape(n, -1), b.reshape(n, -1)]).astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError("a and b must be finite; got NaN or inf values")
    y = np.repeat(np.array([0, 1]), n)
    clf = default_classifier(seed) if classifier is None else clone(classifier)
    fold_of = np.empty(2 * n, dtype=np.int64)
    if paired:  # pair i is examples i and n + i
        for i, (_, test) in enumerate(KFold(folds, shuffle=True, random_state=seed).split(a)):
            fold_of[test] = fold_of[n + test] = i
    else:
        split = StratifiedKFold(folds, shuffle=True, random_state=seed)
        for i, (_, test) in enumerate(split.split(x, y)):
            fold_of[test] = i
    cv = [(np.flatnonzero(fold_of != i), np.flatnonzero(fold_of == i)) for i in range(folds)]
    with threadpool_limits(1):  # see the docstring: threads cost more than they gain here
        pred = cross_val_predict(clf, x, y, cv=cv)
    right = pred == y
    acc = float(np.mean(right))
    if paired:  # the pairs are the independent units: the se of their mean right
        per_pair = 0.5 * (right[:n] + right[n:].astype(np.float64))
        se = float(np.std(per_pair, ddof=1) / math.sqrt(n))
        null_se = se
    else:
        se = math.sqrt(acc * (1.0 - acc) / (2 * n))
        null_se = 0.5 / math.sqrt(2 * n)
    if null_se > 0:
        p_value = 0.5 * math.erfc((acc - 0.5) / null_se / math.sqrt(2.0))
    else:  # every pair scored alike (e.g. identical sets: one right, one wrong per pair)
        p_value = 0.5 if acc == 0.5 else float(acc < 0.5)
    return {
        "accuracy": acc,
        "se": se,
        "p_value": p_value,
        "n": int(n),
        "fold_accuracies": [float(np.mean(right[fold_of == i])) for i in range(folds)],
    }
