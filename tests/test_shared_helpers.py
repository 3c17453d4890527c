"""The library's private shared helpers: field checks, atomic writes, static pytrees."""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib import _checks, _io, _pytree


@pytest.mark.parametrize(
    "value, kw, ok",
    [
        (1.0, dict(low=0.0, low_open=True), True),
        (0.0, dict(low=0.0, low_open=True), False),
        (0.0, dict(low=0.0), True),
        (math.inf, dict(low=0.0), False),  # infinities only when allowed
        (math.inf, dict(low=0.0, allow_inf=True), True),
        (-math.inf, dict(allow_inf=True), True),
        (math.inf, dict(low=0.0, high=math.inf, high_open=True), False),
        (math.nan, dict(), False),
        ("1.0", dict(), False),
        (True, dict(), False),
        (np.float32(2.0), dict(high=2.0), True),
        (np.float32(2.0), dict(high=2.0, high_open=True), False),
        (3, dict(low=0.0), True),
    ],
)
def test_check_real(value, kw, ok):
    if ok:
        assert _checks.check_real(value, "f.x", **kw) == float(value)
    else:
        with pytest.raises(ValueError, match=r"^f\.x must be a number in .*; got "):
            _checks.check_real(value, "f.x", **kw)


def test_check_int_and_choice():
    assert _checks.check_int(np.int64(3), "a.n", low=1) == 3
    for bad in (0, 1.0, True, "2"):
        with pytest.raises(ValueError, match=r"^a\.n must be an integer >= 1; got "):
            _checks.check_int(bad, "a.n", low=1)
    with pytest.raises(ValueError, match=r"in \[1, 3\]"):
        _checks.check_int(4, "a.n", low=1, high=3)
    assert _checks.check_choice("x", "a.c", ("x", "y")) == "x"
    with pytest.raises(ValueError, match=r"^a\.c must be one of \['x', 'y'\]; got 'z'$"):
        _checks.check_choice("z", "a.c", ("x", "y"))


@pytest.mark.parametrize(
    "shape, pattern, sizes, ok",
    [
        ((3, 2), ("batch", 2), None, {"batch": 3}),
        ((3, 4, 4, 1), ("batch", "*data_shape"), None, {"batch": 3, "data_shape": (4, 4, 1)}),
        ((3, 2), ("n", "n"), None, None),  # a name is one size wherever it recurs
        ((2, 2), ("n", "n"), None, {"n": 2}),
        ((3, 1), ("batch", 2), None, None),
        ((3,), ("batch", "*data_shape"), None, None),  # a run has at least one axis
        ((0, 2), ("batch", 2), None, None),  # a named size is >= 1
        ((4,), ("batch",), {"batch": 3}, None),
        ((3, 2), ("m", "*shape"), {"shape": (2,)}, {"m": 3, "shape": (2,)}),
        ((), (), None, {}),
    ],
)
def test_check_shape_patterns(shape, pattern, sizes, ok):
    if ok is not None:
        assert _checks.check_shape(np.zeros(shape), "x", pattern, sizes=sizes) == {
            **(sizes or {}),
            **ok,
        }
    else:
        with pytest.raises(ValueError, match=r"^x must have shape \[.*\]; got shape "):
            _checks.check_shape(np.zeros(shape), "x", pattern, sizes=sizes)


