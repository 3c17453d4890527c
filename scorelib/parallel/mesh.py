"""A data-parallel device mesh: batches split along ``data``, parameters by explicit rules.

The mesh spans every device of every process (``jax.devices()``, not the local ones), one
axis named ``data``, with ``AxisType.Auto`` (``jax.make_mesh`` now defaults to explicit
axis types, under which indexing a sharded array raises ``ShardingTypeError``).

Because every example draws its data and noise from its own key (``scorelib.keys``), a
global batch gives the same loss on 1, 2 or 8 devices, in one process or several, up to
the order of the floating-point reduction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from scorelib._checks import require

DATA_AXIS = "data"

#: The default sharding rules: every parameter and optimizer leaf replicated.
REPLICATE_ALL: tuple[tuple[str, P], ...] = ((r".*", P()),)


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A one-axis mesh ``('data',)`` over ``devices`` (default: all devices of all processes).

    Raises:
      ValueError: ``devices`` is empty.
    """
    devices = list(jax.devices() if devices is None else devices)
    require(len(devices) > 0, "devices", "a non-empty list of devices", devices)
    return Mesh(np.array(devices), (DATA_AXIS,), axis_types=(AxisType.Auto,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Arrays ``[batch, ...]`` split along their first axis over the ``data`` axis."""
    return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    """A whole copy of the array on every device of ``mesh``."""
    return NamedSharding(mesh, P())


def check_batch_size(batch_size: int, mesh: Mesh, field: str = "trainer.batch_size") -> int:
    """The per-device batch; raises ``ValueError`` naming ``field`` unless it divides evenly."""
    n = mesh.size
    require(
        isinstance(batch_size, int) and batch_size >= n and batch_size % n == 0,
        field,
        f"a multiple of the number of devices ({n})",
        batch_size,
    )
    return batch_size // n


def leaf_shardings(tree: Any, mesh: Mesh, rules: Sequence[tuple[str, P]] = REPLICATE_ALL) -> Any:
    """A ``NamedSharding`` for every leaf of ``tree`` by the first rule whose regex matches.

    Args:
      tree: a pytree (a ``TrainState``, parameters, optimizer state).
      mesh: the mesh.
      rules: ``(regex, PartitionSpec)`` pairs matched with ``re.fullmatch`` against the
        leaf's path (``jax.tree_util.keystr``, e.g. ``.params['layers'][0]['kernel'].value``).
        The default replicates everything.

    Returns:
      A pytree of ``NamedSharding`` with the structure of ``tree``.

    Raises:
      ValueError: a leaf that no rule matches (naming its path: nothing is silently
        replicated or split), or a spec with more axes than the leaf has.
    """
    compiled = [(re.compile(pattern), spec) for pattern, spec in rules]

    def pick(path, leaf):
        name = jax.tree_util.keystr(path)
        for pattern, spec in compiled:
            if pattern.fullmatch(name):
                require(
                    len(spec) <= np.ndim(leaf),
                    f"sharding rule {pattern.pattern!r}",
                    f"a spec of at most {np.ndim(leaf)} axes for {name}",
                    spec,
                )
                return NamedSharding(mesh, spec)
        raise ValueError(
            f"no sharding rule matches the leaf {name} (shape {np.shape(leaf)}); "
            f"rules: {[p for p, _ in rules]}"
        )

    return jax.tree_util.tree_map_with_path(pick, tree)


def shard(tree: Any, mesh: Mesh, rules: Sequence[tuple[str, P]] = REPLICATE_ALL) -> Any:
    """``tree`` placed on ``mesh`` by ``rules`` (default: replicated on every device).

    In several processes each process passes the same values (a state built from the
    same seed); every process's devices get their part.

    Raises:
      ValueError: as :func:`leaf_shardings`.
    """
    shardings = leaf_shardings(tree, mesh, rules)
    return jax.tree.map(_place, tree, shardings)


def _place(x, sharding: NamedSharding):
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    # Several processes: build the global array from this process's copy of the value.
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def to_host(tree: Any) -> Any:
    """Every leaf as a numpy array on this host: the gather of a replicated state to one host
    (evaluation and sampling after training run there, on local devices).

    Raises:
      ValueError: a leaf split over the devices of several processes (not replicated).
    """

    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if not x.is_fully_replicated:
                raise ValueError(f"cannot gather an array split over processes: {x.sharding}")
            x = x.addressable_data(0)
        return np.asarray(jax.device_get(x))

    return jax.tree.map(get, tree)
