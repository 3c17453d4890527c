"""Samplers on several devices: a starting batch sharded over 4 (fake CPU) devices
stays sharded through every sampler (no gather to one device, no host round trip) and
gives the samples of one device.

JAX fixes its device count at start-up, so the check runs in a fresh subprocess with
``--xla_force_host_platform_device_count=4`` (infrastructure notes).
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scorelib.parallel import forced_devices_env

SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from scorelib.processes import EDM, VP
    from scorelib.samplers import SAMPLERS, edm_grid
    from scorelib.scores import GaussianScore

    assert jax.device_count() == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 3))
    opts = {"annealed_langevin": {"n_steps_each": 3}, "pc": {"n_corrector": 2}}
    for proc in (EDM(), VP()):
        src = GaussianScore.from_covariance(proc, rng.normal(size=3), a @ a.T + 0.1 * np.eye(3))
        grid = edm_grid(8)
        for name, fn in SAMPLERS.items():
            kw = dict(grid=grid, **opts.get(name, {}))
            key = jax.random.key(1)
            x_T = np.asarray(jax.random.normal(jax.random.key(2), (16, 3))) * 80.0
            one, _ = fn(src, key, (16, 3), x_T=x_T, **kw)
            sharded = jax.device_put(x_T, NamedSharding(mesh, P("data")))
            many, _ = fn(src, key, (16, 3), x_T=sharded, **kw)
            assert len(many.sharding.device_set) == 4, (name, many.sharding)
            err = float(np.max(np.abs(np.asarray(many) - np.asarray(one))))
            scale = float(np.max(np.abs(np.asarray(one))))
            assert err <= 1e-5 * scale, (type(proc).__name__, name, err, scale)
            print(type(proc).__name__, name, "max abs difference", err)
    print("OK")
    """
)


DRAW = textwrap.dedent(
    """
    import jax, numpy as np
    from scorelib.processes import EDM
    from scorelib.samplers import draw_samples, edm_grid, get_sampler
    from scorelib.scores import GaussianScore

    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 3))
    src = GaussianScore.from_covariance(EDM(), rng.normal(size=3), a @ a.T + 0.1 * np.eye(3))
    for name in ("heun", "euler_maruyama"):
        used = set()

        def sample(*args, fn=get_sampler(name), **kw):
            x, info = fn(*args, **kw)
            used.update(x.devices())
            return x, info

        kw = dict(num_samples=30, grid=edm_grid(6))
        key = jax.random.key(3)
        # batches of 16 over 4 devices: chunks of 4 (the last batch: 4, 4, 4, 2)
        devices = jax.devices()
        many, info = draw_samples(sample, src, key, (3,), batch_size=16, devices=devices, **kw)
        assert used == set(jax.devices()), (name, used)
        used.clear()
        one, _ = draw_samples(sample, src, key, (3,), batch_size=4, **kw)
        assert len(used) == 1, used
        assert many.shape == (30, 3) and info["num_samples"] == 30
        assert np.array_equal(many, one), (name, np.max(np.abs(many - one)))
        assert np.ptp(many[:, 0]) > 0.1  # real samples, not a constant
    print("OK")
    """
)


def _run(script):
    env = forced_devices_env(4)
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_draw_samples_splits_each_batch_over_the_devices():
    """``draw_samples(devices=...)``: every device draws its part of each batch; the samples
    are one device's, bit for bit (the same per-example keys and program shapes)."""
    proc = _run(DRAW)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


@pytest.mark.slow
def test_sharded_batch_gives_the_single_device_samples():
    proc = _run(SCRIPT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
