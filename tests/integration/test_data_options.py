"""``data.dequantise``: the batches a run trains on, built from the config as training
builds them (no training)."""

from __future__ import annotations

import numpy as np
import pytest
from entry_helpers import ROOT
from hydra import compose, initialize_config_dir

from experiments import build
from experiments.schema import register_configs
from scorelib.data import get_batch, level_spacing


@pytest.mark.parametrize("dequantise", [False, True])
def test_data_dequantise_gives_batches_inside_each_grey_levels_bin(dequantise):
    """false: the training digits' own rows (on the 17 levels); true: the same rows plus
    noise inside each value's bin (|noise| <= delta / 2, off the levels)."""
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"data.dequantise={str(dequantise).lower()}"])
    data = build.build_data(cfg)
    assert data.dequantise is dequantise
    batch = np.asarray(data.batch_fn(64, seed=3)(np.int32(2)))
    rows = get_batch(data.images.train, 64, seed=3, step=2)
    delta = level_spacing(data.images.levels)
    if dequantise:
        assert np.all(np.abs(batch - rows) <= delta / 2 * (1 + 1e-4))
        assert np.mean(np.abs(batch - rows) > delta / 100) > 0.9
    else:
        np.testing.assert_array_equal(batch, rows)
