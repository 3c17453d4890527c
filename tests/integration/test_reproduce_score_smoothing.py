"""End to end: ``python -m experiments.reproduce table=score_smoothing table.scale=smoke`` (a
network on four points of a line, the smoothed and exact empirical scores' ODEs from the
noised points; writer, figure) and its one-line refusals."""

import pytest
from entry_helpers import assert_table_refused, smoke_table

pytestmark = pytest.mark.slow


def test_score_smoothing_smoke(tmp_path):
    _, res = smoke_table("score_smoothing", ("summary",), tmp_path / "run")
    rows = {r["row"]: r for r in res}
    assert set(rows) == {
        "smoothed, kappa 0",
        "smoothed, kappa 1",
        "exact empirical score",
        "network, ODE from sigma0",
        "network, its sampler from sigma_max",
    }
    assert rows["exact empirical score"]["between"] == 0.0  # memorisation
    # kappa 0 keeps the start law along the line: most of it between the points
    assert rows["smoothed, kappa 0"]["between"] > rows["smoothed, kappa 1"]["between"] > 0.0
    assert rows["smoothed, kappa 0"]["distance"] < 1e-3  # the ODE collapses onto the line
    kappa = rows["network, ODE from sigma0"].get("kappa_eff")  # absent: outside the model
    assert kappa is None or 0.0 <= kappa < 2.5


@pytest.mark.parametrize(
    "override,needle",
    [
        ("table.smoke.kappas=[3.0]", "table.kappas must be a number in [0.0, 2.49"),
        ("table.sigma0=0", "table.sigma0 must be a number in (0.0, inf)"),
        ("table.tol=0", "table.tol must be a number in (0.0, inf)"),
    ],
)
def test_score_smoothing_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path, "score_smoothing", override, needle)
