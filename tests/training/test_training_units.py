"""Optimizer, EMA and metrics-file units against independent computations."""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.training import EMA, ema_decay, ema_update, make_optimizer, train, warmup_schedule
from scorelib.training.metrics_log import truncate_jsonl


def _np_adam(grads, lr, warmup, clip, b1=0.9, b2=0.999, eps=1e-8, w0=None):
    """Textbook Adam (Kingma & Ba 2015, Alg. 1) with global-norm clipping and linear warm-up."""
    w = np.array(w0, np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    out = []
    for n, g in enumerate(grads, start=1):
        g = np.asarray(g, np.float64)
        norm = np.sqrt(np.sum(g**2))
        if clip is not None and norm > clip:
            g = g * clip / norm
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        mhat, vhat = m / (1 - b1**n), v / (1 - b2**n)
        rate = lr * min(n / warmup, 1.0) if warmup else lr
        w = w - rate * mhat / (np.sqrt(vhat) + eps)
        out.append(w.copy())
    return out


@pytest.mark.parametrize("warmup,clip", [(0, None), (3, 1.0), (2, 0.05)])
def test_optimizer_matches_textbook_adam(warmup, clip):
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=5) * s for s in (3.0, 0.1, 2.0, 0.5, 1.0)]
    w0 = rng.normal(size=5)
    opt = make_optimizer(lr=0.1, warmup_steps=warmup, grad_clip=clip)
    w = jnp.asarray(w0, jnp.float32)
    st = opt.init(w)
    ref = _np_adam(grads, 0.1, warmup, clip, w0=w0)
    for g, r in zip(grads, ref, strict=True):
        u, st = opt.update(jnp.asarray(g, jnp.float32), st, w)
        w = w + u
        np.testing.assert_allclose(np.asarray(w), r, rtol=1e-5, atol=1e-6)


def test_warmup_schedule_values():
    s = warmup_schedule(2.0, 4)
    assert [float(s(n)) for n in range(6)] == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0]
    assert float(warmup_schedule(2.0, 0)(0)) == 2.0


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"lr": 0.0}, "optim.lr"),
        ({"lr": float("nan")}, "optim.lr"),
        ({"lr": 1e-3, "warmup_steps": -1}, "optim.warmup_steps"),
        ({"lr": 1e-3, "warmup_steps": 2.5}, "optim.warmup_steps"),
        ({"lr": 1e-3, "grad_clip": 0.0}, "optim.grad_clip"),
        ({"lr": 1e-3, "b1": 1.0}, "optim.b1"),
        ({"lr": 1e-3, "b2": -0.1}, "optim.b2"),
        ({"lr": 1e-3, "eps": 0.0}, "optim.eps"),
    ],
)
def test_optimizer_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make_optimizer(**kwargs)


def test_ema_decay_edm_halflife_with_rampup():
    b, h, r = 64, 10_000.0, 0.05
    for step in [0, 1, 10, 1000, 10_000]:
        # EDM training_loop.py, written out: cur_nimg = step * batch before the update
        halflife = min(h, step * b * r)
        want = 0.5 ** (b / max(halflife, 1e-8))
        got = float(ema_decay(step, batch_size=b, halflife_nimg=h, rampup_ratio=r))
        assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-30), (step, got, want)
    assert float(ema_decay(0, batch_size=b, halflife_nimg=h, rampup_ratio=r)) == 0.0
    # without ramp-up the half-life is constant: beta^(h / b) = 1/2
    beta = float(ema_decay(5, batch_size=b, halflife_nimg=h))
    assert math.isclose(beta ** (h / b), 0.5, rel_tol=1e-4)
    assert float(ema_decay(7, batch_size=b, decay=0.999)) == pytest.approx(0.999)


def test_ema_update():
    e, p = {"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([3.0, -2.0])}
    np.testing.assert_allclose(np.asarray(ema_update(e, p, 0.25)["w"]), [2.5, -1.0])


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({}, "ema.decay and ema.halflife_nimg"),
        ({"decay": 0.9, "halflife_nimg": 10.0}, "ema.decay and ema.halflife_nimg"),
        ({"decay": 1.0}, "ema.decay"),
        ({"halflife_nimg": -1.0}, "ema.halflife_nimg"),
        ({"decay": 0.9, "rampup_ratio": 0.1}, "ema.rampup_ratio"),
        ({"halflife_nimg": 10.0, "rampup_ratio": 0.0}, "ema.rampup_ratio"),
        ({"halflife_nimg": 10.0, "batch_size": 0}, "ema.batch_size"),
    ],
)
def test_ema_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        EMA(**kwargs)


def test_truncate_jsonl(tmp_path):
    p = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (5, 10, 15, 20)]
    p.write_text("\n".join(lines) + '\n{"step": 2')  # last line cut by a kill
    truncate_jsonl(str(p), 10)
    assert [json.loads(x)["step"] for x in p.read_text().splitlines()] == [5, 10]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_steps": -1}, "trainer.num_steps"),
        ({"num_steps": 3, "log_every": 0}, "trainer.log_every"),
        ({"num_steps": 3, "nonfinite": "ignore"}, "trainer.nonfinite"),
    ],
)
def test_train_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        train(None, None, progress=False, **kwargs)
