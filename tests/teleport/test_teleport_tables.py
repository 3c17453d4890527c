"""The gaussian_teleport tables' pure helpers and the CIFAR-10 table's fail-fast checks."""

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments.tables import gaussian_teleport as gt
from experiments.tables import gaussian_teleport_cifar10 as gc

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "table"


def row(k, nfe, m, s):
    return {"skip": k, "sigma_skip": 80.0 / (k + 1), "nfe": nfe, "fd_mean": m, "fd_std": s}


def test_largest_safe_skip_is_contiguous_from_zero():
    rows = [
        row(0, 35, 10.0, 1.0),
        row(1, 33, 10.5, 2.0),
        row(2, 31, 10.9, 0.1),
        row(3, 29, 11.5, 0.1),
        row(4, 27, 10.2, 0.1),
    ]  # k = 4 is below the limit again
    s = gt.largest_safe_skip(rows)
    assert s["skip"] == 2 and s["nfe"] == 31 and s["fd_limit"] == 11.0
    assert s["nfe_saved"] == pytest.approx(4 / 35)
    assert gt.largest_safe_skip([row(0, 35, 10.0, 0.0), row(1, 33, 10.1, 0.0)])["skip"] == 0


def test_largest_indistinguishable_skip_is_contiguous_from_zero():
    ps = [1.0, 0.4, 0.06, 0.01, 0.5]  # k = 3 is told apart; k = 4 is not, but comes after
    rows = [{"skip": k, "nfe": 35 - 2 * k, "c2st_p": p} for k, p in enumerate(ps)]
    s = gt.largest_indistinguishable_skip(rows[::-1])
    assert s == {"skip": 2, "nfe": 31, "nfe_saved": pytest.approx(4 / 35)}
    assert gt.largest_indistinguishable_skip(rows, alpha=0.5)["skip"] == 0
    assert gt.largest_indistinguishable_skip(rows, alpha=0.005)["skip"] == 4


def test_largest_paired_skip_reads_the_per_seed_differences():
    """The MNIST Heun-18 case of issue 41: skip 7's mean FD is within one std of k = 0's over
    seeds, but every seed rises (+4.3 +- 1.2): the paired rule stops before it."""
    fd0 = [100.0, 110.0, 120.0]  # a large spread over seeds, shared by every skip
    seeds = {0: fd0, 1: [99.0, 111.0, 119.5], 2: [100.5, 109.0, 121.0], 3: [104.0, 113.0, 126.0]}
    rows = [{"skip": k, "nfe": 35 - 2 * k, "fd_seeds": v} for k, v in seeds.items()]
    s = gt.largest_paired_skip(rows[::-1])
    d2 = np.array(seeds[2]) - fd0  # +0.5, -1, +1: mean 0.17, se 0.6
    assert s["skip"] == 2 and s["nfe_saved"] == pytest.approx(4 / 35)
    assert s["rise"] == pytest.approx(d2.mean())
    assert s["rise_se"] == pytest.approx(d2.std(ddof=1) / np.sqrt(3))
    # the unpaired rule, on the same numbers, accepts skip 3 (mean 114.3 <= 110 + 10)
    unpaired = [
        {
            "skip": k,
            "sigma_skip": 1.0,
            "nfe": 35 - 2 * k,
            "fd_mean": np.mean(v),
            "fd_std": np.std(v, ddof=1),
        }
        for k, v in seeds.items()
    ]
    assert gt.largest_safe_skip(unpaired)["skip"] == 3
    one = [{"skip": 0, "nfe": 9, "fd_seeds": [5.0]}, {"skip": 1, "nfe": 8, "fd_seeds": [5.1]}]
    assert gt.largest_paired_skip(one)["skip"] == 0  # one seed: any rise fails


def test_settings_merge_smoke_and_validate():
    cfg = OmegaConf.load(CONFIGS / "gaussian_teleport.yaml")
    full = gt._settings(cfg)
    assert list(full.datasets) == ["digits", "mnist"] and full.num_samples == 1000
    assert full.sweeps[0].steps == 18 and list(full.sweeps[0].skips) == list(range(9))
    assert full.data.digits.checkpoint is None
    cfg.scale = "smoke"
    cfg.checkpoint = "/some/run"
    smoke = gt._settings(cfg)
    assert list(smoke.datasets) == ["digits"] and smoke.num_samples < 1000
    assert smoke.data.digits.checkpoint == "/some/run"  # the alias still reaches the data entry
    bad = OmegaConf.load(CONFIGS / "gaussian_teleport.yaml")
    bad.sweeps[0].skips = [1, 2]
    with pytest.raises(ValueError, match="must include 0"):
        gt._settings(bad)
    bad = OmegaConf.load(CONFIGS / "gaussian_teleport.yaml")
    bad.explained_query = "val"
    with pytest.raises(ValueError, match="table.explained_query must be one of"):
        gt._settings(bad)
    bad = OmegaConf.load(CONFIGS / "gaussian_teleport.yaml")
    bad.scale = "huge"
    with pytest.raises(ValueError, match="table.scale"):
        gt._settings(bad)


def test_digits_table_refuses_a_missing_checkpoint(tmp_path):
    cfg = OmegaConf.load(CONFIGS / "gaussian_teleport.yaml")
    cfg.checkpoint = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"table.data.digits.checkpoint=.*nope"):
        gt.compute(cfg, tmp_path)


def cifar_cfg(**kw):
    cfg = OmegaConf.load(CONFIGS / "gaussian_teleport_cifar10.yaml")
    for k, v in kw.items():
        cfg[k] = v
    return cfg


def test_cifar_table_fails_fast_naming_the_missing_input(tmp_path):
    with pytest.raises(ValueError, match=r"table.data_path is required.*uint8 NHWC"):
        gc.compute(cifar_cfg(checkpoint=str(tmp_path)), tmp_path)
    npz = tmp_path / "c.npz"
    np.savez(npz, images=np.zeros((2, 32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match=r"table.checkpoint is required.*experiments.train"):
        gc.compute(cifar_cfg(data_path=str(npz)), tmp_path)
    with pytest.raises(FileNotFoundError, match=r"table.data_path=.*missing.npz: no such file"):
        gc.compute(
            cifar_cfg(data_path=str(tmp_path / "missing.npz"), checkpoint=str(tmp_path)), tmp_path
        )
    with pytest.raises(FileNotFoundError, match=r"table.checkpoint=.*no config.yaml"):
        gc.compute(cifar_cfg(data_path=str(npz), checkpoint=str(tmp_path / "run")), tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("name: x\n")
    with pytest.raises(FileNotFoundError, match=r"no checkpoints/ directory"):
        gc.compute(cifar_cfg(data_path=str(npz), checkpoint=str(tmp_path / "run")), tmp_path)


def test_cifar_feature_option():
    name, f = gc.feature_function("pixels")
    assert name == "pixels" and f(np.zeros((3, 4, 4, 3))).shape == (3, 48)
    name, f = gc.feature_function("numpy:ravel")
    assert name == "numpy:ravel"
    with pytest.raises(ValueError, match="table.features"):
        gc.feature_function("inception")
    with pytest.raises(ValueError, match="cannot import"):
        gc.feature_function("no_such_module_xyz:f")