def test_array_checks_messages_dtypes_and_tracers():
    with pytest.raises(ValueError) as e:
        _checks.check_shape(np.zeros((3, 1)), "x", ("batch", 2), note=" (the training set's)")
    assert str(e.value) == "x must have shape [batch, 2] (the training set's); got shape (3, 1)"
    with pytest.raises(ValueError) as e:
        _checks.check_example_sets(np.zeros((6, 2)), np.zeros((7, 3)))
    assert str(e.value) == (
        "y must have shape [m, *shape=(2,)] (the example shape of x); got shape (7, 3)"
    )
    with pytest.raises(ValueError, match=r"^h must have shape \[batch=4\] \(the shape of g\)"):
        _checks.check_arrays(("batch",), g=np.zeros(4), h=np.zeros((4, 1)))
    for good in (
        np.zeros(2, np.float32),
        np.zeros(2, np.int64),
        jnp.zeros(2, jnp.bfloat16),
        0.5,
        3,
    ):
        _checks.check_real_dtype(good, "x")
    for bad in (np.zeros(2, bool), np.zeros(2, complex), np.array(["a"]), jax.random.key(0)):
        with pytest.raises(ValueError, match=r"^x must be a real \(floating or integer\) array"):
            _checks.check_real_dtype(bad, "x")
    _checks.check_time(0.5, "t", 3)
    _checks.check_time(np.zeros(3), "t", 3)
    with pytest.raises(ValueError, match=r"^t must be a scalar or have shape \[batch=3\]"):
        _checks.check_time(np.zeros((3, 1)), "t", 3)

    # inside jit the checks read the tracers' static shapes: no host round trip
    @jax.jit
    def f(x):
        return _checks.check_shape(x, "x", ("batch", 2))["batch"] * x

    np.testing.assert_array_equal(f(jnp.ones((3, 2))), 3.0)
    with pytest.raises(ValueError, match=r"^x must have shape \[batch, 2\]; got shape \(3, 1\)"):
        f(jnp.ones((3, 1)))


def test_atomic_write_replaces_whole_and_leaves_old_file_on_error(tmp_path):
    p = tmp_path / "sub" / "f.txt"
    _io.atomic_write_text(p, "old")
    assert p.read_text() == "old"

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with _io.atomic_open(p) as f:
            f.write("half of the new")
            raise Boom
    assert p.read_text() == "old"
    assert sorted(os.listdir(p.parent)) == ["f.txt"]  # no temporary file left

    _io.atomic_savez(tmp_path / "a.npz", x=np.arange(3))
    np.testing.assert_array_equal(np.load(tmp_path / "a.npz")["x"], np.arange(3))
    with pytest.raises(ValueError, match="mode"):
        with _io.atomic_open(p, "a"):
            pass


def test_atomic_writes_get_the_mode_open_would_give(tmp_path):
    """Not mkstemp's 0600: a file written atomically gets a plain open's mode (0666 less the
    umask), so results on a shared cluster reach the group."""
    p = tmp_path / "r.txt"
    with open(tmp_path / "plain.txt", "w") as f:
        f.write("x")
    _io.atomic_write_text(p, "x")
    plain = os.stat(tmp_path / "plain.txt").st_mode & 0o777
    assert os.stat(p).st_mode & 0o777 == plain


def test_static_pytree_is_leafless_and_keys_the_jit_cache():
    @_pytree.static_pytree
    @dataclasses.dataclass(frozen=True)
    class Scale:
        c: float

    assert jax.tree_util.tree_leaves(Scale(2.0)) == []
    traces = []

    @jax.jit
    def f(s, x):
        traces.append(1)
        return s.c * x

    assert float(f(Scale(2.0), jnp.float32(3.0))) == 6.0
    assert float(f(Scale(2.0), jnp.float32(4.0))) == 8.0
    assert float(f(Scale(5.0), jnp.float32(1.0))) == 5.0
    assert len(traces) == 2  # equal static values share one compile; a new value retraces


def test_example_keys_are_fold_in_of_the_global_index():
    from scorelib.keys import example_keys

    key = jax.random.key(3)
    keys = example_keys(key, 4, first_index=5)
    for b in range(4):
        want = jax.random.key_data(jax.random.fold_in(key, 5 + b))
        np.testing.assert_array_equal(jax.random.key_data(keys[b]), want)
    # a batch is a slice of a larger batch: keys depend only on the global index
    big = example_keys(key, 9)
    np.testing.assert_array_equal(jax.random.key_data(big[5:]), jax.random.key_data(keys))
    raw = example_keys(jax.random.PRNGKey(3), 2, jnp.int32(1))
    np.testing.assert_array_equal(raw[0], jax.random.fold_in(jax.random.PRNGKey(3), 1))
    with pytest.raises(ValueError, match="batch must be >= 1"):
        example_keys(key, 0)
