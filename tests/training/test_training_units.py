"""Optimizer, EMA and metrics-file units against independent computations."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import toy_train  # noqa: E402

from scorelib.training import (  # noqa: E402
    EMA,
    Checkpointer,
    Interrupted,
    abstract_state,
    create_state,
    ema_decay,
    ema_update,
    make_optimizer,
    make_train_step,
    network_source,
    train,
    warmup_schedule,
)
from scorelib.training.metrics_log import truncate_jsonl  # noqa: E402


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
    beta = float(ema_decay(5, batch_size=b, halflife_nimg=h, warmup=False))
    assert math.isclose(beta ** (h / b), 0.5, rel_tol=1e-4)
    assert float(ema_decay(7, batch_size=b, decay=0.999, warmup=False)) == pytest.approx(0.999)


def test_warmup_leaves_edm_rampup_unchanged():
    # rampup_ratio <= ln 2 / 9 keeps EDM's ramp below the warm-up cap at every step
    steps = np.concatenate([np.arange(0, 5000), np.geomspace(5000, 1e7, 200).astype(int)])
    for r in (0.05, math.log(2) / 9 * 0.999):
        kw = dict(batch_size=64, halflife_nimg=500_000.0, rampup_ratio=r)
        on = np.asarray(EMA(**kw).beta(jnp.asarray(steps)))
        off = np.asarray(EMA(**kw, warmup=False).beta(jnp.asarray(steps)))
        assert np.array_equal(on, off), r
    # a larger ratio is capped
    kw = dict(batch_size=64, halflife_nimg=500_000.0, rampup_ratio=0.5)
    assert float(EMA(**kw).beta(10)) < float(EMA(**kw, warmup=False).beta(10))


def _np_ema(params_seq, betas):
    ema = np.array(params_seq[0], np.float64)  # create_state: the EMA starts at the init
    out = []
    for p, b in zip(params_seq[1:], betas, strict=True):
        ema = b * ema + (1.0 - b) * np.asarray(p, np.float64)
        out.append(ema.copy())
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {"decay": 0.999},
        {"decay": 0.9},
        {"decay": 0.999, "warmup": False},
        {"halflife_nimg": 2000.0, "batch_size": 8},
        {"halflife_nimg": 2000.0, "batch_size": 8, "rampup_ratio": 0.5},
    ],
)
def test_ema_matches_numpy_loop(kwargs):
    ema = EMA(**kwargs)
    warmup = kwargs.get("warmup", True)
    T = 60
    betas = []
    for t in range(T):  # written out from the definitions, in float64
        if "decay" in kwargs:
            b = kwargs["decay"]
        else:
            h = kwargs["halflife_nimg"]
            if "rampup_ratio" in kwargs:
                h = min(h, t * kwargs["batch_size"] * kwargs["rampup_ratio"])
            b = 0.5 ** (kwargs["batch_size"] / max(h, 1e-8))
        if warmup:
            b = min(b, (1 + t) / (10 + t))
        betas.append(b)
    np.testing.assert_allclose([float(ema.beta(t)) for t in range(T)], betas, rtol=2e-6)
    if warmup:
        assert float(ema.beta(0)) == pytest.approx(0.0 if "rampup_ratio" in kwargs else 0.1)
    rng = np.random.default_rng(0)
    params = [rng.normal(size=3) for _ in range(T + 1)]
    e = jnp.asarray(params[0], jnp.float32)
    for t, (p, want) in enumerate(zip(params[1:], _np_ema(params, betas), strict=True)):
        e = ema_update(e, jnp.asarray(p, jnp.float32), ema.beta(t))
        np.testing.assert_allclose(np.asarray(e), want, rtol=1e-5, atol=1e-6)


_MU = np.array([3.0, -2.0, 1.0, 0.5], np.float32)


def _quadratic(w, x0, key):
    # E_x 0.5 |w - x|^2 with x ~ N(mu, I): minimised exactly at w = mu
    x = _MU + jax.random.normal(key, (16, 4))
    return 0.5 * jnp.mean(jnp.sum((w["w"] - x) ** 2, -1)), {}


@pytest.mark.parametrize("warmup", [True, False])
def test_ema_of_a_300_step_run_beats_raw_params_at_the_optimum(warmup):
    # Adam from 0 reaches mu in ~80 steps, then jitters around it; the EMA averages the
    # jitter. Mean squared distance to mu over 8 seeds, at steps 200 and 300.
    opt = make_optimizer(lr=0.05, warmup_steps=0, grad_clip=None)
    step = make_train_step(
        _quadratic, lambda p, k: p, opt, EMA(decay=0.999, warmup=warmup), lambda i: jnp.zeros(())
    )
    raw, avg = np.zeros(2), np.zeros(2)
    for seed in range(8):
        st = create_state({"w": jnp.zeros(4)}, opt, seed=seed)
        for i in range(1, 301):
            st, _ = step(st)
            if i in (200, 300):
                k = i // 100 - 2
                raw[k] += np.sum((np.asarray(st.params["w"]) - _MU) ** 2) / 8
                avg[k] += np.sum((np.asarray(st.ema_params["w"]) - _MU) ** 2) / 8
    if warmup:
        assert np.all(avg < raw / 2), (avg, raw)
    else:  # 0.999^300 = 74% of the EMA is still the initial zeros: what warm-up fixes
        assert np.all(avg > 100 * raw), (avg, raw)


class _StepLoss:
    """An objective whose loss is its step (``uses_step``), plus 0 times the parameters."""

    uses_step = True

    def __call__(self, source, x0, key, step=None):
        loss = jnp.asarray(step, jnp.float32) + 0.0 * jnp.sum(source["w"])
        return loss, {}


def test_the_train_step_passes_the_step_to_an_objective_that_uses_it():
    opt = make_optimizer(lr=0.05, warmup_steps=0, grad_clip=None)
    step = make_train_step(
        _StepLoss(), lambda p, k: p, opt, EMA(decay=0.9), lambda i: jnp.zeros(())
    )
    st = create_state({"w": jnp.zeros(4)}, opt, seed=0)
    losses = []
    for _ in range(3):
        st, m = step(st)
        losses.append(float(m["loss"]))
    assert losses == [0.0, 1.0, 2.0]


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_ema_of_a_300_step_toy_diffusion_run_is_not_worse_than_raw():
    """The EMA (decay 0.999) of a 300-step toy diffusion run with warm-up is not worse than
    the raw parameters on held-out data; without warm-up it is far worse. The run is
    toy_train's step (compiled once for this module); the parameters do not depend on the
    EMA, so both EMAs are taken beside it by the update a step applies (``apply_update``:
    ``ema_update(ema, new params, EMA.beta(step))``), in one small compiled call."""
    from scorelib.objectives import EDMLoss
    from scorelib.processes import EDM

    graphdef, s0 = toy_train._model(32)
    proc = EDM()
    loss = EDMLoss(process=proc)
    source = network_source(proc, graphdef, 0.5)
    held_out = jnp.concatenate([toy_train.make_batch_fn()(10**6 + j) for j in range(64)])
    evaluate = jax.jit(lambda p: loss(source(p, None), held_out, jax.random.key(99))[0])
    emas = {w: EMA(batch_size=toy_train.BATCH, decay=0.999, warmup=w) for w in (True, False)}

    @jax.jit
    def update(avg, params, i):
        return {w: ema_update(avg[w], params, emas[w].beta(i)) for w in emas}

    step = toy_train._step(32, None)
    st = jax.tree.map(lambda x: x.copy(), s0)
    avg = {w: jax.tree.map(jnp.copy, st.params) for w in emas}  # the EMA starts at the init
    losses = {}
    for i in range(1, 301):
        st, _ = step(st)
        avg = update(avg, st.params, i - 1)
        if i % 100 == 0:
            raw = float(evaluate(st.params))
            for w in emas:
                losses[w, i] = (raw, float(evaluate(avg[w])))
    for i in (100, 200, 300):
        raw, avg_loss = losses[True, i]
        assert avg_loss <= raw, (i, raw, avg_loss)
    raw, avg_loss = losses[False, 300]
    assert avg_loss > raw + 0.2, (raw, avg_loss)  # without warm-up the EMA is far worse


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
        ({"decay": 0.9, "warmup": 1}, "ema.warmup"),
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


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_log_lines_every_log_every_steps(tmp_path, caplog):
    state, step, ckpt = toy_train.build(
        toy_train.parser().parse_args([str(tmp_path), "--num-steps", "12"])
    )
    with caplog.at_level(logging.INFO, logger="scorelib.training"):
        train(state, step, num_steps=12, ckpt=ckpt, log_every=5, progress=False)
    ckpt.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "scorelib.training"]
    assert len(lines) == 3, lines  # steps 5, 10 and the last, 12
    for line, s in zip(lines, (5, 10, 12), strict=True):
        head, loss, rate = line.split("  ")
        assert head == f"step {s}/12"
        assert loss.startswith("loss ") and math.isfinite(float(loss[5:]))
        assert rate.endswith(" steps/s") and float(rate.split()[0]) > 0


def _signalling(step_fn, at, signums):
    """``step_fn`` that sends ``signums`` to this process during step index ``at``."""

    def step(state):
        if int(state.step) == at:
            for s in signums:
                os.kill(os.getpid(), s)
        return step_fn(state)

    return step


@pytest.mark.parametrize(
    "signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGUSR1, 138)]
)
def test_signal_saves_the_step_and_raises_interrupted(tmp_path, caplog, signum, code):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    args = toy_train.parser().parse_args([str(tmp_path), "--num-steps", "20", "--save-every", "4"])
    state, step, ckpt = toy_train.build(args)
    with caplog.at_level(logging.WARNING, logger="scorelib.training"):
        with pytest.raises(Interrupted) as e:
            train(state, _signalling(step, 6, [signum]), num_steps=20, ckpt=ckpt, progress=False)
    ckpt.close()
    assert isinstance(e.value, SystemExit) and e.value.code == code
    assert e.value.signum == signum and e.value.step == 7  # the step in flight, finished
    assert e.value.message == "saved step 7; rerun the same command to resume"
    assert f"{signal.Signals(signum).name} received: stopping after step 7" in caplog.text
    assert {s: signal.getsignal(s) for s in before} == before  # handlers put back
    fresh, _, c = toy_train.build(args)
    assert c.all_steps() == [4, 7]
    assert int(c.restore_latest(abstract_state(fresh)).step) == 7
    c.close()


def test_second_ctrl_c_before_the_boundary_stops_at_once(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    args = toy_train.parser().parse_args([str(tmp_path), "--num-steps", "20", "--save-every", "4"])
    state, step, ckpt = toy_train.build(args)
    with pytest.raises(KeyboardInterrupt):
        train(
            state,
            _signalling(step, 6, [signal.SIGINT] * 2),
            num_steps=20,
            ckpt=ckpt,
            progress=False,
        )
    ckpt.close()
    assert signal.getsignal(signal.SIGINT) is before
    assert Checkpointer(tmp_path / "ckpt", save_every=4).all_steps() == [4]  # untouched


def test_ctrl_c_during_the_save_is_ignored(tmp_path):
    args = toy_train.parser().parse_args([str(tmp_path), "--num-steps", "20", "--save-every", "4"])
    state, step, ckpt = toy_train.build(args)
    save = ckpt.save

    def save_interrupted(*a, **k):  # a second and a third Ctrl-C while saving
        os.kill(os.getpid(), signal.SIGINT)
        out = save(*a, **k)
        os.kill(os.getpid(), signal.SIGINT)
        return out

    ckpt.save = save_interrupted
    with pytest.raises(Interrupted) as e:
        train(state, _signalling(step, 1, [signal.SIGINT]), num_steps=20, ckpt=ckpt, progress=False)
    ckpt.close()
    assert e.value.code == 130 and e.value.step == 2
    fresh, _, c = toy_train.build(args)
    assert int(c.restore_latest(abstract_state(fresh)).step) == 2
    c.close()


def test_signal_without_checkpointer_says_nothing_was_saved(tmp_path):
    args = toy_train.parser().parse_args([str(tmp_path), "--num-steps", "20"])
    state, step, ckpt = toy_train.build(args)
    ckpt.close()
    with pytest.raises(Interrupted) as e:
        train(state, _signalling(step, 2, [signal.SIGTERM]), num_steps=20, progress=False)
    assert e.value.code == 143 and e.value.step is None
    assert e.value.message == "stopped by SIGTERM at step 3; nothing saved"
