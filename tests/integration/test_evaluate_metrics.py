"""experiments.evaluate's image metrics in process, at smoke scale: the two-sample rows
separate a Gaussian fit from training digits, and bits/dim come with their baselines."""

import dataclasses

import jax
import numpy as np
import pytest

from experiments.runs.evaluation import evaluate_images, format_image_table
from scorelib.data.images import load_digits
from scorelib.metrics import dequantise
from scorelib.metrics.baselines import gaussian_baseline
from scorelib.processes import EDM
from scorelib.scores.gaussian_fit import fit_gaussian


@pytest.mark.slow
def test_gaussian_samples_and_a_gaussian_model():
    d = load_digits()
    small = dataclasses.replace(d, test=d.test[:96], test_labels=d.test_labels[:96])
    # continuous, out-of-range samples: evaluate quantises them itself
    samples = gaussian_baseline(d.train, 200, seed=7) * 1.1
    # the model: the Gaussian that evaluate fits as the bits/dim baseline (same keys)
    deq = dequantise(d.train, jax.random.fold_in(jax.random.key(0), 1), levels=17)
    source = fit_gaussian(EDM(), np.asarray(deq))
    r = evaluate_images(samples, small, "digits", seed=0, floor_draws=2, source=source)
    assert r["two_sample_n"] == 96 and r["two_sample_draws"] == 2
    assert r["c2st_pixels_samples"] > r["c2st_pixels_floor"] + 0.15, r
    for space in ("pixels", "features"):
        assert r[f"recall_{space}_samples"] < r[f"recall_{space}_floor"] - 0.2, r
    assert r["bpd"] == pytest.approx(r["bpd_gaussian"], abs=1e-6)  # the same model
    assert 0.0 < r["bpd"] < r["bpd_uniform"] == pytest.approx(np.log2(17))
    assert r["bpd_n"] == 96 and r["bpd_se"] > 0
    table = format_image_table(r, "digits")
    for row in ("(floor)", "(baseline)", "bits/dim of the 96 test images", "uniform over the 17"):
        assert row in table


def test_too_few_samples_are_refused_before_compute():
    d = load_digits()
    with pytest.raises(ValueError, match=r"at least 10 samples .* \(sampler.num_samples\)"):
        evaluate_images(d.train[:9], d, "digits")


@pytest.mark.slow
def test_other_samplers_rows_are_evaluated_beside_the_samples(tmp_path):
    """evaluate_and_write(rows=...) (a student beside its teacher): each row gets every
    metric, the table shows them with the floor's row, and eval_samples.json keeps them. The rows
    are told apart: training digits pass the two-sample test, a Gaussian fit does not."""
    from experiments.build import Data
    from experiments.runs.evaluation import evaluate_and_write

    d = load_digits()
    small = dataclasses.replace(d, test=d.test[:96], test_labels=d.test_labels[:96])
    data = Data(name="digits", data_shape=small.train.shape[1:], images=small)
    good, bad = small.train[:120], gaussian_baseline(small.train, 120, seed=3)
    r = evaluate_and_write(bad, data, tmp_path, nfe=1, rows={"teacher, heun 18 steps": (35, good)})
    (row,) = r["rows"].values()
    assert row["nfe"] == 35
    assert row["c2st_pixels_samples"] < r["c2st_pixels_samples"] - 0.15, (row, r)
    assert row["recall_pixels_samples"] > r["recall_pixels_samples"] + 0.2, (row, r)
    table = (tmp_path / "eval_samples.md").read_text()
    for line in ("| these samples | 1 |", "| teacher, heun 18 steps | 35 |", "(floor)"):
        assert line in table, table
    assert "teacher, heun 18 steps" in (tmp_path / "eval_samples.json").read_text()
