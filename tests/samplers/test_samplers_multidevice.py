"""Samplers on several devices: a starting batch sharded over 4 (fake CPU) devices
stays sharded through every sampler (no gather to one device, no host round trip) and
gives the samples of one device.

JAX fixes its device count at start-up, so the check runs in a fresh subprocess with
``--xla_force_host_platform_device_count=4`` (infrastructure notes).
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_sharded_batch_gives_the_single_device_samples(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
