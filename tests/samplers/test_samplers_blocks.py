"""A per-example source through the driver's CPU blocks: each example's result depends on the
key and its global index only, never on its batch or block (issue 36, item 0)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from scorelib.processes import EDM
from scorelib.samplers import driver, edm_grid, get_sampler
from scorelib.scores import EmpiricalScore, ScoreSource, SmoothedScore

TRAIN = np.random.default_rng(0).normal(size=(12, 2))


class Wrapper(ScoreSource):
    """A source holding another as a field."""

    inner: Any = None


def smoothed():
    tab = EmpiricalScore.create(EDM(sigma_max=5.0), TRAIN, chunk=8)
    return SmoothedScore.create(tab, sigma_s=0.3, M=2)


@pytest.mark.parametrize("name", ["heun", "euler_maruyama"])
def test_batches_of_one_and_seven_in_blocks_of_three(monkeypatch, name):
    """Batch 7 with blocks of 3 (two blocks and a remainder of 1) against seven batches of
    one; and against one block of 7. The smoothing acts (sigma_s 0.3), so an example bound
    to another example's draws would differ."""
    sampler, src, key = get_sampler(name), smoothed(), jax.random.key(3)
    grid = edm_grid(3, 0.01, 5.0)
    monkeypatch.setattr(driver, "CPU_CHUNK", 3)
    blocks, _ = sampler(src, key, (7, 2), grid=grid, first_index=5)
    ones = [sampler(src, key, (1, 2), grid=grid, first_index=5 + i)[0] for i in range(7)]
    monkeypatch.setattr(driver, "CPU_CHUNK", None)
    whole, _ = sampler(src, key, (7, 2), grid=grid, first_index=5)
    np.testing.assert_allclose(np.asarray(blocks), np.concatenate(ones), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(blocks), np.asarray(whole), rtol=1e-5, atol=1e-6)
    exact, _ = sampler(src.estimator, key, (7, 2), grid=grid, first_index=5)
    assert not np.allclose(np.asarray(whole), np.asarray(exact), atol=1e-3)  # smoothing acts


def test_a_batch_above_the_default_block_size():
    """The case of the report: batch 1,100 with the default blocks of 1,024 raised "keys must
    be one key per example of the batch (1024)"; its last examples equal a batch of 4."""
    sampler, src, key = get_sampler("heun"), smoothed(), jax.random.key(0)
    grid = edm_grid(2, 0.01, 5.0)
    assert driver.CPU_CHUNK is None or driver.CPU_CHUNK < 1100
    big, _ = sampler(src, key, (1100, 2), grid=grid)
    tail, _ = sampler(src, key, (4, 2), grid=grid, first_index=1096)
    np.testing.assert_allclose(np.asarray(big)[-4:], np.asarray(tail), rtol=1e-5, atol=1e-6)


def test_classifier_free_guidance_halves_the_blocks(monkeypatch):
    """CFG's batched call puts 2 x block examples through the network, so its blocks are
    half as large (``cpu_chunk``); a source holding it passes the multiple on, a separate
    guide (two calls) keeps the blocks. Its samples in blocks equal those of one block."""
    from scorelib.scores import GaussianScore, Labels, PerClassScore  # noqa: PLC0415
    from scorelib.scores.guidance import ClassifierFreeGuidance  # noqa: PLC0415

    means = np.array([[-1.0, 0.0], [1.0, 0.5]])
    exact = PerClassScore.create(
        [GaussianScore.from_covariance(EDM(), m, 0.2 * np.eye(2)) for m in means]
    )
    cfg = ClassifierFreeGuidance.create(exact, scale=2.0).conditioned(Labels.balanced(2))
    separate = ClassifierFreeGuidance.create(
        exact, scale=2.0, guide=GaussianScore.from_covariance(EDM(), np.zeros(2), np.eye(2))
    )
    assert exact.batch_multiple() == 1 and cfg.batch_multiple() == 2
    assert separate.batch_multiple() == 1
    assert Wrapper(process=EDM(), inner=cfg).batch_multiple() == 2
    assert smoothed().batch_multiple() == 1
    monkeypatch.setattr(driver, "CPU_CHUNK", 6)
    assert driver.cpu_chunk(cfg) == 3 and driver.cpu_chunk(separate) == 6
    monkeypatch.setattr(driver, "CPU_CHUNK", 1)
    assert driver.cpu_chunk(cfg) == 1
    sampler, key, grid = get_sampler("heun"), jax.random.key(1), edm_grid(3, 0.01, 5.0)
    monkeypatch.setattr(driver, "CPU_CHUNK", 6)
    blocks, _ = sampler(cfg, key, (7, 2), grid=grid)
    monkeypatch.setattr(driver, "CPU_CHUNK", None)
    whole, _ = sampler(cfg, key, (7, 2), grid=grid)
    np.testing.assert_allclose(np.asarray(blocks), np.asarray(whole), rtol=1e-5, atol=1e-6)
