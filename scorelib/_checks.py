"""Argument checks shared by the library: one message, ``<field> must be <allowed>; got <v>``.

Every public constructor and function that takes a user-facing option validates it with
these helpers on the host, before anything is traced or compiled, so that an error names
the config field (``sampler.S_churn``, ``process.sigma_min``, ``optim.lr``) and the allowed
range.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

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
