"""Conditional-sample metrics separate a known-good from a known-bad set (fault kind 11):
real digits with their true labels sit at the classifier's test accuracy and at the
per-class floor; the same digits with shuffled labels fall to chance accuracy and far above
the floor per class, while the pooled (label-blind) test stays at the floor; a set that
drops modes within each class loses per-class recall. The standard error is the binomial
one, each class's numbers are those of the two-sample tests of its own examples, and bad
arguments are refused in one line naming the argument."""

import numpy as np
import pytest
from scipy.stats import binom
from sklearn.linear_model import RidgeClassifier

from scorelib.data.images import load_digits
from scorelib.metrics import (
    ClassifierConfig,
    FeatureExtractor,
    c2st,
    conditional_accuracy,
    default_classifier,
    per_class_two_sample,
    precision_recall,
)
from scorelib.metrics.two_sample import default_classifier_for

#: A fast C2ST classifier for the pixel tests (about 0.05 s a test at 36 vs 36 digits; the
#: default gradient boosting takes 0.45 s): it separates the same sets (the slow test below
#: repeats the separation with the default classifier and classifier features).
FAST = RidgeClassifier()


@pytest.fixture(scope="module")
def digits():
    return load_digits()


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """The bundled digits classifier (the cache directory is used only if it were not)."""
    return FeatureExtractor.load_or_train(ClassifierConfig(), tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def split(digits):
    """Samples: 700 training digits with their labels; floor pool: the other 738; the
    reference: the 359 test digits (35 to 37 per class, so each class compares 35-37)."""
    return {
        "x": digits.train[:700],
        "y": digits.train_labels[:700],
        "floor": digits.train[700:],
        "floor_labels": digits.train_labels[700:],
        "reference": digits.test,
        "reference_labels": digits.test_labels,
    }


def _run(split, labels, samples=None, **kw):
    return per_class_two_sample(
        split["x"] if samples is None else samples,
        labels,
        split["reference"],
        split["reference_labels"],
        floor=split["floor"],
        floor_labels=split["floor_labels"],
        **kw,
    )


# --------------------------------------------------------------------------- accuracy


def test_accuracy_and_its_binomial_standard_error():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 500)
    pred = np.where(rng.random(500) < 0.7, labels, rng.integers(0, 4, 500))
    r = conditional_accuracy(pred, labels)
    acc = np.mean(pred == labels)
    assert r["accuracy"] == pytest.approx(acc) and r["n"] == 500
    # the binomial law of the count right, divided by n
    assert r["se"] == pytest.approx(binom(500, acc).std() / 500, rel=1e-12)
    assert r["classes"] == [0, 1, 2, 3]
    for c, a, se, n in zip(
        r["classes"], r["per_class_accuracy"], r["per_class_se"], r["per_class_n"], strict=True
    ):
        right = pred[labels == c] == c
        assert n == right.size and a == pytest.approx(right.mean())
        assert se == pytest.approx(binom(n, a).std() / n, rel=1e-12)
    all_right = conditional_accuracy(labels, labels)
    assert all_right["accuracy"] == 1.0 and all_right["se"] == 0.0


def test_accuracy_is_the_classifier_test_accuracy_with_true_labels_and_chance_shuffled(digits, ext):
    pred = ext.predict(digits.test)
    good = conditional_accuracy(pred, digits.test_labels)
    assert good["accuracy"] == pytest.approx(ext.accuracy(digits.test, digits.test_labels))
    assert good["accuracy"] > 0.95
    shuffled = np.random.default_rng(0).permutation(digits.test_labels)
    bad = conditional_accuracy(pred, shuffled)
    # a shuffled label matches the prediction with probability sum_c P(pred=c) P(label=c)
    chance = sum(np.mean(pred == c) * np.mean(shuffled == c) for c in range(10))
    assert abs(bad["accuracy"] - chance) < 4 * np.sqrt(chance * (1 - chance) / pred.size), bad
    assert bad["accuracy"] < 0.2 < good["accuracy"] - 4 * good["se"]


# --------------------------------------------------------------------------- per class


