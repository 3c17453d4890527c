"""End to end: ``python -m experiments.reproduce table=gaussian_teleport table.scale=smoke``
(trains a tiny digits model, runs parts (a) and (b) at smoke size) and the CIFAR-10
table's fail-fast path through the real command line."""

import pytest
from entry_helpers import reproduce

pytestmark = pytest.mark.slow


def test_gaussian_teleport_smoke(tmp_path):
    run_dir = tmp_path / "run"
    p = reproduce(
        "table=gaussian_teleport",
        "table.scale=smoke",
        f"hydra.run.dir={run_dir}",
        timeout=300,
    )
    assert p.code == 0, p.stderr[-3000:]
    files = {f.suffix for f in run_dir.rglob("*") if f.is_file()}
    assert {".md", ".csv", ".tex", ".png", ".json"} <= files, sorted(files)
    md = "\n".join(f.read_text() for f in run_dir.rglob("*.md"))
    # the models trained here are named relative to the table's directory (no machine paths)
    assert f"{run_dir}/models" not in md and "models/" in md
    for needle in (
        "sigma_skip",
        "FD mean",
        "training set (exact)",
        "largest skip, paired FD (rise <= 2 se)",
        "unpaired rule's skip",
        "isotropic",
        "paired C2ST vs k=0",
        "largest skip not told apart (paired C2ST p >= 0.05)",
        "paper",
        "table=gaussian_teleport",
    ):
        assert needle in md, needle


def test_cifar10_table_fails_fast_without_inputs(tmp_path):
    p = reproduce(
        "table=gaussian_teleport_cifar10",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=120,
    )
    assert p.code != 0
    assert "table.data_path is required" in p.stderr + p.stdout
    p = reproduce(
        "table=gaussian_teleport_cifar10",
        f"table.data_path={tmp_path}/none.npz",
        f"table.checkpoint={tmp_path}",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=120,
    )
    assert p.code != 0
    assert "none.npz: no such file" in p.stderr + p.stdout
