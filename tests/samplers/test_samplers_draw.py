"""draw_samples: batches with per-example keys, so the batch size does not change a sample."""

import functools

import jax
import numpy as np
import pytest
from sampler_helpers import PROCESSES, Gauss

from scorelib.samplers import draw_samples, edm_grid, euler_maruyama, heun, teleport
from scorelib.scores import fit_gaussian

G = Gauss(3, [0.1, 0.4, 1.5])


@pytest.mark.parametrize("batch_size", [1, 4, 10, 64])
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_samples_do_not_depend_on_the_batch_size(batch_size):
    """Example i is fold_in(key, i): every batch size gives the one-call samples."""
    src = G.source(PROCESSES["vp"])
    key, grid = jax.random.key(3), edm_grid(5)
    whole, _ = euler_maruyama(src, key, (10, 3), grid=grid)
    x, info = draw_samples(
        euler_maruyama, src, key, (3,), num_samples=10, batch_size=batch_size, grid=grid
    )
    assert isinstance(x, np.ndarray) and x.shape == (10, 3)
    np.testing.assert_allclose(x, np.asarray(whole), rtol=1e-5, atol=1e-5)
    assert info["nfe"] == 5 and info["steps"] == 5 and info["num_samples"] == 10
    assert info["num_nonfinite"] == 0 and info["wall_s"] > 0


def test_teleported_sampler_and_options_pass_through():
    src = G.source(PROCESSES["edm"])
    gauss = fit_gaussian(PROCESSES["edm"], np.random.default_rng(0).normal(size=(100, 3)))
    key, grid = jax.random.key(1), edm_grid(6)

    def tele(source, key, shape, **kw):
        return teleport(heun, source, gauss, key, shape, skip=2, **kw)

    x, info = draw_samples(tele, src, key, (3,), num_samples=5, batch_size=2, grid=grid)
    want, _ = teleport(heun, src, gauss, key, (5, 3), grid=grid, skip=2)
    np.testing.assert_allclose(x, np.asarray(want), rtol=1e-5, atol=1e-5)
    assert info["nfe"] == 2 * 4 - 1 and info["skip"] == 2
    churn, _ = draw_samples(
        heun, src, key, (3,), num_samples=5, batch_size=5, grid=grid, S_churn=10.0
    )
    want, _ = heun(src, key, (5, 3), grid=grid, S_churn=10.0)
    np.testing.assert_array_equal(churn, np.asarray(want))


def test_counts_nonfinite_samples_and_shows_progress(capsys):
    """Samples 3 and 7 (global indices) diverge in a stand-in sampler."""

    def fake(source, key, shape, *, first_index, grid):
        idx = first_index + np.arange(shape[0])
        x = np.ones(shape)
        x[np.isin(idx, [3, 7]), 0] = np.nan
        return x, {"nfe": 1, "steps": 1, "note": "fake", "array": np.zeros(2)}

    x, info = draw_samples(
        fake, None, None, (2,), num_samples=9, batch_size=4, grid=None, progress=True
    )
    assert info["num_nonfinite"] == 2 and x.shape == (9, 2)
    assert "array" not in info and info["note"] == "fake"
    assert "9/9" in capsys.readouterr().err  # the tqdm bar ran to the end


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(num_samples=0), "sampler.num_samples"),
        (dict(batch_size=0), "sampler.batch_size"),
        (dict(num_samples=2.0), "sampler.num_samples"),
        (dict(progress=1), "progress"),
    ],
)
def test_rejects_bad_counts(kw, field):
    args = dict(num_samples=4, batch_size=2, grid=edm_grid(3))
    args.update(kw)
    with pytest.raises(ValueError, match=field):
        draw_samples(
            functools.partial(euler_maruyama),
            G.source(PROCESSES["vp"]),
            jax.random.key(0),
            (3,),
            **args,
        )