def test_per_class_c2st_sees_shuffled_labels_that_the_pooled_test_misses(split):
    good = _run(split, split["y"], classifier=FAST)
    bad = _run(split, np.random.default_rng(0).permutation(split["y"]), classifier=FAST)
    assert good["classes"] == list(range(10)) and min(good["n"]) >= 35
    assert good["spaces"] == ["pixels"] and good["rows"] == ["samples", "floor"]
    se = 0.06  # one class at 35-37 per set: sqrt(1 / (8 m)); the mean of 10: about 0.02
    floor = good["mean"]["floor"]["c2st_pixels"]
    assert abs(good["mean"]["samples"]["c2st_pixels"] - floor) < 0.06, good["mean"]
    assert abs(floor - 0.5) < 0.06 and good["max"]["samples"]["c2st_pixels"] < 0.5 + 4 * se
    # shuffled labels: every class is told from its real examples ...
    assert bad["mean"]["samples"]["c2st_pixels"] > 0.75, bad["mean"]
    assert bad["min"]["samples"]["c2st_pixels"] > 0.5 + 2.5 * se, bad["per_class"]
    # ... and most samples of a class lie off the real class: precision collapses
    assert bad["mean"]["samples"]["precision_pixels"] < 0.4 < 0.8
    assert good["mean"]["samples"]["precision_pixels"] > 0.8
    # the label-blind test of the same sets sees nothing: the union is still digits
    for r in (good, bad):
        assert abs(r["pooled"]["samples"]["c2st_pixels"] - 0.5) < 0.06, r["pooled"]
        assert r["pooled_n"] == sum(r["n"])
    # the floor does not depend on the samples' labels
    assert bad["per_class"]["floor"] == good["per_class"]["floor"]


def test_per_class_recall_sees_mode_dropping_within_a_class(split):
    """Per class, the 37 training digits nearest one exemplar of the class: realistic
    (precision kept) but a corner of the class (recall lost)."""
    x, y = split["x"], split["y"]
    keep = []
    for c in range(10):
        idx = np.flatnonzero(y == c)
        dist = np.sum((x[idx] - x[idx[0]]) ** 2, axis=(1, 2, 3))
        keep.append(idx[np.argsort(dist)[:37]])
    keep = np.concatenate(keep)
    good = _run(split, y, classifier=FAST, pooled=False)
    bad = _run(split, y[keep], samples=x[keep], classifier=FAST, pooled=False)
    assert "pooled" not in bad
    g, b = good["mean"]["samples"], bad["mean"]["samples"]
    assert b["recall_pixels"] < g["recall_pixels"] - 0.2, (g, b)
    assert b["recall_pixels"] < good["mean"]["floor"]["recall_pixels"] - 0.2
    assert abs(b["precision_pixels"] - g["precision_pixels"]) < 0.05, (g, b)


def test_each_class_is_the_two_sample_test_of_its_own_examples(split):
    """A per-example loop: class c's numbers are c2st / precision_recall of the first m
    samples of class c against the reference's examples of class c (all of them: the
    reference is the smallest set), and do not change when other classes are evaluated."""
    y = split["y"]
    two = np.isin(y, [3, 5])
    r = per_class_two_sample(
        split["x"][two], y[two], split["reference"], split["reference_labels"], classifier=FAST
    )
    assert r["classes"] == [3, 5] and r["rows"] == ["samples"]
    for i, c in enumerate(r["classes"]):
        ref = split["reference"][split["reference_labels"] == c]
        m = ref.shape[0]
        assert r["n"][i] == m
        x = split["x"][two][y[two] == c][:m]
        t, pr = c2st(x, ref, classifier=FAST), precision_recall(ref, x)
        got = r["per_class"]["samples"]
        assert got["c2st_pixels"][i] == t["accuracy"] and got["c2st_se_pixels"][i] == t["se"]
        assert got["precision_pixels"][i] == pr["precision"]
        assert got["recall_pixels"][i] == pr["recall"]
    assert r["mean"]["samples"]["c2st_pixels"] == pytest.approx(
        np.mean(r["per_class"]["samples"]["c2st_pixels"])
    )
    # class 5 alone, with a floor: its draws come from (seed, 5) whatever else is evaluated
    five = y == 5
    kw = dict(floor=split["floor"], floor_labels=split["floor_labels"], classifier=FAST)
    alone = per_class_two_sample(
        split["x"][five], y[five], split["reference"], split["reference_labels"], **kw
    )
    both = per_class_two_sample(
        split["x"][two], y[two], split["reference"], split["reference_labels"], **kw
    )
    for row in ("samples", "floor"):
        for key, values in alone["per_class"][row].items():
            assert values == both["per_class"][row][key][1:], (row, key)


