"""``experiments.reproduce table=cfdm table.scale=smoke`` end to end (about a minute)."""

from __future__ import annotations

import csv

import pytest
from entry_helpers import run_inprocess


@pytest.mark.slow
def test_cfdm_table_smoke(tmp_path):
    r = run_inprocess("reproduce", "table=cfdm", "table.scale=smoke", f"hydra.run.dir={tmp_path}")
    assert r.code == 0, r.stderr
    for f in ("cfdm.md", "cfdm_sweep.csv", "cfdm_nn_vs_exact.csv", "figure.png", "metadata.json"):
        assert (tmp_path / f).is_file(), f
    rows = list(csv.DictReader((tmp_path / "cfdm_nn_vs_exact.csv").open()))
    assert [r["data"] for r in rows] == ["moons", "digits"]
    obj = list(csv.DictReader((tmp_path / "cfdm_objective.csv").open()))
    assert len(obj) == 3 and obj[2]["model"].startswith("sigma-CFDM")
    for row in rows:  # the NN estimator is within the noise floor of the exact sampler
        assert float(row["W2(NN, exact)"]) <= float(row["W2(exact, exact') floor"])


def test_bad_scale_is_refused():
    r = run_inprocess("reproduce", "table=cfdm", "table.scale=tiny")
    assert r.code == 2 and "table.scale must be 'full' or 'smoke'" in r.stderr
