"""experiments.reconstruct end to end on a tiny trained digits run (and a flat toy run):
the files and their shapes, finite metrics, noiseless inpainting by projection keeping the
measured pixels exactly, the figure, the run metadata, measurements read back from
measurements.npz giving the same reconstructions, a stacked measurement and DDRM on the
blur."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from entry_helpers import TOY_STEPS, copy_run, run_inprocess
from omegaconf import OmegaConf

N, DRAWS = 4, 3
BASE = [f"task.num_images={N}", f"task.draws={DRAWS}"]


def _out(run_dir, name):
    (out,) = (run_dir / "reconstructions" / "step2").glob(name)
    return out


@pytest.mark.slow  # about 30 s on 2 busy cores: three commands on a tiny run
def test_reconstruct_digits_writes_everything(tiny_digits_run, tmp_path):
    from experiments.runs.layout import display_path

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_digits_run, run_dir)
    args = [
        f"run_dir={run_dir}",
        "task=inpaint_random",
        "task.sigma_y=0",
        "task.keep=0.5",
        "method.names=[projection,pigdm,ddrm]",
        *BASE,
    ]
    r = run_inprocess("reconstruct", *args)
    assert r.code == 0, r.stderr[-3000:]
    name = (
        f"inpaint_random_heun_2_n{N}x{DRAWS}_seed0+methods-projection_pigdm_ddrm+keep-0.5"
        "+sigma_y-0+sigma_min-0.1"
    )
    out = _out(run_dir, name)
    assert f"reconstructions: {display_path(out)}" in r.stdout
    assert "| projection |" in r.stdout and "| ddrm |" in r.stdout  # the table printed
    files = {p.name for p in out.iterdir()}
    assert files == {
        "measurements.npz",
        "reconstructions_projection.npz",
        "reconstructions_pigdm.npz",
        "reconstructions_ddrm.npz",
        "metrics.json",
        "metrics.md",
        "figure.png",
        "config.yaml",
        "run_info.json",
    }
    meas = np.load(out / "measurements.npz")
    mask = meas["mask"]
    assert mask.shape == (8, 8, 1) and mask.sum() == 32  # half the 64 pixels
    x0 = meas["x0"]
    assert x0.shape == (N, 8, 8, 1) and meas["y"].shape == (N, 32)
    np.testing.assert_array_equal(meas["y"], x0.reshape(N, -1)[:, mask.reshape(-1)])  # noiseless
    assert json.loads(str(meas["operator"]))["operator"] == "Inpainting"
    for method in ("projection", "pigdm", "ddrm"):
        rec = np.load(out / f"reconstructions_{method}.npz")
        x = rec["reconstructions"]
        assert x.shape == (N, DRAWS, 8, 8, 1) and np.all(np.isfinite(x)), method
        assert rec["mean"].shape == rec["std"].shape == (N, 8, 8, 1)
    # projection with sigma_y = 0 puts the measured pixels back exactly (float rounding)
    x = np.load(out / "reconstructions_projection.npz")["reconstructions"]
    kept = x.reshape(N, DRAWS, -1)[:, :, mask.reshape(-1)]
    np.testing.assert_allclose(kept, np.broadcast_to(meas["y"][:, None], kept.shape), atol=1e-5)
    # ddrm with eta_b = 1 and sigma_y = 0 also returns the measurement on the measured pixels
    x = np.load(out / "reconstructions_ddrm.npz")["reconstructions"]
    kept = x.reshape(N, DRAWS, -1)[:, :, mask.reshape(-1)]
    np.testing.assert_allclose(kept, np.broadcast_to(meas["y"][:, None], kept.shape), atol=1e-4)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_images"] == N and metrics["draws"] == DRAWS
    assert metrics["checkpoint_step"] == 2 and metrics["sampler"]["name"] == "heun"
    for method, row in metrics["methods"].items():
        for key in ("psnr_mean", "psnr_draw", "ssim_mean", "ssim_draw", "coverage"):
            assert np.all(np.isfinite(row[key])), (method, key, row[key])
        assert 0 <= row["coverage"][0] <= 1 and row["nfe"] >= 1 and row["wall_s"] > 0
        assert np.all(np.isfinite(row["posterior_std"] + row["consistency_draws"]))
    assert metrics["methods"]["projection"]["consistency_draws"][0] < 1e-5
    assert metrics["measurement"]["consistency_truth"] == [0.0, 0.0]
    assert "| pigdm |" in (out / "metrics.md").read_text()
    assert (out / "figure.png").stat().st_size > 5_000
    cfg = OmegaConf.load(out / "config.yaml")
    assert cfg.task.keep == 0.5 and cfg.sampler.name == "heun" and cfg.method.sigma_data == 0.5
    info = json.loads((out / "run_info.json").read_text())
    assert info["seed"] == 0 and info["launches"][0]["git"]
    assert "task=inpaint_random" in info["launches"][0]["command"]

    # the written measurements read back: the same reconstructions, in another directory
    again = run_inprocess(
        "reconstruct",
        *args[:4],
        "method.names=[projection]",
        *BASE,
        f"task.measurements={out / 'measurements.npz'}",
    )
    assert again.code == 0, again.stderr[-3000:]
    other = _out(run_dir, "inpaint_random_*+methods-projection+*+measurements-measurements~*")
    np.testing.assert_array_equal(
        np.load(other / "reconstructions_projection.npz")["reconstructions"],
        np.load(out / "reconstructions_projection.npz")["reconstructions"],
    )

    # several measurements in one posterior (sensors: CG solves), DPS, another sampler
    r = run_inprocess(
        "reconstruct",
        f"run_dir={run_dir}",
        "task=sensors",
        "method.names=[dps,pigdm]",
        "method.zeta=10",
        "sampler=dpmpp_2m",
        "sampler.steps=3",
        *BASE,
    )
    assert r.code == 0, r.stderr[-3000:]
    out = _out(run_dir, "sensors_dpmpp_2m_3_*")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["measurement"]["m"] == 16 + 6  # 4x4 low-resolution pixels and 6 points
    assert set(metrics["methods"]) == {"dps", "pigdm"}
    for row in metrics["methods"].values():
        assert np.all(np.isfinite(row["psnr_mean"] + row["coverage"] + row["ssim_draw"]))
    assert np.load(out / "measurements.npz")["sigma_y"].shape == (22,)

    # DDRM on the blur (its Kronecker SVD)
    r = run_inprocess(
        "reconstruct", f"run_dir={run_dir}", "task=blur", "method.names=[ddrm]", *BASE
    )
    assert r.code == 0, r.stderr[-3000:]
    out = _out(run_dir, "blur_heun_2_*methods-ddrm*")
    row = json.loads((out / "metrics.json").read_text())["methods"]["ddrm"]
    assert row["nfe"] >= 1 and np.all(np.isfinite(row["psnr_mean"] + row["coverage"]))
    x = np.load(out / "reconstructions_ddrm.npz")["reconstructions"]
    assert x.shape == (N, DRAWS, 8, 8, 1) and np.all(np.isfinite(x))


@pytest.mark.slow  # about 10 s once the session's toy run is trained
def test_reconstruct_flat_data(toy_run, tmp_path):
    run_dir = copy_run(toy_run, tmp_path / "toy")
    r = run_inprocess(
        "reconstruct", f"run_dir={run_dir}", "task=cs", "method.names=[projection,pigdm]", *BASE
    )
    assert r.code == 0, r.stderr[-3000:]
    (out,) = (run_dir / "reconstructions" / f"step{TOY_STEPS}").glob(
        f"cs_euler_maruyama_100_n{N}x{DRAWS}_seed0+methods-projection_pigdm+m-1+*"
    )
    meas = np.load(out / "measurements.npz")
    assert meas["x0"].shape == (N, 2) and meas["y"].shape == (N, 1)
    x = np.load(out / "reconstructions_pigdm.npz")["reconstructions"]
    assert x.shape == (N, DRAWS, 2) and np.all(np.isfinite(x))
    row = json.loads((out / "metrics.json").read_text())["methods"]["pigdm"]
    assert "ssim_mean" not in row and np.all(np.isfinite(row["psnr_mean"] + row["coverage"]))
    assert (out / "figure.png").stat().st_size > 5_000