@pytest.mark.slow  # 15 to 30 s on 2 busy cores: 20 gradient-boosting C2STs
def test_default_classifier_and_features_separate_shuffled_labels(split, ext):
    """Classes 0-4 (the two-sample tests of the evaluation: the default classifier, pixels
    and the classifier's logits)."""
    five = split["y"] < 5
    x, y = split["x"][five], split["y"][five]
    kw = dict(
        samples=x,
        sample_features=ext.features(x),
        reference_features=ext.features(split["reference"]),
        floor_features=ext.features(split["floor"]),
        pooled=False,
    )
    good = _run(split, y, **kw)
    bad = _run(split, np.random.default_rng(1).permutation(y), **kw)
    assert good["classes"] == [0, 1, 2, 3, 4] and good["spaces"] == ["pixels", "features"]
    for space in good["spaces"]:
        key = f"c2st_{space}"
        assert abs(good["mean"]["samples"][key] - good["mean"]["floor"][key]) < 0.08, good["mean"]
        assert bad["mean"]["samples"][key] > good["mean"]["floor"][key] + 0.2, bad["mean"]
        assert bad["mean"]["samples"][f"precision_{space}"] < 0.5


@pytest.mark.slow  # about 10 s on 2 busy cores
def test_the_default_classifier_is_not_blind_on_small_classes(split):
    """15 test digits per class (24 examples to fit per fold): gradient boosting with its
    default 20 examples per leaf fits constants and reads the same for real digits and
    digits of the wrong class; ``default_classifier_for`` (what the per-class tests use)
    tells them apart. From 38 per set it is the default itself."""
    assert default_classifier_for(38).get_params() == default_classifier().get_params()
    assert default_classifier_for(15).get_params()["min_samples_leaf"] == 8
    shuffled = np.random.default_rng(0).permutation(split["y"])
    blind, sees = [], []
    for c in range(5):
        ref = split["reference"][split["reference_labels"] == c][:15]
        good, bad = (split["x"][y == c][:15] for y in (split["y"], shuffled))
        for out, clf in ((blind, default_classifier()), (sees, default_classifier_for(15))):
            out.append([c2st(x, ref, classifier=clf)["accuracy"] for x in (good, bad)])
    blind, sees = np.mean(blind, axis=0), np.mean(sees, axis=0)
    assert blind[0] == blind[1] and abs(blind[0] - 0.5) < 0.1, blind
    assert sees[1] > sees[0] + 0.2, sees


# --------------------------------------------------------------------------- refusals


def _refuse(split, match, *, labels=None, **kw):
    args = dict(
        samples=split["x"],
        labels=split["y"] if labels is None else labels,
        reference=split["reference"],
        reference_labels=split["reference_labels"],
    )
    args.update(kw)
    with pytest.raises(ValueError, match=match) as e:
        per_class_two_sample(**args, classifier=FAST)
    assert "\n" not in str(e.value)


def test_bad_labels_are_refused_in_one_line(split):
    y = split["y"]
    _refuse(
        split, r"^labels must be \[700\] integer .*got shape \(700,\), dtype float", labels=y * 1.0
    )
    _refuse(split, r"^labels must be \[700\] integer .*got shape \(699,\)", labels=y[:-1])
    _refuse(split, r"^labels must be \[700\] integer .*got shape \(700, 1\)", labels=y[:, None])
    bad_ref = split["reference_labels"][:-1]
    _refuse(split, r"^reference_labels must be \[359\] integer", reference_labels=bad_ref)
    with pytest.raises(ValueError, match=r"^predictions must be \[n >= 1\] integer"):
        conditional_accuracy(np.zeros(3), [0, 1, 2])
    with pytest.raises(ValueError, match=r"^labels must be \[3\] integer"):
        conditional_accuracy(np.zeros(3, int), [0, 1])


