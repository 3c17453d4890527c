"""The alternating step: which parts move, the ratio means, non-finite steps; the
networks' feature methods and the discriminator heads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib import distill, training
from scorelib.data.targets import GaussianMixtureTarget
from scorelib.nets import MLP, UNet
from scorelib.processes import EDM
from scorelib.training import EMA


def _same(a, b):
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_mlp_features_are_the_hidden_layers_of_call():
    model = MLP((2,), width=16, depth=3, norm="layer", rngs=nnx.Rngs(0))
    _, params = nnx.split(model, nnx.Param)
    params = jax.tree.map(lambda v: v + 0.1, params)  # a non-zero output layer
    nnx.update(model, params)
    x, c = jnp.ones((4, 2)) * jnp.arange(4.0)[:, None], jnp.linspace(-1, 1, 4)
    gd, params = nnx.split(model, nnx.Param)

    @jax.jit
    def run(p):
        m = nnx.merge(gd, p)
        feats = m.features(x, c)
        return feats, m.out(jax.nn.silu(m._norm(-1, feats[-1]))), m(x, c)

    feats, out, want = run(params)
    assert [f.shape for f in feats] == [(4, 16)] * 3
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-6)


def test_unet_features_one_per_resolution_and_conv_heads():
    net = nnx.eval_shape(
        lambda: UNet(
            (8, 8, 1),
            channels=8,
            channel_mult=(1, 2),
            num_res_blocks=1,
            attn_resolutions=(),
            rngs=nnx.Rngs(0),
        )
    )
    gd, params = nnx.split(net, nnx.Param)
    x = jax.ShapeDtypeStruct((2, 8, 8, 1), jnp.float32)
    c = jax.ShapeDtypeStruct((2,), jnp.float32)
    feats = jax.eval_shape(lambda p, x, c: nnx.merge(gd, p).features(x, c), params, x, c)
    assert [f.shape for f in feats] == [(2, 8, 8, 8), (2, 4, 4, 16), (2, 4, 4, 16)]
    disc = nnx.eval_shape(
        lambda: distill.Discriminator([f.shape[1:] for f in feats], 8, rngs=nnx.Rngs(1))
    )
    gdd, pd = nnx.split(disc, nnx.Param)
    out = jax.eval_shape(lambda p, f: nnx.merge(gdd, p)(None, None, f), pd, feats)
    assert out.shape == (2, 3)
    with pytest.raises(ValueError, match="distill.disc_width"):
        distill.Discriminator([(4,)], 0, rngs=nnx.Rngs(0))


def _four_mode_setup():
    """``(params, opts, cfg, step)`` of a 2-D distillation against a four-mode mixture, R1
    on, NaN data at step 3 (a critic step), the student's parameters put on the default
    device first (as orbax restores them: the state is committed). Both tests below build
    exactly this: the second loads the first's compiled steps from the persistent
    compilation cache (the same programs), with fresh in-memory caches of its own. (The
    last two tests of the file run uncommitted states.)
    """
    w = np.linspace(0.02, 0.3, 4)
    target = GaussianMixtureTarget.create(
        w, [[1.0, 0], [-1, 0], [0, 1], [0, -1]], stds=np.full(4, 0.2)
    )
    teacher = target.noisy_score(EDM())
    model = MLP((2,), width=16, depth=1, emb_dim=8, rngs=nnx.Rngs(0))
    gd, p_model = nnx.split(model, nnx.Param)
    p_model = jax.device_put(p_model, jax.devices()[0])
    disc = distill.Discriminator(
        [(16,)], 8, MLP((2,), width=16, depth=1, emb_dim=8, rngs=nnx.Rngs(2)), rngs=nnx.Rngs(1)
    )
    gdd, p_disc = nnx.split(disc, nnx.Param)
    cfg = distill.DistillConfig(divergence="js", student_every=2, r1_weight=1.0)
    opts = {k: distill.make_optimizer(1e-3, 0.01) for k in distill.PARTS}
    params = {"student": p_model, "fake": p_model, "disc": p_disc}

    def batch(i):  # NaN data at step 3 (a critic step)
        return jnp.where(i == 3, jnp.nan, target.batch(8, seed=0, step=i))

    step = distill.make_distill_step(
        teacher,
        distill.Networks(gd, gdd, None, 1.0),
        cfg,
        opts,
        EMA(batch_size=8, decay=0.9),
        batch,
        8,
        (2,),
    )
    return params, opts, cfg, step


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_student_and_critic_steps_move_their_own_parts_and_nan_stops():
    params, opts, cfg, step = _four_mode_setup()
    state = distill.init_distill_state(params, opts, cfg, seed=0)
    host = lambda s: jax.device_get(s)  # noqa: E731
    history, metrics = [host(state)], []
    for _ in range(4):
        state, m = step(state)
        history.append(host(state))
        metrics.append(host(m))
    s0, s1, s2, s3, s4 = history
    # step 0: the student (and its EMA and the ratio means) moves, the critics do not
    assert not _same(s1.params["student"], s0.params["student"])
    assert not _same(s1.ema_params, s0.ema_params)
    assert _same(s1.params["fake"], s0.params["fake"]) and _same(
        s1.params["disc"], s0.params["disc"]
    )
    assert not np.array_equal(s1.ratio_means, s0.ratio_means)
    # step 1: the critics move, the student and the ratio means do not
    assert _same(s2.params["student"], s1.params["student"]) and _same(s2.ema_params, s1.ema_params)
    assert not _same(s2.params["fake"], s1.params["fake"])
    assert not _same(s2.params["disc"], s1.params["disc"])
    assert np.array_equal(s2.ratio_means, s1.ratio_means)
    assert [m["student_step"] for m in metrics] == [1, 0, 1, 0]
    for m in metrics[:3]:
        assert m["finite"] == 1 and all(np.isfinite(v) for v in m.values())
        assert m["r_min"] >= 0.1 and m["r_max"] <= 20
        assert m["loss_r1"] > 0  # r1_weight = 1: the penalty is on, and logged
        assert {f"ratio_bin{k}" for k in range(10)} <= set(m)
    # step 3: NaN data -> no update, recorded
    assert metrics[3]["finite"] == 0
    assert int(s4.first_nonfinite) == 3 and int(s4.n_skipped) == 1 and int(s4.step) == 4
    assert _same(s4.params, s3.params) and _same(s4.opt_state, s3.opt_state)
    # the training loop stops on it, naming the step
    fresh = distill.init_distill_state(params, opts, cfg, seed=0)
    with pytest.raises(FloatingPointError, match="non-finite loss at step 3"):
        training.train(fresh, step, num_steps=4, log_every=2, progress=False, handle_signals=False)
    # the branch the host's step number selects (how the loop calls it) is the lax.cond
    # step, up to the order of float32 reductions (another compilation)
    state = distill.init_distill_state(params, opts, cfg, seed=0)
    for i in range(4):
        state, m = step(state, i)
        np.testing.assert_allclose(host(m)["loss"], metrics[i]["loss"], rtol=1e-5)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
            host(state),
            history[i + 1],
        )


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_a_teacher_restored_on_its_device_compiles_the_step_once():
    """A teacher restored from a checkpoint is committed to its device and the fresh parts
    (discriminator, key, ratio means) are not: the state is committed whole, so the
    critic step at step 1 reuses the executable of step 0 (it compiled the U-Net step a
    second time, 2 minutes on a loaded CPU). (``loss_r1`` is 0 while R1 is off: checked
    by the last two tests of this file.)"""
    params, opts, cfg, step = _four_mode_setup()
    state = distill.init_distill_state(params, opts, cfg, seed=0)
    assert {x.committed for x in jax.tree.leaves(state)} == {True}
    abstract = jax.eval_shape(lambda p: distill.init_distill_state(p, opts, cfg, seed=0), params)
    assert jax.tree.structure(abstract) == jax.tree.structure(state)  # traceable as before
    for i in range(3):  # a student step, a critic step, a student step: one branch each
        state, m = step(state, i)
        assert float(m["student_step"]) == (i % 2 == 0)
    assert step.student._cache_size() == 1 and step.critic._cache_size() == 1
    for _ in range(3):  # the lax.cond version (no host step), one executable
        state, m = step(state)
    assert step.cond._cache_size() == 1


@pytest.mark.parametrize(
    "field, value",
    [
        ("student_every", 0),
        ("gan_weight", -1e-3),
        ("ratio_bins", 0),
        ("ratio_ema", 1.0),
        ("sigma_max", 0.001),
        ("r1_noise", 0.0),
        ("sigma_refine", 0.0),
        ("sigma_refine", 80.0),  # not below sigma_g
    ],
)
def test_config_refuses_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"distill.{field} must be"):
        distill.DistillConfig(**{field: value})


def test_r1_noise_is_refused_while_the_r1_penalty_is_off():
    with pytest.raises(ValueError, match=r"distill.r1_noise must be left unset while"):
        distill.DistillConfig(r1_noise=0.2)
    with pytest.raises(ValueError, match=r"distill.r1_noise must be a number in \(0.0, inf\)"):
        distill.DistillConfig(r1_weight=1.0, r1_noise=0.0)
    assert distill.DistillConfig(r1_weight=1.0, r1_noise=0.2).r1_noise == 0.2
    assert distill.DistillConfig(r1_weight=1.0).r1_noise is None  # R1_NOISE is used


def test_the_refining_stage_is_the_network_again_at_sigma_refine():
    """``generate`` with ``sigma_refine``: EDM's preconditioned denoiser written out from
    Karras et al. (2022, Table 1) and applied twice, first to ``sigma_g z`` at ``sigma_g``,
    then to that output at ``sigma_refine``; the sampler reports 2 network evaluations."""
    model = MLP((3,), width=16, depth=2, emb_dim=8, rngs=nnx.Rngs(0))
    gd, params = nnx.split(model, nnx.Param)
    # a non-zero output layer, so that the network term shows in both stages
    params = jax.tree.map(lambda a: a + 0.1, params)
    net = nnx.merge(gd, params)
    sd, sigma_g, sigma_r = 0.5, 80.0, 0.2

    def denoiser(x, sigma):
        c_skip = sd**2 / (sigma**2 + sd**2)
        c_out = sigma * sd / np.sqrt(sigma**2 + sd**2)
        c_in = 1 / np.sqrt(sigma**2 + sd**2)
        c_noise = np.full((x.shape[0],), np.log(sigma) / 4, np.float32)
        return c_skip * x + c_out * np.asarray(net(jnp.asarray(c_in * x), jnp.asarray(c_noise)))

    z = np.asarray(jax.random.normal(jax.random.key(1), (5, 3)))
    one = denoiser(sigma_g * z, sigma_g)
    want = denoiser(one, sigma_r)
    got = distill.generate(gd, params, jnp.asarray(z), sigma_g, sd, sigma_r)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        distill.generate(gd, params, jnp.asarray(z), sigma_g, sd), one, rtol=1e-5, atol=1e-5
    )
    assert np.abs(want - one).max() > 1e-2  # the second stage does change the samples
    x, info = distill.one_step_sampler(gd, sigma_g, sd, sigma_r)(params, jax.random.key(0), (4, 3))
    assert info == {"nfe": 2, "steps": 1} and x.shape == (4, 3)
    assert (
        distill.one_step_sampler(gd, sigma_g, sd)(params, jax.random.key(0), (4, 3))[1]["nfe"] == 1
    )


def _one_step_student(teacher, batch, *, steps, lr, student_every=2, ema_decay=0.0, **cfg_kw):
    """``(initial samples, final samples, metrics)`` of ``steps`` distillation steps of a
    fresh 2-D student (one hidden layer) against ``teacher`` (no network: the discriminator
    has its own backbone); ``cfg_kw``: more :class:`DistillConfig` fields. With
    ``ema_decay=None`` (an EMA of decay 0.9) it returns ``(states, metrics)``, every state
    from the initial one on, instead."""
    model = MLP((2,), width=32, depth=1, emb_dim=8, rngs=nnx.Rngs(0))
    gd, p_model = nnx.split(model, nnx.Param)
    disc = distill.Discriminator(
        [(16,)], 8, MLP((2,), width=16, depth=1, emb_dim=8, rngs=nnx.Rngs(2)), rngs=nnx.Rngs(1)
    )
    gdd, p_disc = nnx.split(disc, nnx.Param)
    cfg = distill.DistillConfig(
        divergence="kl", student_every=student_every, sigma_max=20.0, **cfg_kw
    )
    opts = {k: distill.make_optimizer(lr, 0.0) for k in distill.PARTS}
    params = {"student": p_model, "fake": p_model, "disc": p_disc}
    state0 = distill.init_distill_state(params, opts, cfg, seed=0)
    nets = distill.Networks(gd, gdd, None, 1.0)
    step = distill.make_distill_step(
        teacher,
        nets,
        cfg,
        opts,
        EMA(batch_size=64, decay=0.9 if ema_decay is None else ema_decay),
        batch,
        64,
        (2,),
        jit=True,
    )
    state, metrics = jax.tree.map(jnp.copy, state0), []
    states = [jax.device_get(state0)]
    for _ in range(steps):
        state, m = step(state)
        metrics.append(jax.device_get(m))
        states.append(jax.device_get(state))
    if ema_decay is None:
        return states, metrics
    z = jax.random.normal(jax.random.key(5), (512, 2))
    draw = lambda p: np.asarray(distill.generate(gd, p, z, cfg.sigma_g, 1.0))  # noqa: E731
    return draw(state0.params["student"]), draw(jax.device_get(state.params["student"])), metrics


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_a_gaussian_teacher_pulls_the_student_toward_its_mean():
    """GaussianScore (the analytic Gaussian): the fresh student's samples start near 0 and
    move toward the teacher's mean (2, -1.5); every loss and gradient stays finite."""
    from scorelib.scores import GaussianScore

    mu = np.array([2.0, -1.5])
    teacher = GaussianScore.from_covariance(EDM(), mu, np.diag([0.3, 0.1]))
    key = jax.random.key(3)
    batch = lambda i: mu + jax.random.normal(jax.random.fold_in(key, i), (64, 2)) * 0.4  # noqa: E731
    before, after, metrics = _one_step_student(teacher, batch, steps=40, lr=3e-3)
    assert all(m["finite"] == 1 and np.isfinite(m["loss_student"]) for m in metrics)
    assert all(m["loss_r1"] == 0.0 for m in metrics)  # R1 off: 0, student and critic steps
    d0 = np.linalg.norm(before.mean(0) - mu)
    d1 = np.linalg.norm(after.mean(0) - mu)
    assert np.isfinite(after).all()
    assert d1 < 0.7 * d0, (d0, d1)


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_an_empirical_teacher_runs_finite_and_moves_the_student():
    """EmpiricalScore (the exact score of a 16-point training set): a few steps are finite,
    the student moves and its samples stay finite."""
    from scorelib.scores import EmpiricalScore

    pts = np.asarray(jax.random.normal(jax.random.key(4), (16, 2))) + np.array([1.0, 1.0])
    teacher = EmpiricalScore.create(EDM(), pts)
    train = jnp.asarray(pts, jnp.float32)
    batch = lambda i: train[
        jax.random.randint(jax.random.fold_in(jax.random.key(6), i), (64,), 0, 16)
    ]  # noqa: E731
    before, after, metrics = _one_step_student(teacher, batch, steps=6, lr=1e-3)
    assert all(m["finite"] == 1 for m in metrics)
    assert all(m["loss_r1"] == 0.0 for m in metrics)  # R1 off: 0, student and critic steps
    assert all(np.isfinite(v) for m in metrics for v in m.values())
    assert np.isfinite(after).all() and not np.allclose(before, after)


