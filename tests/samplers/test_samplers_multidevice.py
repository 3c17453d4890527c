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
    grid = edm_grid(8)
    key = jax.random.key(1)
    x_T = np.asarray(jax.random.normal(jax.random.key(2), (16, 3))) * 80.0
    kws = {name: dict(grid=grid, **opts.get(name, {})) for name in SAMPLERS}

    # The single-device samples of every sampler: one compiled program per process.
    @jax.jit
    def single_device(src, key, x_T):
        return {k: fn(src, key, (16, 3), x_T=x_T, **kws[k])[0] for k, fn in SAMPLERS.items()}

    for proc in (EDM(), VP()):
        src = GaussianScore.from_covariance(proc, rng.normal(size=3), a @ a.T + 0.1 * np.eye(3))
        ones = single_device(src, key, x_T)
        assert len(ones["heun"].sharding.device_set) == 1
        for name, fn in SAMPLERS.items():
            kw, one = kws[name], ones[name]
            sharded = jax.device_put(x_T, NamedSharding(mesh, P("data")))
            many, _ = fn(src, key, (16, 3), x_T=sharded, **kw)
            assert len(many.sharding.device_set) == 4, (name, many.sharding)
            err = float(np.max(np.abs(np.asarray(many) - np.asarray(one))))
            scale = float(np.max(np.abs(np.asarray(one))))
            assert err <= 1e-5 * scale, (type(proc).__name__, name, err, scale)
            print(type(proc).__name__, name, "max abs difference", err)
    print("SHARDED OK")
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
    print("DRAW OK")
    """
)


@pytest.fixture(scope="module")
def four_devices():
    """One subprocess with 4 (fake CPU) devices runs both checks (one JAX start-up)."""
    env = forced_devices_env(4)
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-c", SCRIPT + DRAW],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_draw_samples_splits_each_batch_over_the_devices(four_devices):
    """``draw_samples(devices=...)``: every device draws its part of each batch; the samples
    are one device's, bit for bit (the same per-example keys and program shapes)."""
    proc = four_devices
    assert proc.returncode == 0 and "DRAW OK" in proc.stdout.splitlines(), proc.stdout + proc.stderr


@pytest.mark.slow
def test_sharded_batch_gives_the_single_device_samples(four_devices):
    proc = four_devices
    assert proc.returncode == 0 and "SHARDED OK" in proc.stdout.splitlines(), (
        proc.stdout + proc.stderr
    )
