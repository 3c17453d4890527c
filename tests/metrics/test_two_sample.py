"""C2ST: chance on one distribution, Bayes accuracy on a known pair, the floor on copies,
and a separation of real held-out digits from a Gaussian fit and from unquantised samples."""

import math

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from scorelib.data.images import load_digits, quantise
from scorelib.metrics import c2st, default_classifier, memorisation_stats, stronger_classifier
from scorelib.metrics.baselines import gaussian_baseline


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def test_one_distribution_gives_chance():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 1000, 5))
    r = c2st(a, b)
    assert abs(r["accuracy"] - 0.5) <= 2 * r["se"], r
    assert r["p_value"] > 0.05
    assert r["n"] == 1000 and len(r["fold_accuracies"]) == 5
    assert r["se"] == pytest.approx(math.sqrt(r["accuracy"] * (1 - r["accuracy"]) / 2000))


def test_mean_shift_reaches_but_does_not_beat_bayes():
    # N(0, I_5) vs N(delta u, I_5), |u| = 1 along a diagonal: the Bayes classifier
    # thresholds u.x at delta / 2 and is right with probability Phi(delta / 2).
    rng = np.random.default_rng(1)
    d, n, delta = 5, 2000, 1.0
    u = np.ones(d) / math.sqrt(d)
    a = rng.normal(size=(n, d))
    b = rng.normal(size=(n, d)) + delta * u
    bayes = norm.cdf(delta / 2)
    r = c2st(a, b)
    assert r["accuracy"] <= bayes + 2 * r["se"], (r, bayes)
    assert r["accuracy"] >= bayes - 0.05, (r, bayes)
    assert r["p_value"] < 1e-10