@pytest.mark.parametrize("clock", ["steps", "student_updates"])
def test_the_ema_warm_up_counts_steps_or_student_updates(clock):
    """``distill.ema_clock``: the student's EMA moves on student steps only (0, 3, 6 with
    ``student_every=3``), with ``beta = min(0.9, (1 + t) / (10 + t))`` where ``t`` is the
    global step (``steps``) or the number of earlier student updates (``student_updates``:
    0, 1, 2); each update is ``beta * ema + (1 - beta) * student`` of the states before and
    after it (an independent computation from the logged states)."""
    from scorelib.scores import GaussianScore  # as the tests above: this test's teacher

    mu = np.array([1.0, -1.0])
    teacher = GaussianScore.from_covariance(EDM(), mu, np.diag([0.3, 0.1]))
    batch = lambda i: mu + jax.random.normal(jax.random.fold_in(jax.random.key(1), i), (64, 2))  # noqa: E731
    states, metrics = _one_step_student(
        teacher, batch, steps=7, lr=1e-2, student_every=3, ema_decay=None, ema_clock=clock
    )
    for i in (0, 3, 6):
        t = i if clock == "steps" else i // 3
        beta = min(0.9, (1 + t) / (10 + t))
        assert metrics[i]["ema_beta"] == pytest.approx(beta, rel=1e-6)
        before, after = states[i], states[i + 1]
        mix = lambda e, p, b=beta: b * e + (1 - b) * p  # noqa: E731
        want = jax.tree.map(mix, before.ema_params, after.params["student"])
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
            after.ema_params,
            want,
        )
    for i in (1, 2, 4, 5):  # critic steps: the EMA stays
        assert _same(states[i + 1].ema_params, states[i].ema_params)
    with pytest.raises(ValueError, match="distill.ema_clock must be one of"):
        distill.DistillConfig(ema_clock="updates")
