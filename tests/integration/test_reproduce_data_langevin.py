"""End to end: ``python -m experiments.reproduce table=data_langevin table.scale=smoke`` (a
vanilla network and a diffusion model of the langevin_gmm mixture, Langevin from the data and
from noise on the exact and the network's vanilla score; writer, figure) and its one-line
refusals."""

import pytest
from entry_helpers import assert_table_refused, smoke_table
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow


def test_data_langevin_smoke(tmp_path):
    run_dir = tmp_path / "run"
    _, res = smoke_table("data_langevin", ("summary",), run_dir)
    cfg = OmegaConf.load(run_dir / "runs/vanilla_seed0/config.yaml")
    assert cfg.objective._target_.endswith("DSM") and list(cfg.objective.t_range) == [0.25, 0.25]
    assert OmegaConf.load(run_dir / "runs/diffusion_seed0/config.yaml").objective._target_.endswith(
        "EDMLoss"
    )
    rows = {(r["score"], r.get("start"), r.get("K")): r for r in res}
    for score in ("exact", "network"):
        for K in (0, 5, 20):
            assert {(score, "data", K), (score, "noise", K)} <= set(rows)
        # step 0 is the start: copies of training examples, or the noise itself
        assert rows[(score, "data", 0)]["moved"] == 0 == rows[(score, "noise", 0)]["moved"]
    # the starts alone: the training examples carry the weights, N(0, 16 I) does not
    assert rows[("exact", "data", 0)]["tv"] < 0.15 < rows[("exact", "noise", 0)]["tv"]
    assert ("diffusion sampler", None, None) in rows and ("exact draws (floor)", None, None) in rows


@pytest.mark.parametrize(
    "override,needle",
    [
        ("table.smoke.stops=[5,0]", "table.stops must be strictly increasing integers >= 0"),
        ("table.step_size=0", "table.step_size must be a number in (0.0, inf)"),
        ('table.vanilla=["objective=edm"]', "table.vanilla must be overrides of DSM at one noise"),
        ("table.smoke.num_samples=0", "table.num_samples must be an integer"),
    ],
)
def test_data_langevin_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path, "data_langevin", override, needle)
