"""Validation before compilation, the registry and its contract (options, declared
property), NFE accounting, keys and batch independence."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from sampler_helpers import PROCESSES, Gauss

from scorelib.samplers import SAMPLERS, driver, edm_grid, get_sampler
from scorelib.scores import GaussianScore

D = 3
G = Gauss(D, [0.0, 0.4, 1.5])
STOCHASTIC = {
    "euler_maruyama": {},
    "pc": dict(n_corrector=2),
    "annealed_langevin": dict(n_steps_each=3),
    "heun": dict(S_churn=10.0, S_min=0.05, S_max=50.0, S_noise=1.007),
}
ALL = {**{k: {} for k in SAMPLERS}, **STOCHASTIC}


def test_get_sampler_unknown_name_lists_names():
    assert get_sampler("heun") is SAMPLERS["heun"]
    with pytest.raises(ValueError, match="sampler.name") as e:
        get_sampler("ddim")
    for name in SAMPLERS:
        assert name in str(e.value)


def test_contract_name_options_and_signature():
    """Each registered sampler exposes its name, its options with defaults (unroll
    included), and the library signature with those options."""
    import inspect

    want = {
        "heun": {"S_churn": 0.0, "S_min": 0.0, "S_max": np.inf, "S_noise": 1.0},
        "dpmpp_2m": {},
        "euler_maruyama": {},
        "pf_ode_euler": {},
        "pc": {"snr": 0.16, "n_corrector": 1},
        "annealed_langevin": {"n_steps_each": 100, "eps": None},
    }
    assert set(SAMPLERS) == set(want)
    for name, s in SAMPLERS.items():
        assert s.name == name
        assert dict(s.options) == {**want[name], "unroll": 1}
        params = inspect.signature(s).parameters
        assert list(params)[:7] == [
            "source",
            "key",
            "shape",
            "grid",
            "x_T",
            "first_index",
            "float64",
        ]
        assert {k: params[k].default for k in list(params)[7:]} == dict(s.options)


@pytest.mark.parametrize(
    "name,opt",
    [
        ("dpmpp_2m", "S_churn"),
        ("heun", "snr"),
        ("euler_maruyama", "n_corrector"),
        ("pf_ode_euler", "S_churn"),
        ("pc", "eps"),
        ("annealed_langevin", "S_churn"),
        ("heun", "rho"),
    ],
)
def test_an_option_the_sampler_does_not_use_is_refused(name, opt, no_compile):
    """E.g. ``sampler=dpmpp_2m sampler.S_churn=40`` must not run without churn silently."""
    s = SAMPLERS[name]
    msg = f"sampler.{opt} is not used by sampler {name}"
    with pytest.raises(ValueError, match=msg) as e:
        s(G.source(PROCESSES["vp"]), jax.random.key(0), (2, D), grid=edm_grid(3), **{opt: 40.0})
    for o in s.options:  # the message lists what the sampler does take
        assert o in str(e.value)
    with pytest.raises(ValueError, match=msg):
        s.is_stochastic(**{opt: 40.0})


DECLARED = [
    ("heun", {}, False),
    ("heun", dict(S_churn=10.0, S_min=0.05, S_max=50.0), True),
    ("dpmpp_2m", {}, False),
    ("pf_ode_euler", {}, False),
    ("euler_maruyama", {}, True),
    ("pc", dict(n_corrector=2), True),
    ("pc", dict(n_corrector=0), True),
    ("annealed_langevin", dict(n_steps_each=3), True),
]


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_declared_property_matches_the_behaviour():
    """``is_stochastic`` is what the sampler does: from one x_T, two keys give the same
    output exactly when the sampler declares itself deterministic. The runs of every case
    of ``DECLARED`` are one ``jax.jit``, called with each key."""
    src = G.source(PROCESSES["vp"])
    x_T = np.random.default_rng(0).normal(size=(4, D)) * 30.0

    @jax.jit
    def run_all(src, key, x_T):
        return [
            SAMPLERS[name](src, key, (4, D), grid=edm_grid(6), x_T=x_T, **opts)[0]
            for name, opts, _ in DECLARED
        ]

    a, b = run_all(src, jax.random.key(1), x_T), run_all(src, jax.random.key(2), x_T)
    for (name, opts, stochastic), a_i, b_i in zip(DECLARED, a, b, strict=True):
        assert SAMPLERS[name].is_stochastic(**opts) is stochastic, (name, opts)
        same = np.array_equal(np.asarray(a_i), np.asarray(b_i))
        assert same is not stochastic, (name, opts)
        if stochastic:
            assert np.min(np.abs(np.asarray(a_i) - np.asarray(b_i)).max(axis=1)) > 1e-4, name


@pytest.fixture
def no_compile(monkeypatch):
    """Replace every jitted core by a function that fails the test if reached."""

    def boom(*a, **k):
        raise AssertionError("reached the compiled core: validation came too late")

    monkeypatch.setattr(driver, "_run", boom)
    monkeypatch.setattr(driver, "_compiled_run", lambda backend: boom)


BAD_COMMON = [
    (dict(grid=np.array([1.0, 2.0, 0.0])), "sampler.grid"),
    (dict(grid=np.array([5.0, 0.0, 0.0])), "sampler.grid"),
    (dict(grid=np.array([5.0, 0.0, 1.0])), "sampler.grid"),
    (dict(grid=np.array([5.0])), "sampler.grid"),
    (dict(grid=np.array([5.0, -1.0])), "sampler.grid"),
    (dict(grid=np.array([5.0, np.nan, 0.0])), "sampler.grid"),
    (dict(grid=np.array([1.0, 1.0 - 1e-9, 0.0])), "float64=True"),
    (dict(x_T=np.zeros((4, D + 1))), "x_T must have shape"),
    (dict(x_T=np.zeros((3, D))), "x_T must have shape"),
    (dict(shape=(4, D + 1)), "data_shape"),
    (dict(shape=(0, D)), "shape"),
    (dict(first_index=-1), "first_index"),
    (dict(key=np.zeros(3, np.uint32)), "key"),
]


@pytest.mark.parametrize("name", list(SAMPLERS))
@pytest.mark.parametrize("bad,match", BAD_COMMON)
def test_bad_common_input_raises_before_compiling(name, bad, match, no_compile):
    args = dict(key=jax.random.key(0), shape=(4, D), grid=edm_grid(3))
    args.update(bad)
    src = G.source(PROCESSES["edm"])
    with pytest.raises(ValueError, match=match):
        SAMPLERS[name](src, args.pop("key"), args.pop("shape"), **args)


@pytest.mark.parametrize(
    "name,opts,field",
    [
        ("heun", dict(S_churn=-1.0), "sampler.S_churn"),
        ("heun", dict(S_min=-0.1), "sampler.S_min"),
        ("heun", dict(S_min=2.0, S_max=1.0), "sampler.S_max"),
        ("heun", dict(S_noise=0.0), "sampler.S_noise"),
        ("pc", dict(snr=0.0), "sampler.snr"),
        ("pc", dict(snr=float("inf")), "sampler.snr"),  # an infinite step gave NaN samples
        ("heun", dict(S_churn=1.0, S_noise=float("inf")), "sampler.S_noise"),
        ("pc", dict(n_corrector=-1), "sampler.n_corrector"),
        ("pc", dict(n_corrector=1.5), "sampler.n_corrector"),
        ("annealed_langevin", dict(n_steps_each=0), "sampler.n_steps_each"),
        ("annealed_langevin", dict(eps=-1e-5), "sampler.eps"),
        ("annealed_langevin", dict(eps=float("inf")), "sampler.eps"),
        ("dpmpp_2m", dict(unroll=0), "sampler.unroll"),
        # options that would do nothing with these settings are refused, not ignored
        ("heun", dict(S_min=1.0), r"sampler.S_min is not used by sampler heun when"),
        ("heun", dict(S_max=10.0), r"sampler.S_max is not used by sampler heun when"),
        ("heun", dict(S_noise=1.003), r"sampler.S_noise is not used by sampler heun when"),
        ("pc", dict(n_corrector=0, snr=0.1), r"sampler.snr is not used by sampler pc when"),
    ],
)
def test_bad_options_raise_before_compiling(name, opts, field, no_compile):
    with pytest.raises(ValueError, match=field):
        SAMPLERS[name](
            G.source(PROCESSES["vp"]), jax.random.key(0), (2, D), grid=edm_grid(3), **opts
        )


def test_time_of_wrong_shape_is_rejected_by_sources():
    src = G.source(PROCESSES["vp"])
    with pytest.raises(ValueError, match="t must be a scalar or have shape"):
        src.score(jnp.zeros((4, D)), jnp.full((3,), 0.5))


class CountingGaussian(GaussianScore):
    """Counts score/denoiser calls (one batched NFE each) from inside the compiled code, in
    ``_COUNT[case]`` (one counter per case, so that many cases run in one program).

    A call made from within another (score via denoiser or back) is not counted twice:
    the guard is a trace-time flag, the tick a runtime callback.
    """

    case: int = struct.field(pytree_node=False, default=0)

    def denoiser(self, x, t):
        return _counted(self.case, super().denoiser, x, t)

    def score(self, x, t):
        return _counted(self.case, super().score, x, t)


_COUNT: dict = {}
_INSIDE = [False]


def _counted(case, fn, x, t):
    if _INSIDE[0]:
        return fn(x, t)
    _INSIDE[0] = True
    try:
        jax.debug.callback(functools.partial(_tick, case))
        return fn(x, t)
    finally:
        _INSIDE[0] = False


def _tick(case):
    _COUNT[case] += 1


NFE_CASES = [(k, True) for k in SAMPLERS] + [
    ("heun", False),
    ("dpmpp_2m", False),
    ("annealed_langevin", False),
]


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_nfe_equals_the_counted_model_calls():
    """N requested steps make exactly the documented number of calls, for each
    ``(name, final_zero)`` of ``NFE_CASES`` (each case counts on its own counter; the runs
    of all cases are one ``jax.jit``)."""
    g = Gauss(D, [0.0, 0.4, 1.5])
    src = g.source(PROCESSES["vp"])
    n = 4
    srcs = [
        CountingGaussian(case=i, **{f: getattr(src, f) for f in src.__dataclass_fields__})
        for i in range(len(NFE_CASES))
    ]
    infos = []

    @jax.jit
    def runs(srcs, key):
        out = []
        for (name, final_zero), src in zip(NFE_CASES, srcs, strict=True):
            grid = edm_grid(n, final_zero=final_zero)
            x, info = SAMPLERS[name](src, key, (2, D), grid=grid, **ALL[name])
            infos.append(info)
            out.append(x)
        return out

    _COUNT.clear()
    _COUNT.update({i: 0 for i in range(len(NFE_CASES))})
    jax.block_until_ready(runs(srcs, jax.random.key(0)))
    jax.effects_barrier()
    for i, ((name, final_zero), info) in enumerate(zip(NFE_CASES, infos, strict=True)):
        expected = {
            "heun": 2 * n - (1 if final_zero else 0),
            "dpmpp_2m": n,
            "euler_maruyama": n,
            "pf_ode_euler": n,
            "pc": n * 3,
            "annealed_langevin": (n if final_zero else n + 1) * 3 + (1 if final_zero else 0),
        }[name]
        assert info["nfe"] == expected == _COUNT[i], (name, final_zero, info["nfe"], _COUNT[i])
        assert isinstance(info["nfe"], int)


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_same_key_same_samples_and_batch_split():
    """Every sampler: the same key gives the same samples (two runs of one compiled
    program); halves drawn with first_index give the samples of the whole batch; another
    key gives other samples. The samplers' batches of 6 are one ``jax.jit`` (called with
    each key), their halves another."""
    src = G.source(PROCESSES["subvp"])
    grid = edm_grid(5)

    @jax.jit
    def whole(src, key):
        return {k: f(src, key, (6, D), grid=grid, **ALL[k])[0] for k, f in SAMPLERS.items()}

    @jax.jit
    def halves(src, key):
        return {
            k: [f(src, key, (3, D), grid=grid, first_index=i, **ALL[k])[0] for i in (0, 3)]
            for k, f in SAMPLERS.items()
        }

    key = jax.random.key(7)
    a, b, h = whole(src, key), whole(src, key), halves(src, key)
    c = whole(src, jax.random.key(8))
    for name in SAMPLERS:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)
        # per-example keys by fold_in: halves drawn with first_index give the same samples
        np.testing.assert_allclose(
            np.concatenate(h[name]), a[name], rtol=1e-5, atol=1e-5, err_msg=name
        )
        # and the key matters (the prior draw, and the step noise where there is any)
        assert np.min(np.abs(np.asarray(c[name]) - np.asarray(a[name])).max(axis=1)) > 1e-3, name


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="blocks are used on XLA:CPU only")
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_cpu_blocks_give_the_samples_of_one_batch(monkeypatch):
    """On CPU a batch larger than ``driver.CPU_CHUNK`` runs in blocks (``lax.map``) and a
    remainder: every sampler gives the samples of the whole batch at once, with
    ``first_index`` and with ``x_T`` (10 examples in blocks of 4: two blocks and 2 left)."""
    src = G.source(PROCESSES["vp"])
    grid = edm_grid(4)
    key = jax.random.key(3)
    x_T = jax.random.normal(jax.random.key(4), (10, D))

    def draw():
        return {
            k: [
                f(src, key, (10, D), grid=grid, first_index=3, **ALL[k])[0],
                f(src, key, (10, D), grid=grid, x_T=x_T, **ALL[k])[0],
            ]
            for k, f in SAMPLERS.items()
        }

    def loops():  # the scans of one heun run: its steps, and the blocks when there are any
        run = lambda: SAMPLERS["heun"](src, key, (10, D), grid=grid)[0]
        return str(jax.make_jaxpr(run)()).count("scan[")

    out, n_loops = {}, {}
    for chunk in (None, 4):
        monkeypatch.setattr(driver, "CPU_CHUNK", chunk)
        n_loops[chunk] = loops()
        out[chunk] = jax.jit(draw)()
    assert n_loops == {None: 1, 4: 3}  # steps; blocks, their steps and the remainder's
    for name in SAMPLERS:
        for whole, blocks in zip(out[None][name], out[4][name], strict=True):
            np.testing.assert_allclose(blocks, whole, rtol=1e-6, atol=1e-6, err_msg=name)


def test_raw_uint32_keys_are_accepted():
    src = G.source(PROCESSES["edm"])
    a, _ = SAMPLERS["euler_maruyama"](src, jax.random.PRNGKey(3), (2, D), grid=edm_grid(3))
    assert np.all(np.isfinite(np.asarray(a)))


def test_heun_restart_from_grid_tail_is_the_same_run():
    """Stopping at grid index k and restarting on grid[k:] from that state is the same run."""
    src = G.source(PROCESSES["vp"])
    grid = edm_grid(8)
    key = jax.random.key(1)
    whole, _ = SAMPLERS["heun"](src, key, (4, D), grid=grid)
    k = 3
    head, _ = SAMPLERS["heun"](src, key, (4, D), grid=grid[: k + 1])
    tail, info = SAMPLERS["heun"](src, key, (4, D), grid=grid[k:], x_T=head)
    np.testing.assert_allclose(tail, whole, rtol=1e-5, atol=1e-5)
    assert info["nfe"] == 2 * (8 - k) - 1


def test_float64_state_and_no_x64_leak():
    src64 = G.source(PROCESSES["vp"], x64=True)
    x_T = np.random.default_rng(0).normal(size=(2, D)) * 80.0
    x, _ = SAMPLERS["dpmpp_2m"](
        src64, jax.random.key(0), (2, D), grid=edm_grid(3), x_T=x_T, float64=True
    )
    assert x.dtype == np.float64
    assert not jax.config.jax_enable_x64
    assert jnp.zeros(1).dtype == jnp.float32
    y, _ = SAMPLERS["dpmpp_2m"](
        G.source(PROCESSES["vp"]), jax.random.key(0), (2, D), grid=edm_grid(3), x_T=x_T
    )
    assert y.dtype == np.float32
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-4)