def test_accuracy_is_the_out_of_fold_fraction_right():
    # an independent loop over the same folds with the same classifier
    rng = np.random.default_rng(2)
    a = rng.normal(size=(60, 3))
    b = rng.normal(size=(60, 3)) + 0.7
    r = c2st(a, b, folds=4, seed=3, classifier=LogisticRegression())
    x, y = np.concatenate([a, b]), np.repeat([0, 1], 60)
    right = []
    for tr, te in StratifiedKFold(4, shuffle=True, random_state=3).split(x, y):
        clf = LogisticRegression().fit(x[tr], y[tr])
        right.append(clf.predict(x[te]) == y[te])
    assert r["accuracy"] == pytest.approx(np.mean(np.concatenate(right)))
    assert r["fold_accuracies"] == pytest.approx([np.mean(f) for f in right])


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_paired_sets_keep_each_pair_in_one_fold():
    """Two sets of one law whose examples come in near-identical pairs (two samplers from
    the same starts): split freely, the classifier predicts each test example by its
    partner's label and scores far below chance; paired, it scores chance. A real change
    of law on the same pairs is still told apart (the test can fail both ways)."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(500, 5))
    partners = a + 0.01 * rng.normal(size=a.shape)
    assert c2st(a, partners)["accuracy"] < 0.3
    r = c2st(a, partners, paired=True)
    assert abs(r["accuracy"] - 0.5) <= 3 * r["se"], r
    same_law = c2st(a, -a, paired=True)  # -a has a's law N(0, I) exactly
    assert abs(same_law["accuracy"] - 0.5) <= 3 * same_law["se"], same_law
    shifted = c2st(a, partners + 0.3, paired=True)
    assert shifted["accuracy"] > 0.55 and shifted["p_value"] < 1e-3, shifted  # Bayes: 0.63
    # both members of a pair are predicted by a classifier trained without either
    from sklearn.neighbors import KNeighborsClassifier

    nn = c2st(a, partners, paired=True, classifier=KNeighborsClassifier(1))
    assert abs(nn["accuracy"] - 0.5) <= 3 * nn["se"], nn
    # accuracy and the pairs' standard error, recomputed by hand
    from sklearn.model_selection import KFold

    b = partners + 0.3
    got = c2st(a, b, folds=4, seed=2, paired=True, classifier=LogisticRegression())
    right = np.zeros((500, 2))
    for tr, te in KFold(4, shuffle=True, random_state=2).split(a):
        x = np.concatenate([a[tr], b[tr]]).astype(np.float32)
        clf = LogisticRegression().fit(x, np.repeat([0, 1], len(tr)))
        right[te, 0] = clf.predict(a[te].astype(np.float32)) == 0
        right[te, 1] = clf.predict(b[te].astype(np.float32)) == 1
    assert got["accuracy"] == pytest.approx(right.mean())
    assert got["se"] == pytest.approx(right.mean(1).std(ddof=1) / math.sqrt(500))
    assert got["p_value"] == pytest.approx(norm.sf((right.mean() - 0.5) / got["se"]))


def test_same_seed_same_result():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(2, 200, 4))
    assert c2st(a, b, seed=7) == c2st(a, b, seed=7)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_digits_floor_gaussian_and_quantisation(digits):
    n = digits.test.shape[0]
    rng = np.random.default_rng(0)
    train = digits.train[rng.choice(digits.train.shape[0], n, replace=False)]
    floor = c2st(train, digits.test)
    assert abs(floor["accuracy"] - 0.5) <= 3 * floor["se"], floor
    gauss = quantise(gaussian_baseline(digits.train, n, seed=0), digits.levels)
    bad = c2st(gauss, digits.test)
    assert bad["accuracy"] > 0.85, bad
    # continuous samples are told apart by their grey levels alone: quantise first
    blurred = train + rng.normal(0.0, 0.02, train.shape).astype(np.float32)
    assert c2st(blurred, digits.test)["accuracy"] > 0.95
    assert c2st(quantise(blurred, digits.levels), digits.test)["accuracy"] < 0.6


def test_copies_of_training_set_reach_the_floor(digits):
    # a model that copies its training set passes the C2ST; memorisation catches it
    n = digits.test.shape[0]
    copies = digits.train[:n]
    r = c2st(copies, digits.test)
    assert abs(r["accuracy"] - 0.5) <= 3 * r["se"], r
    mem = memorisation_stats(copies, digits.train, reference=digits.test)
    assert mem["copy_rate"] == 1.0 and mem["sample_nn_mean"] == 0.0


def test_default_classifier_is_documented_estimator():
    from sklearn.ensemble import HistGradientBoostingClassifier

    clf = default_classifier(3)
    assert isinstance(clf, HistGradientBoostingClassifier) and clf.random_state == 3


def test_the_stronger_classifier_doubles_the_boosting_and_keeps_chance_and_bayes():
    """Twice the default's 100 iterations, everything else the same; it still reads chance
    on one law and stays at or below the Bayes accuracy on a mean shift (as the default)."""
    base = default_classifier(4).set_params(min_samples_leaf=7)
    strong = stronger_classifier(base)
    assert strong.max_iter == 200 and base.max_iter == 100  # a copy: base unchanged
    assert strong.min_samples_leaf == 7 and strong.random_state == 4
    assert strong.early_stopping is False  # all 200 iterations at any size
    rng = np.random.default_rng(5)
    d, n, delta = 5, 600, 1.0
    a, b = rng.normal(size=(2, n, d))
    same = c2st(a, b, classifier=strong)
    assert abs(same["accuracy"] - 0.5) <= 3 * same["se"], same
    shifted = c2st(a, b + delta / math.sqrt(d), classifier=strong)
    bayes = norm.cdf(delta / 2)
    assert bayes - 0.06 <= shifted["accuracy"] <= bayes + 2 * shifted["se"], (shifted, bayes)
    from sklearn.neighbors import KNeighborsClassifier  # only this check needs it

    with pytest.raises(ValueError, match="max_iter"):
        stronger_classifier(KNeighborsClassifier())
    with pytest.raises(ValueError, match="factor must be an integer"):
        stronger_classifier(base, factor=0)


def test_errors():
    a = np.zeros((10, 3))
    with pytest.raises(ValueError, match="same shape"):
        c2st(a, np.zeros((11, 3)))
    with pytest.raises(ValueError, match="folds must be an integer in"):
        c2st(a, a + 1, folds=1)
    with pytest.raises(ValueError, match="folds must be an integer in"):
        c2st(a, a + 1, folds=11)
    with pytest.raises(ValueError, match="finite"):
        c2st(a, np.full((10, 3), np.nan))
