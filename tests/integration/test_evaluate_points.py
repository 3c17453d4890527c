"""The 2-D evaluation's floor is a mean and a spread over draws of the data, so that good
samples read as good and bad ones as bad (a single draw was beaten by good samples about
half the time, and read as a bug)."""

import numpy as np
import pytest

from experiments.runs.evaluation import evaluate_points, format_points_table
from scorelib.data.toy import toy_sample
from scorelib.metrics.distances import energy_distance

N = 300


def _draws(seed0, k):
    return [toy_sample("8gaussians", N, seed) for seed in range(seed0, seed0 + k)]


def test_floor_is_the_mean_and_spread_of_the_draws():
    ref = toy_sample("8gaussians", N, 1)
    floors = _draws(100, 4)
    r = evaluate_points(toy_sample("8gaussians", N, 2), ref, floors=floors)
    eds = [energy_distance(f, ref) for f in floors]  # the four draws, one by one
    assert r["floor_draws"] == 4
    assert r["energy_distance_floor"] == pytest.approx(np.mean(eds), rel=1e-12)
    assert r["energy_distance_floor_std"] == pytest.approx(np.std(eds, ddof=1), rel=1e-12)
    assert r["sliced_w2_floor_std"] > 0


def test_good_samples_sit_within_the_floor_and_bad_ones_far_above_it():
    ref = toy_sample("8gaussians", N, 1)
    floors = _draws(100, 8)
    z_good, z_bad = [], []
    for seed in range(200, 212):
        good = toy_sample("8gaussians", N, seed)  # a perfect sampler
        bad = good * 1.15  # modes 15% too far out, a mild sampler bias
        r = evaluate_points(good, ref, floors=floors)
        rb = evaluate_points(bad, ref, floors=floors)
        for z, x in ((z_good, r), (z_bad, rb)):
            z.append(
                (x["energy_distance"] - x["energy_distance_floor"]) / x["energy_distance_floor_std"]
            )
    assert max(abs(z) for z in z_good) < 3.5, z_good
    assert min(z_bad) > 5, z_bad


def test_the_table_gives_the_spread_and_a_single_draw_is_refused():
    ref = toy_sample("8gaussians", N, 1)
    r = evaluate_points(toy_sample("8gaussians", N, 2), ref, floors=_draws(100, 3))
    table = format_points_table(r)
    assert "(floor; mean +- std of 3) |" in table
    assert f"{r['energy_distance_floor']:.4f} +- {r['energy_distance_floor_std']:.4f}" in table
    with pytest.raises(ValueError, match="at least 2 draws"):
        evaluate_points(ref, ref, floors=_draws(100, 1))
