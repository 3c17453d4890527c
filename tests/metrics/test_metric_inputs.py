"""Entry checks of the metrics on shapes and dtypes, in float32 and under x64: a sample set
of another example shape, a non-real dtype or a ``t`` of the wrong length is a
``ValueError`` naming the argument, the shape got and the shape expected; the estimators
that take score sources give their closed form in both precisions."""

from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib import metrics as M
from scorelib.data.targets import GaussianMixtureTarget
from scorelib.metrics.baselines import gaussian_baseline
from scorelib.metrics.transport import exact_w2
from scorelib.objectives import MixedScoreMatching
from scorelib.processes import EDM
from scorelib.scores import EmpiricalScore, GaussianScore

PRECISIONS = ["float32", "x64"]


def scope(precision: str):
    return jax.enable_x64(True) if precision == "x64" else contextlib.nullcontext()


RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, 2))
Y = RNG.normal(size=(7, 2))

PAIRS = {  # name: (function of two sample sets, the names of its two arguments)
    "energy_distance": (M.energy_distance, ("x", "y")),
    "sliced_wasserstein2": (M.sliced_wasserstein2, ("x", "y")),
    "mmd_rbf": (M.mmd_rbf, ("x", "y")),
    "median_bandwidth": (M.median_bandwidth, ("x", "y")),
    "squared_distances": (M.squared_distances, ("a", "b")),
    "sample_distances": (M.sample_distances, ("samples", "reference")),
    "precision_recall": (M.precision_recall, ("real", "fake")),
    "nearest_neighbours": (M.nearest_neighbours, ("samples", "train")),
    "memorisation_stats": (M.memorisation_stats, ("samples", "train")),
    "exact_w2": (exact_w2, ("x", "y")),
    "fd_features": (M.fd_features, ("a", "b")),
    "fd_floor": (lambda a, b: M.fd_floor(a, b, 4), ("train_features", "ref_features")),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_sample_set_metrics_name_the_argument_and_both_shapes(name):
    fn, (first, second) = PAIRS[name]
    fn(X, Y)  # good inputs pass
    other = re.escape(f"{second} must have shape [m, *shape=(2,)] (the example shape of {first})")
    with pytest.raises(ValueError, match=f"^{other}; got shape \\(7, 3\\)$"):
        fn(X, RNG.normal(size=(7, 3)))
    if name not in ("fd_features", "fd_floor"):  # features are [n, f]: one axis each
        # images against flattened images: flattening both hid the mismatch
        img = re.escape(f"{second} must have shape [m, *shape=(2, 2)]")
        with pytest.raises(ValueError, match=f"^{img} .*; got shape \\(7, 4\\)$"):
            fn(np.zeros((6, 2, 2)), np.zeros((7, 4)))
    for bad in (X.astype(complex), X > 0):
        with pytest.raises(ValueError, match=f"^{first} must be a real .*; got dtype"):
            fn(bad, Y)
    with pytest.raises(ValueError, match=rf"^{first} must have shape \[n, \*shape\]; got shape"):
        fn(X[:, 0], Y)


def test_single_set_and_statistics_metrics():
    with pytest.raises(ValueError, match=r"^v must have shape \[m\]; got shape \(7, 2\)$"):
        M.wasserstein2_1d(X[:, 0], Y)
    with pytest.raises(ValueError, match=r"^mu2 must have shape \[2\] \(the shape of mu1\)"):
        M.frechet_distance(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))
    with pytest.raises(ValueError, match=r"^mu1 must be a real"):
        M.frechet_distance(np.zeros(2, complex), np.eye(2), np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match=r"^y must have shape \[n=6, \*shape=\(2,\)\]"):
        M.mean_paired_distance(X, Y)
    with pytest.raises(ValueError, match=r"^b must have shape \[m, \*shape=\(2,\)\]"):
        M.c2st(X, X[:, :1], folds=2)
    with pytest.raises(ValueError, match=r"^x must be a real"):
        M.knn_radii(X.astype(complex))
    with pytest.raises(ValueError, match=r"^train must be a real"):
        gaussian_baseline(X > 0, 3, seed=0)
    target = GaussianMixtureTarget.create([0.5, 0.5], [[1.0, 0], [-1, 0]], stds=[0.3, 0.3])
    with pytest.raises(ValueError, match=r"^samples must be a real"):
        M.mode_statistics(X.astype(complex), target)
    with pytest.raises(ValueError, match=r"^reference must have shape \[m, \*shape=\(2,\)\]"):
        M.memorisation_stats(X, Y, np.zeros((4, 3)))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_score_metrics_check_x0_and_t_against_the_sources(precision):
    with scope(precision):
        p = EDM()
        g = GaussianScore.from_covariance(p, [0.0, 0.0], np.eye(2))
        emp = EmpiricalScore.create(p, X)
        key = jax.random.key(0)
        want = "x0 must have shape [batch, 2] (the data_shape of the GaussianScore); got shape"
        with pytest.raises(ValueError, match=re.escape(f"{want} (6, 1)")):
            M.relative_score_error(g, g, X[:, :1], 0.5, key)
        train = "to match the training set's points (data of shape (6, 2)); got shape (6, 3)"
        with pytest.raises(ValueError, match=re.escape(f"x0 must have shape [batch, 2] {train}")):
            M.explained_fraction(g, emp, np.zeros((6, 3)), 0.5, key)
        with pytest.raises(ValueError, match=r"^t must be a scalar or have shape \[batch=6\]"):
            M.relative_score_error(g, g, X, jnp.ones(5), key)
        with pytest.raises(ValueError, match=r"^x0 must be a real"):
            M.noisy_samples(p, X.astype(complex), 0.5, key)
        with pytest.raises(ValueError, match=r"^t must be a scalar or have shape \[batch=6\]"):
            M.noisy_samples(p, X, jnp.ones(5), key)
        target = GaussianMixtureTarget.create([0.5, 0.5], [[1.0, 0], [-1, 0]], stds=[0.3, 0.3])
        obj = MixedScoreMatching(process=p, target=target, kappa="dsm")
        with pytest.raises(ValueError, match=r"^x0 must have shape \[batch, 2\]"):
            M.label_variance({"dsm": obj}, target.noisy_score(p), np.zeros((6, 3)), 0.5, key)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_relative_score_error_closed_form_in_both_precisions(precision):
    # N(0, I) against N(0, 2 I) under EDM at sigma: s_1 - s_2 = -x / ((1 + s^2)(2 + s^2)),
    # so the relative error is (1 / (1 + s^2))^2 whatever the points
    with scope(precision):
        p = EDM()
        one = GaussianScore.from_covariance(p, [0.0, 0.0], np.eye(2))
        two = GaussianScore.from_covariance(p, [0.0, 0.0], 2 * np.eye(2))
        t = np.array([0.3, 0.3, 0.3, 0.3, 0.3, 0.3])
        err = M.relative_score_error(one, two, X, t, jax.random.key(1))
        tol = 1e-12 if precision == "x64" else 1e-5
        assert err == pytest.approx((1 / (1 + 0.3**2)) ** 2, rel=tol)
