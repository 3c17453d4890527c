"""Argument checks shared by the library: one message, ``<field> must be <allowed>; got <v>``.

Every public constructor and function that takes a user-facing option validates it with
these helpers on the host, before anything is traced or compiled, so that an error names
the config field (``sampler.S_churn``, ``process.sigma_min``, ``optim.lr``) and the allowed
range.

Array arguments are checked the same way, on their static shapes and dtypes (free at
trace time, no host sync): ``<field> must have shape [batch, 2] (<where that comes
from>); got shape (3, 1)``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax.numpy as jnp
import numpy as np

#: The longest ``got <value>`` an error message shows (an array of 500 grid points is cut).
MAX_SHOWN = 120


def shown(value: Any) -> str:
    """``repr(value)``, its middle cut to fit :data:`MAX_SHOWN` characters."""
    text = repr(value)
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[: MAX_SHOWN - 25]} ... {text[-20:]}"


def require(cond: bool, field: str, allowed: str, value: Any) -> None:
    """Raise ``ValueError('<field> must be <allowed>; got <value!r>')`` unless ``cond``
    (a long value shown cut: :func:`shown`)."""
    if not cond:
        raise ValueError(f"{field} must be {allowed}; got {shown(value)}")


def is_real(value: Any) -> bool:
    """A real number that is not a bool (numpy scalars included; strings excluded)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    """An integer that is not a bool (numpy integers included)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_real(
    value: Any,
    field: str,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
) -> float:
    """``value`` as a float, required to lie in the interval ``low .. high``.

    ``low_open`` / ``high_open`` exclude the end points. Infinite values are refused (an
    infinite end is then open) unless ``allow_inf`` (e.g. EDM's ``S_max = inf``).

    Raises:
      ValueError: ``<field> must be a number in (low, high]; got <value>`` for a non-number,
        NaN, a bool, a string, an infinity (unless allowed) or a value outside the interval.
    """
    if not allow_inf:
        low_open = low_open or math.isinf(low)
        high_open = high_open or math.isinf(high)
    ok = is_real(value)
    v = float(value) if ok else math.nan
    ok = ok and not math.isnan(v) and (allow_inf or math.isfinite(v))
    ok = ok and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
    require(ok, field, f"a number in {lo}{low}, {high}{hi}", value)
    return v


def check_int(value: Any, field: str, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (either end optional).

    Raises:
      ValueError: naming ``field`` for a non-integer (bools and floats included) or a value
        out of range.
    """
    ok = is_int(value) and (low is None or value >= low) and (high is None or value <= high)
    if low is not None and high is not None:
        allowed = f"an integer in [{low}, {high}]"
    elif low is not None:
        allowed = f"an integer >= {low}"
    elif high is not None:
        allowed = f"an integer <= {high}"
    else:
        allowed = "an integer"
    require(ok, field, allowed, value)
    return int(value)


def check_choice(value: Any, field: str, choices) -> Any:
    """``value`` if it is one of ``choices``.

    Raises:
      ValueError: ``<field> must be one of [...]; got <value>``.
    """
    require(value in tuple(choices), field, f"one of {list(choices)}", value)
    return value


# --------------------------------------------------------------------------- array arguments
# Shape patterns: a tuple whose entries are an int (that size), a name (a size >= 1, the
# same wherever the name recurs) or ``"*name"`` (a run of one or more axes, the same run
# wherever it recurs). Checks read static shapes and dtypes only: no host sync, free at
# trace time inside ``jit``.


def array_shape(x: Any) -> tuple[int, ...]:
    """The static shape of an array, a tracer, a scalar or a nested list."""
    return tuple(int(s) for s in np.shape(x))


def array_dtype(x: Any):
    """The dtype of an array or tracer (of ``np.asarray(x)`` for scalars and lists)."""
    dtype = getattr(x, "dtype", None)
    return np.asarray(x).dtype if dtype is None else dtype


def format_shape(pattern, sizes: dict | None = None) -> str:
    """``("batch", 2)`` -> ``[batch, 2]``; names bound in ``sizes`` are shown with their size."""
    sizes = sizes or {}
    parts = []
    for p in pattern:
        name = p[1:] if isinstance(p, str) and p.startswith("*") else p
        if isinstance(p, str) and name in sizes:
            parts.append(f"{p}={sizes[name]}")
        else:
            parts.append(str(p))
    return "[" + ", ".join(parts) + "]"


def note_text(note) -> str:
    """A note of :func:`check_shape`: the string, or what the callable writes."""
    return note() if callable(note) else note


def _match(shape: tuple, pattern: tuple, sizes: dict) -> bool:
    """Match ``shape`` against ``pattern``, binding names into ``sizes`` (updated in place)."""
    stars = [i for i, p in enumerate(pattern) if isinstance(p, str) and p.startswith("*")]
    if len(stars) > 1:
        raise TypeError(f"a shape pattern has at most one '*name' run; got {pattern}")
    if stars:
        i = stars[0]
        head, tail = pattern[:i], pattern[i + 1 :]
        run = len(shape) - len(head) - len(tail)
        if run < 1:
            return False
        name = pattern[i][1:]
        got = shape[i : i + run]
        if sizes.setdefault(name, got) != got:
            return False
        return _match(shape[:i], head, sizes) and _match(shape[i + run :], tail, sizes)
    if len(shape) != len(pattern):
        return False
    for s, p in zip(shape, pattern, strict=True):
        if isinstance(p, str):
            if s < 1 or sizes.setdefault(p, s) != s:
                return False
        elif s != p:
            return False
    return True


def check_shape(x: Any, field: str, pattern, *, sizes: dict | None = None, note="") -> dict:
    """Require ``x``'s static shape to match ``pattern``; return the sizes of its names.

    Args:
      x: an array, tracer, scalar or nested list.
      field: the argument's name, for the message.
      pattern: e.g. ``("batch", 2)``, ``("batch", "*data_shape")``, ``()`` (a scalar).
      sizes: names already bound (e.g. ``batch`` from another argument); not modified.
      note: what the expected shape comes from, appended to it (e.g. ``" (the training
        set's points, data [8, 2])"``); a callable is called only to write the error.

    Returns:
      ``sizes`` with this argument's names added (``"*name"`` runs as tuples).

    Raises:
      ValueError: ``<field> must have shape <pattern><note>; got shape <shape>``.
    """
    shape = array_shape(x)
    bound = dict(sizes or {})
    if not _match(shape, tuple(pattern), bound):
        raise ValueError(
            f"{field} must have shape {format_shape(pattern, sizes)}{note_text(note)}; "
            f"got shape {shape}"
        )
    return bound


def check_real_dtype(x: Any, field: str):
    """``x``'s dtype, required to be a real number type (floating or integer).

    Raises:
      ValueError: ``<field> must be a real (floating or integer) array; got dtype <dtype>``
        for bool, complex, string, object and PRNG-key arrays.
    """
    dtype = array_dtype(x)
    try:
        ok = jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{field} must be a real (floating or integer) array; got dtype {dtype}")
    return dtype


def check_array(x: Any, field: str, pattern, *, sizes: dict | None = None, note="") -> dict:
    """:func:`check_real_dtype` then :func:`check_shape` (same arguments and return)."""
    check_real_dtype(x, field)
    return check_shape(x, field, pattern, sizes=sizes, note=note)


def check_time(t: Any, field: str, batch: int) -> None:
    """Require a real scalar or ``[batch]`` time (or noise level) ``t``.

    Raises:
      ValueError: ``<field> must have shape [] or [batch=<batch>]; got shape ...``, or for
        a dtype that is not real.
    """
    check_real_dtype(t, field)
    shape = array_shape(t)
    if shape not in ((), (batch,)):
        raise ValueError(
            f"{field} must be a scalar or have shape [batch={batch}]; got shape {shape}"
        )


def check_example_sets(x: Any, y: Any, fields: tuple[str, str] = ("x", "y")) -> dict:
    """Require two real sets of examples of one shape: ``x: [n, *shape]``, ``y: [m, *shape]``.

    Returns:
      ``{"n": n, "m": m, "shape": shape}``.

    Raises:
      ValueError: naming the first field (not real, or fewer than 2 axes) or the second
        (``y must have shape [m, *shape=(2,)] (the example shape of x); got shape (7, 3)``).
    """
    fx, fy = fields
    sizes = check_array(x, fx, ("n", "*shape"))
    return check_array(
        y,
        fy,
        ("m", "*shape"),
        sizes={"shape": sizes["shape"]},
        note=f" (the example shape of {fx})",
    ) | {"n": sizes["n"]}


def check_arrays(pattern, **arrays) -> dict:
    """Require real arrays of one shape matching ``pattern``: the first binds its names,
    the others must match it (``check_arrays(("batch", "*data_shape"), g=g, x_fake=x)``).

    Returns:
      the sizes of the names of ``pattern``.

    Raises:
      ValueError: naming the first array that does not fit (``x_fake must have shape
        [batch=4, *data_shape=(2,)] (the shape of g); got shape (4, 1)``).
    """
    (first, a0), *rest = arrays.items()
    sizes = check_array(a0, first, pattern)
    for name, a in rest:
        check_array(a, name, pattern, sizes=sizes, note=f" (the shape of {first})")
    return sizes
