"""End to end: ``python -m experiments.reproduce table=inverse_gaussian table.scale=smoke``
(the exact posterior, projection, DPS, PiGDM and DDRM on the isotropic Gaussian prior, random
inpainting and a stacked sensors measurement, and noiseless random inpainting; floors, writer,
figures) and its one-line refusals before anything is computed."""

import pytest
from entry_helpers import assert_table_refused, smoke_table

pytestmark = pytest.mark.slow


def test_inverse_gaussian_smoke(tmp_path):
    run_dir = tmp_path / "run"
    meta, res = smoke_table("inverse_gaussian", ("summary", "dps_sweep"), run_dir)
    assert (run_dir / "w2.png").stat().st_size > 5_000
    assert meta["seeds"] == [0]
    recs = res["records"]
    by = {(r["operator"], r["method"], r["zeta"]): r for r in recs}
    ops = ("random", "sensors", "random, sigma_y = 0")
    assert {r["operator"] for r in recs} == set(ops) and {r["prior"] for r in recs} == {"isotropic"}
    for op in ops:
        ddrm = op != "sensors"  # the stacked measurement has no SVD
        want = {"exact", "projection", "pigdm", "dps"} | ({"ddrm"} if ddrm else set())
        assert {m for o, m, _ in by if o == op} == want, op
        assert {z for o, m, z in by if o == op and m == "dps"} == {10.0, 100.0}
        exact = by[(op, "exact", None)]
        # heun with 4 steps: 7 source calls (DDRM: 4)
        assert exact["nfe"] == 7 and (not ddrm or by[(op, "ddrm", None)]["nfe"] == 4)
        assert exact["floor_w2"] > 0 and exact["floor_w2_std"] >= 0
        for r in recs:
            assert r["num_nonfinite"] == 0 and 0 <= r["coverage"] <= 1
        # PiGDM with sigma_data^2 = c on N(mu, c I) is the exact posterior score: the same
        # draws as the exact source (same keys, same sampler), whatever the step count
        pigdm = by[(op, "pigdm", None)]
        for k in ("w2", "rel_mean_error", "std_error", "std_ratio"):
            assert pigdm[k] == pytest.approx(exact[k], rel=1e-5), (op, k)
    # noiseless inpainting of an isotropic prior: projection's denoiser is the exact one
    noiseless = by[("random, sigma_y = 0", "projection", None)]
    assert noiseless["w2"] == pytest.approx(
        by[("random, sigma_y = 0", "exact", None)]["w2"], rel=1e-5
    )
    assert noiseless["sigma_y"] == 0.0 and by[("sensors", "exact", None)]["sigma_y"] == "0.05/0.01"
    # the summary keeps DPS at its best zeta, the sweep every zeta
    summary = (run_dir / "inverse_gaussian_summary.md").read_text()
    assert "DPS (best zeta" in summary and "W2 floor" in summary
    assert (run_dir / "inverse_gaussian_dps_sweep.csv").read_text().count("\n") == 1 + 2 * 3
    assert str(tmp_path) not in (run_dir / "results.json").read_text()
    notes = (run_dir / "inverse_gaussian.md").read_text()
    assert "PiGDM: exact for an isotropic prior" in notes and "best zeta" in notes


@pytest.mark.parametrize(
    "override,needle",
    [
        ("table.scale=full", "table.scale must be 'small' or 'smoke'; got 'full'"),
        ("table.smoke.priors=[digits,laplace]", "table.priors must be a list of distinct names"),
        ("table.smoke.operators=[random,random]", "table.operators must be a list of distinct"),
        ("table.smoke.noiseless_operators=[denoise]", "operators other than denoise"),
        ("table.smoke.priors=[digits]", "table.noiseless_operators must be empty unless"),
        ("table.sigma_y=0", "table.sigma_y must be a number in (0.0"),
        ("table.task.keep=0.0", "table.task.keep must be"),
        ("table.task.sensors.keep=0.0", "table.task.sensors.keep must be"),
        ("table.smoke.zetas=[]", "table.zetas must be a list of distinct numbers > 0"),
        ("table.smoke.steps=0", "table.steps must be"),
        ("table.sigma_min=-1.0", "table.sigma_min must be"),
        ("table.sampler=nope", "table.sampler: sampler.name must be one of"),
        ("table.smoke.figure_operator=blur", "table.figure_operator must be one of"),
        ("table.smoke.measurements=0", "table.measurements must be"),
        ("table.ddrm.eta=2.0", "table.ddrm.eta must be"),
    ],
)
def test_inverse_gaussian_refuses_bad_settings_in_one_line(tmp_path, override, needle):
    assert_table_refused(tmp_path / "run", "inverse_gaussian", override, needle)
    assert not (tmp_path / "run" / "results.json").exists()
