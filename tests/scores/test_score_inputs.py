"""Entry checks of the score sources on static shapes and dtypes, in float32 and under x64.

A query of the wrong example shape, a wrong-length ``t`` or a non-real dtype is a
``ValueError`` that names the argument, the shape it got and the shape expected (for the
training-set sources: the training set's), raised before any compute, instead of a reshape
or broadcast ``TypeError`` from inside the softmax. Good queries under x64 give the float64
closed forms.
"""

from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.data.targets import GaussianMixtureTarget, ManyWellTarget
from scorelib.nets import MLP
from scorelib.processes import EDM, VP
from scorelib.scores import (
    EmpiricalScore,
    GaussianScore,
    MixtureScore,
    NeighbourScore,
    NetworkScore,
    SmoothedScore,
    gaussian_flow,
    gaussian_marginal_sample,
    score_from_denoiser,
)

PRECISIONS = ["float32", "x64"]


def scope(precision: str):
    return jax.enable_x64(True) if precision == "x64" else contextlib.nullcontext()


TRAIN = "to match the training set's points (data of shape (8, 2)); got shape"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_training_set_sources_name_the_query_and_the_training_set(precision):
    # the inputs: EmpiricalScore.create(EDM(), np.zeros((8, 2))) queried at [3, 1]
    # and [3, 3], by denoiser and score, directly and through SmoothedScore over the exact
    # and the nearest-neighbour estimators
    with scope(precision):
        emp = EmpiricalScore.create(EDM(), np.zeros((8, 2)))
        nn = NeighbourScore.create(emp, k=2, l=2)
        key = jax.random.key(0)
        sources = {
            "empirical": emp,
            "smoothed": SmoothedScore.create(emp, sigma_s=0.1, M=2).for_examples(key, 3),
            "smoothed_nn": SmoothedScore.create(nn, sigma_s=0.1, M=2).for_examples(key, 3),
        }
        for src in sources.values():
            for bad in ((3, 1), (3, 3), (2,), (3, 1, 2)):
                for method in ("denoiser", "score"):
                    want = f"x must have shape [batch, 2] {TRAIN} {bad}"
                    with pytest.raises(ValueError, match=re.escape(want)):
                        getattr(src, method)(jnp.zeros(bad), 0.5)
        for bad in ((3, 1), (3, 3)):
            want = f"y must have shape [batch, 2] (flattened queries) {TRAIN} {bad}"
            with pytest.raises(ValueError, match=re.escape(want)):
                emp.posterior_mean(jnp.zeros(bad), 0.5)
            with pytest.raises(ValueError, match=re.escape(want)):
                nn.posterior_mean(jnp.zeros(bad), 0.5, jax.random.split(key, 3))
            with pytest.raises(ValueError, match=re.escape(want)):
                nn.search(jnp.zeros(bad))
        with pytest.raises(ValueError, match=re.escape("keys must have shape [3]")):
            nn.posterior_mean(jnp.zeros((3, 2)), 0.5, jax.random.split(key, 2))
        with pytest.raises(ValueError, match=re.escape("ve_sigma must be a scalar or have shape")):
            emp.posterior_mean(jnp.zeros((3, 2)), jnp.ones((3,)))
        # inside jit the check reads static shapes (the count of points is then "n")
        with pytest.raises(ValueError, match=re.escape("data of shape (n, 2)); got shape (3, 1)")):
            jax.jit(lambda s, x: s.denoiser(x, 0.5))(emp, jnp.zeros((3, 1)))


def _sources(rng):
    """One of each score source over 2-D data (built in the current precision)."""
    x = rng.normal(size=(8, 2))
    emp = EmpiricalScore.create(EDM(), x)
    target = GaussianMixtureTarget.create([0.5, 0.5], [[1.0, 0], [-1, 0]], stds=[0.3, 0.3])
    model = MLP((2,), width=8, depth=1, emb_dim=8, rngs=nnx.Rngs(0))
    gd, params = nnx.split(model, nnx.Param)
    key = jax.random.key(1)
    return {
        "gaussian": GaussianScore.from_covariance(VP(), [0.5, -0.5], [[1.0, 0.3], [0.3, 0.5]]),
        "mixture": target.noisy_score(VP()),
        "empirical": emp,
        "smoothed": SmoothedScore.create(emp, sigma_s=0.2, M=2).for_examples(key, 3),
        "manywell": ManyWellTarget.create(2).noisy_score(EDM()),
        "network": NetworkScore(process=EDM(), graphdef=gd, params=params, sigma_data=1.0),
        "network_fisher": NetworkScore(
            process=EDM(), graphdef=gd, params=params, sigma_data=1.0, sigma_fisher=1.0
        ),
    }


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_source_refuses_bad_queries_before_compute(precision):
    with scope(precision):
        sources = _sources(np.random.default_rng(0))
        x = jnp.zeros((3, 2))
        for src in sources.values():
            for method in ("score", "denoiser"):
                fn = getattr(src, method)
                for bad in ((3, 1), (3,), (3, 2, 1)):
                    with pytest.raises(ValueError, match=r"^x must have shape \[batch, 2\] .*"):
                        fn(jnp.zeros(bad), 0.5)
                with pytest.raises(
                    ValueError, match=r"^t must be a scalar or have shape \[batch=3\]"
                ):
                    fn(x, jnp.full((2,), 0.5))
                for bad in (x.astype(jnp.complex64), x > 0):
                    with pytest.raises(ValueError, match=r"^x must be a real .*; got dtype"):
                        fn(bad, 0.5)
                with pytest.raises(ValueError, match=r"^t must be a real"):
                    fn(x, "0.5")


