"""``data.holdout``: a fixed, stratified part of the training split kept out of training
(:meth:`scorelib.data.ImageDataset.hold_out`), through the data config."""

from __future__ import annotations

import numpy as np
import pytest
from compose_train import compose_train

from experiments.build import build_data
from scorelib.data import load_digits
from scorelib.data.noisy import corrupt, noisy_dataset


def _rows(x):
    return {r.tobytes() for r in np.asarray(x).reshape(len(x), -1)}


def test_held_out_and_kept_split_the_training_images_by_class():
    d = load_digits()
    h = d.hold_out(0.25)
    assert len(h.train) + len(h.held_out) == len(d.train) == 1438
    # disjoint by index: together the original rows, as a multiset
    both = np.concatenate([h.train, h.held_out]).reshape(1438, -1)
    orig = np.asarray(d.train).reshape(1438, -1)
    assert sorted(map(bytes, both)) == sorted(map(bytes, orig))
    # stratified: each class holds out round(0.25 n_class) images
    want = [round(0.25 * np.sum(d.train_labels == c)) for c in range(10)]
    assert np.bincount(h.held_out_labels, minlength=10).tolist() == want
    np.testing.assert_array_equal(h.test, d.test)  # the test split is untouched
    again = load_digits().hold_out(0.25)  # a fixed split
    np.testing.assert_array_equal(again.held_out, h.held_out)
    # of_classes keeps the held-out part of those classes
    two = h.of_classes([0, 1])
    assert set(two.held_out_labels.tolist()) == {0, 1} and len(two.held_out) == want[0] + want[1]


def test_noisy_held_out_images_take_the_indices_after_the_training_ones():
    h = load_digits().hold_out(0.25)
    n = noisy_dataset(h, 0.2, seed=3)
    np.testing.assert_array_equal(n.held_out, corrupt(h.held_out, 0.2, seed=3, first_index=1079))
    assert not (_rows(n.held_out) & _rows(n.train))


def test_the_config_field_holds_out_before_training_and_refuses_bad_values():
    data = build_data(compose_train(["experiment=digits_edm", "data.holdout=0.25"]))
    assert len(data.images.train) == 1079 and len(data.images.held_out) == 359
    assert build_data(compose_train(["experiment=digits_edm"])).images.held_out is None
    with pytest.raises(
        ValueError, match=r"^data.holdout must be a number in \(0.0, 1.0\); got 1.5"
    ):
        build_data(compose_train(["experiment=digits_edm", "data.holdout=1.5"]))
    with pytest.raises(ValueError, match="^data.holdout must be a fraction leaving both sides"):
        build_data(compose_train(["experiment=digits_edm", "data.holdout=0.0001"]))
