"""Pytree registration shared by the library's frozen-dataclass components."""

from __future__ import annotations

import jax


def static_pytree(cls):
    """Register ``cls`` as a static (leafless) pytree and return it (a class decorator).

    Processes, objectives, targets and EMA settings are frozen dataclasses of Python
    scalars and small numpy arrays: as static pytrees they pass through ``jax.jit`` as
    part of the compiled function's identity (equal, hashable values compile once),
    never as traced arrays.
    """
    jax.tree_util.register_static(cls)
    return cls
