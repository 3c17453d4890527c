"""table=sure_reconstruct's reading rules (the gap share, a resolved gap, the verdict) against
hand-computed values, and its priors kept equal to table=sure's."""

import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments.common import CONFIG_DIR
from experiments.tables.sure_reconstruct import gap_share, resolved_gap, verdict


def test_gap_share_by_hand():
    assert gap_share(20.0, 16.0, 19.0) == pytest.approx(0.75)
    assert gap_share(20.0, 16.0, 15.0) == pytest.approx(-0.25)  # worse than the naive prior
    assert gap_share(20.0, 16.0, 21.0) == pytest.approx(1.25)  # better than the clean one
    assert math.isnan(gap_share(16.0, 16.0, 18.0)) and math.isnan(gap_share(15.0, 16.0, 18.0))


def test_resolved_gap_is_two_standard_errors_of_the_paired_difference():
    naive = np.zeros(4)
    d = np.array([1.0, 2.0, 3.0, 4.0])  # mean 2.5, std 1.29, s.e. 0.645: 2.5 > 1.29
    assert resolved_gap(naive + d, naive)
    d = np.array([-1.0, 0.5, 0.5, 1.0])  # mean 0.25, s.e. 0.43: not resolved
    assert not resolved_gap(naive + d, naive)
    assert not resolved_gap(naive, naive + 1.0 + np.arange(4))  # the clean prior is worse


def test_verdict_reads_every_seed():
    ok = [True, True, True]
    assert verdict([0.8, 0.6, 0.9], ok, 0.5).startswith("holds")
    assert verdict([0.2, -0.1, 0.4], ok, 0.5).startswith("fails")
    assert verdict([0.8, 0.2, 0.9], ok, 0.5).startswith("mixed")
    assert verdict([0.8, 0.6, 0.9], [True, False, True], 0.5).startswith("no gap")
    assert verdict([0.8, math.nan, 0.9], ok, 0.5).startswith("no gap")


def test_priors_are_the_committed_recipe_through_table_sure_models():
    """sure_reconstruct's priors: table=sure's model list read from its own config (one
    SURE-Score model, the committed recipe with x_hat through stop_gradient)."""
    from experiments.tables import sure

    tc = OmegaConf.load(CONFIG_DIR / "table/sure_reconstruct.yaml")
    got = sure.models(tc, 0)
    labels = [label for _, label in got]
    assert labels.count(sure.SURE) == len(tc.noise_levels)
    name, overrides = got[(0.5, sure.SURE)]
    assert name == "sure_0.5_seed0" and "objective.dsm_into_denoiser=false" in overrides


def test_a_run_directory_with_override_characters_composes(tmp_path):
    """A table's run directory is named by its overrides (`[`, `]`, `=`, `,`, quotes):
    experiments.reconstruct must still read it as one run_dir."""
    from hydra import initialize_config_dir

    from experiments.tables.sure_reconstruct import reconstruct_config

    odd = tmp_path / "table.overrides=['a=b',x]+seeds=[0,1]" / "runs" / "it's"
    tc = OmegaConf.load(CONFIG_DIR / "table/sure_reconstruct.yaml")
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        rc = reconstruct_config(odd, tc, "cs")
    assert rc.run_dir == str(odd)