def test_classes_absent_from_the_reference_or_too_small_are_refused(split):
    y = split["y"].copy()
    y[:3] = 11
    _refuse(
        split,
        r"^labels must be classes present in reference_labels \(0\.\.9\); "
        r"got class 11 \(3 samples\)$",
        labels=y,
    )
    y = split["y"].copy()
    y[:2] = -1
    y[2] = 12
    _refuse(split, r"got class -1 \(2 samples\) and 1 more$", labels=y)
    # class 4 with 2 samples: which class and how many
    few = np.flatnonzero(split["y"] == 4)[2:]
    keep = np.setdiff1d(np.arange(700), few)
    _refuse(
        split,
        r"^labels must give at least 5 examples of each evaluated class \(5-fold C2ST, "
        r"k = 3 neighbours\); got 2 of class 4$",
        samples=split["x"][keep],
        labels=split["y"][keep],
    )
    # k = 6 needs 7 of each
    keep = np.setdiff1d(np.arange(700), np.flatnonzero(split["y"] == 4)[6:])
    _refuse(
        split,
        r"at least 7 examples .* k = 6 .*got 6 of class 4$",
        samples=split["x"][keep],
        labels=split["y"][keep],
        k=6,
    )
    # the floor too: a class it lacks, or has too few of
    fl = split["floor_labels"].copy()
    fl[fl == 7] = 0
    _refuse(
        split,
        r"^labels must be classes present in floor_labels",
        floor=split["floor"],
        floor_labels=fl,
    )
    keep = np.setdiff1d(np.arange(fl.size), np.flatnonzero(split["floor_labels"] == 7)[3:])
    _refuse(
        split,
        r"^floor_labels must give at least 5 .*got 3 of class 7$",
        floor=split["floor"][keep],
        floor_labels=split["floor_labels"][keep],
    )


def test_inconsistent_floor_and_features_are_refused(split):
    _refuse(split, r"^floor and floor_labels must be given together", floor=split["floor"])
    f = np.zeros((700, 10), np.float32)
    _refuse(
        split,
        r"^sample_features, reference_features must be all given or all None; "
        r"got sample_features only",
        sample_features=f,
    )
    _refuse(split, r"^floor_features must be None without floor", floor_features=f)
    ref = np.zeros((359, 10), np.float32)
    _refuse(
        split,
        r"^sample_features must have shape \[700, d\]",
        sample_features=f[:5],
        reference_features=ref,
    )
    _refuse(
        split,
        r"^reference_features must have shape \[359, d=10\]",
        sample_features=f,
        reference_features=ref[:, :4],
    )
    _refuse(
        split,
        r"^reference must have shape \[m, \*shape=\(8, 8, 1\)\]",
        reference=split["reference"][:, :4],
    )


def test_class_shares_and_their_tv_by_hand_and_on_biased_digits():
    from scorelib.data import load_digits
    from scorelib.metrics import class_share_tv, class_shares

    np.testing.assert_allclose(class_shares([0, 2, 2, 1], 4), [0.25, 0.25, 0.5, 0.0])
    assert class_share_tv([0.5, 0.5, 0.0], [0.25, 0.25, 0.5]) == pytest.approx(0.5)
    d = load_digits()
    test = class_shares(d.test_labels, 10)
    good = class_share_tv(class_shares(d.train_labels, 10), test)  # the same law
    kept = d.train_labels[(d.train_labels != 8) | (np.arange(len(d.train_labels)) % 10 == 0)]
    bad = class_share_tv(class_shares(kept, 10), test)  # eights cut to 10%
    assert good < 0.05 < 0.08 < bad
    with pytest.raises(ValueError, match="predictions must be"):
        class_shares([0, 10], 10)
