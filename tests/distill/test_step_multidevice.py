"""The distillation step on 4 (forced CPU) devices with the batch split along ``data``:
the compiled step all-reduces, the per-example arrays are split, and every metric and the
new state are the one-device step's up to the order of the reductions.

JAX fixes its device count at start-up, so the check runs in a fresh subprocess.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scorelib.parallel import forced_devices_env

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from scorelib import distill, parallel
    from scorelib.data.targets import GaussianMixtureTarget
    from scorelib.nets import MLP
    from scorelib.processes import EDM
    from scorelib.training import EMA

    assert jax.device_count() == 4, jax.devices()
    w = np.linspace(0.02, 0.3, 4)
    target = GaussianMixtureTarget.create(
        w, [[1.0, 0], [-1, 0], [0, 1], [0, -1]], stds=np.full(4, 0.2))
    model = MLP((2,), width=16, depth=1, emb_dim=8, rngs=nnx.Rngs(0))
    gd, p_model = nnx.split(model, nnx.Param)
    disc = distill.Discriminator(
        [(16,)], 8, MLP((2,), width=16, depth=1, emb_dim=8, rngs=nnx.Rngs(2)), rngs=nnx.Rngs(1))
    gdd, p_disc = nnx.split(disc, nnx.Param)
    cfg = distill.DistillConfig(divergence="kl", student_every=2, r1_weight=1.0)
    opts = {k: distill.make_optimizer(1e-3, 0.01) for k in distill.PARTS}
    params = {"student": p_model, "fake": p_model, "disc": p_disc}
    batch = lambda i: target.batch(16, seed=0, step=i)
    mesh = parallel.make_mesh()

    def run(sharded):
        teacher = target.noisy_score(EDM())
        state = distill.init_distill_state(params, opts, cfg, seed=0)
        if sharded:
            state, teacher = parallel.shard(state, mesh), parallel.shard(teacher, mesh)
        step = distill.make_distill_step(
            teacher, distill.Networks(gd, gdd, None, 1.0), cfg, opts,
            EMA(batch_size=16, decay=0.9), batch, 16, (2,),
            batch_sharding=parallel.batch_sharding(mesh) if sharded else None)
        hlo = step.critic.lower(state).compile().as_text()  # the loop runs the branches
        out = []
        for i in range(4):
            state, m = step(state, i)
            out.append({k: float(v) for k, v in jax.device_get(m).items()})
        return out, parallel.to_host(state), hlo, state

    one, s1, hlo1, _ = run(False)
    many, s4, hlo4, dev_state = run(True)
    assert "all-reduce" in hlo4 and "all-reduce" not in hlo1
    assert len(dev_state.params["student"]["out"]["kernel"].value.devices()) == 4  # replicated
    assert [m["student_step"] for m in many] == [1, 0, 1, 0]
    for a, b in zip(one, many):
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=3e-5, atol=1e-6, err_msg=k)
    for x, y in zip(jax.tree.leaves(s1), jax.tree.leaves(s4)):
        np.testing.assert_allclose(np.asarray(y, np.float64), np.asarray(x, np.float64),
                                   rtol=1e-4, atol=1e-6)
    print("OK")
    """
)


@pytest.mark.slow
def test_distill_step_on_4_devices_is_the_one_device_step():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=forced_devices_env(4, PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
