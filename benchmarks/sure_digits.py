"""SURE-Score on noisy digits: does SURE lower the denoiser's error on CLEAN held-out digits?

The 8x8 digits' training split is corrupted once, ``y = x + sigma_n n``
(``scorelib.data.noisy_dataset``), at each ``--noise`` level; three small MLPs (the same
initialisation, steps and batches) are trained for ``--steps`` steps:

* ``sure``: ``scorelib.objectives.SURE`` on the noisy digits (never sees a clean one);
* ``dsm_noisy``: the EDM loss on the noisy digits (DSM trained directly on them);
* ``dsm_clean``: the EDM loss on the clean digits (the reference a clean data set allows).

Each is scored by its denoiser's mean squared error per pixel on the CLEAN test digits
(359), ``E |D(x + sigma z, sigma) - x|^2 / d`` over 8 draws of ``z`` per digit, at noise
levels ``sigma`` around ``sigma_n``: the mean over ``--seeds`` training seeds (network
initialisation and batches; the noisy set is one fixed draw) and, after +-, their standard
deviation. Also printed: the ``sure`` models' SURE at ``sigma_n`` (from noisy digits alone)
beside their error against the clean digits, on the noisy training copies they were trained
on and on freshly noised test digits. SURE is unbiased for a denoiser that does not depend
on the noise it is evaluated on; trained long enough on one fixed noisy copy of each of
1,438 digits, the network fits those copies (training SURE falls below zero towards
``-sigma_n^2`` per pixel) while its error on fresh noise grows: held-out SURE, from noisy
data alone, detects it. Wall time and load are printed; one process, CPU.

    .venv/bin/python benchmarks/sure_digits.py [--steps 400] [--noise 0.2 0.5] [--seeds 3]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scorelib import training
from scorelib.data import get_batch, load_digits, noisy_dataset
from scorelib.divergence import probe_vectors
from scorelib.nets import MLP
from scorelib.objectives import SURE, EDMLoss, sure_risk
from scorelib.processes import EDM

LEVELS = (0.05, 0.1, 0.2, 0.5, 1.0)  # noise levels of the evaluation (data units)


def train(objective, data, steps, batch_size, seed=0):
    """Train an MLP with ``objective`` on ``data`` (``[n, 8, 8, 1]``); the final params."""
    process = EDM()
    model = MLP((8, 8, 1), width=256, depth=3, rngs=nnx.Rngs(seed))
    optimizer = training.make_optimizer(1e-3, warmup_steps=50)
    graphdef, state = training.init_state(model, optimizer, seed)
    make_source = training.network_source(process, graphdef, 0.5)
    train_data = jnp.asarray(data)
    step = training.make_train_step(
        objective,
        make_source,
        optimizer,
        training.EMA(batch_size=batch_size, decay=0.0, warmup=False),
        lambda i: get_batch(train_data, batch_size, seed=seed, step=i),
    )
    for _ in range(steps):
        state, metrics = step(state)
    jax.block_until_ready(state)
    return make_source(state.params, None), {k: float(v) for k, v in metrics.items()}


@jax.jit
def clean_error(source, x, key, sigma):
    """Mean squared error per pixel of ``D(x + sigma z, sigma)`` against the clean ``x``."""
    z = jax.random.normal(key, (8, *x.shape))
    xs = jnp.reshape(x[None] + sigma * z, (-1, *x.shape[1:]))
    d = source.denoiser(xs, jnp.full((xs.shape[0],), sigma))
    return jnp.mean((d - jnp.reshape(jnp.broadcast_to(x[None], z.shape), xs.shape)) ** 2)


def sure_check(source, y, x, sigma_n, key):
    """The SURE estimate from the noisy ``y`` alone and the true error against the clean
    ``x``, per pixel, of the denoiser at ``sigma_n`` (4 Rademacher probes per example)."""
    probes = jax.vmap(lambda k: probe_vectors(k, 4, 64).reshape(4, 8, 8, 1))(
        jax.random.split(key, x.shape[0])
    )
    h, risk = sure_risk(
        lambda v: source.denoiser(v[None], jnp.asarray(sigma_n))[0], y, probes, sigma_n=sigma_n
    )
    return float(jnp.mean(risk) / 64), float(jnp.mean((h - x) ** 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--noise", type=float, nargs="+", default=[0.2, 0.5])
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    print(f"# jax {jax.__version__}, {jax.devices()[0].platform}; load {os.getloadavg()}")
    ds = load_digits()
    x_test = jnp.asarray(ds.test)
    key = jax.random.key(123)
    for sigma_n in a.noise:
        noisy = noisy_dataset(ds, sigma_n, seed=0)
        x_train, y_train = jnp.asarray(ds.train), jnp.asarray(noisy.train)
        y_test = x_test + sigma_n * jax.random.normal(jax.random.key(9), x_test.shape)
        runs = {
            "sure": (SURE(EDM(), sigma_n=sigma_n), noisy.train),
            "dsm_noisy": (EDMLoss(EDM()), noisy.train),
            "dsm_clean": (EDMLoss(EDM()), ds.train),
        }
        print(f"\n## sigma_n = {sigma_n}: {a.steps} steps, batch {a.batch_size}, {a.seeds} seeds")
        print("clean test digits, MSE per pixel of D(x + sigma z, sigma) against x\n")
        print("| trained | " + " | ".join(f"sigma {s}" for s in LEVELS) + " | train s |")
        print("|---" * (len(LEVELS) + 2) + "|")
        checks = []
        for name, (obj, data) in runs.items():
            errs, walls = [], []
            for seed in range(a.seeds):
                t0 = time.perf_counter()
                source, _ = train(obj, data, a.steps, a.batch_size, seed=seed)
                walls.append(time.perf_counter() - t0)
                errs.append([float(clean_error(source, x_test, key, s)) for s in LEVELS])
                if name == "sure":
                    checks.append(
                        sure_check(source, y_train, x_train, sigma_n, jax.random.key(7))
                        + sure_check(source, y_test, x_test, sigma_n, jax.random.key(8))
                    )
            m, sd = np.mean(errs, 0), np.std(errs, 0)
            cells = " | ".join(f"{mu:.4f} +- {s:.4f}" for mu, s in zip(m, sd, strict=True))
            print(f"| {name} | {cells} | {np.mean(walls):.0f} |")
        print(
            "\nsure models at sigma_n, per pixel: SURE from the noisy digits alone, and (in "
            "brackets) the error against the clean ones; SURE far below the true error on the "
            "training set is the denoiser fitting its fixed noisy copies\n"
        )
        print("| seed | training set (noisy copies trained on) | test set (fresh noise) |")
        print("|---|---|---|")
        for seed, (tr, tr_true, te, te_true) in enumerate(checks):
            print(f"| {seed} | {tr:.4f} ({tr_true:.4f}) | {te:.4f} ({te_true:.4f}) |")


if __name__ == "__main__":
    main()