def _gaussian_score_np(mean, cov, alpha, sigma, x):
    c = alpha**2 * cov + sigma**2 * np.eye(len(mean))
    return -np.linalg.solve(c, (x - alpha * mean).T).T


def _empirical_denoiser_np(data, y, s):
    """The softmax-weighted mean, one point at a time (float64)."""
    out = []
    for q in y:
        logits = -np.sum((q - data) ** 2, axis=1) / (2 * s**2)
        w = np.exp(logits - logits.max())
        out.append((w[:, None] * data).sum(0) / w.sum())
    return np.array(out)


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_good_queries_under_x64_are_float64_closed_forms():
    rng = np.random.default_rng(1)
    data = rng.normal(size=(8, 2))
    x = rng.normal(size=(3, 2))
    mean, cov = np.array([0.5, -0.5]), np.array([[1.0, 0.3], [0.3, 0.5]])
    p = VP()
    with jax.enable_x64(True):
        g = GaussianScore.from_covariance(p, mean, cov)
        emp = EmpiricalScore.create(EDM(), data)
        t = 0.3
        a, s = float(p.alpha(t)), float(p.sigma(t))
        got = g.score(jnp.asarray(x), t)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, _gaussian_score_np(mean, cov, a, s, x), rtol=1e-12)
        d = emp.denoiser(jnp.asarray(x), 0.05)  # EDM: ve_sigma = t
        assert d.dtype == jnp.float64
        np.testing.assert_allclose(d, _empirical_denoiser_np(data, x, 0.05), rtol=1e-10)
        # every source answers a good float64 query with a finite [3, 2] array
        for name, src in _sources(rng).items():
            for method in ("score", "denoiser"):
                out = getattr(src, method)(jnp.asarray(x), jnp.full((3,), 0.5))
                assert out.shape == (3, 2) and bool(jnp.all(jnp.isfinite(out))), name


@pytest.mark.parametrize("precision", PRECISIONS)
def test_gaussian_helpers_and_constructors_name_the_argument(precision):
    with scope(precision):
        g = GaussianScore.from_covariance(EDM(), [0.0, 0.0], np.eye(2))
        x = jnp.zeros((3, 2))
        want = "x must have shape [batch, 2] (the data_shape of the GaussianScore); got shape"
        with pytest.raises(ValueError, match=re.escape(f"{want} (3, 1)")):
            gaussian_flow(g, jnp.zeros((3, 1)), sigma_from=2.0, sigma_to=0.5)
        with pytest.raises(ValueError, match=r"^sigma_from must be a scalar or have shape"):
            gaussian_flow(g, x, sigma_from=jnp.ones(2), sigma_to=0.5)
        with pytest.raises(ValueError, match=r"^eps must have shape \[batch, 2\]"):
            gaussian_marginal_sample(g, jnp.zeros((3, 1)), 0.5)
        with pytest.raises(ValueError, match=r"^denoised must have shape \[3, 2\]"):
            score_from_denoiser(EDM(), x, 0.5, jnp.zeros((3, 1)))
        with pytest.raises(ValueError, match=r"^data_shape must be a shape holding d = 2"):
            GaussianScore.from_covariance(EDM(), [0.0, 0.0], np.eye(2), data_shape=(3,))
        with pytest.raises(ValueError, match=r"^data_shape must be a shape holding d = 2"):
            MixtureScore.create(EDM(), [1.0], [[0.0, 0.0]], [np.eye(2)], data_shape=(2, 2))
        for bad in (np.zeros((8, 2), complex), np.zeros((8, 2), bool)):
            with pytest.raises(ValueError, match=r"^data must be a real"):
                EmpiricalScore.create(EDM(), bad)
