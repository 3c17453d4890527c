"""Per-example keys: the one randomness rule of the library.

Example ``b`` of a batch whose first example has global index ``first_index`` draws
everything it needs from ``fold_in(key, first_index + b)``. Data batches, objectives and
samplers all use this rule, so a result depends only on the key and the example's global
index: never on the batch size, on how a batch is split over devices or processes, or on
the other examples of the batch (EDM's per-sample seeds, Karras et al. 2022,
``generate.py``, follow the same idea).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Array = Any


#: The fold-in constant of an example's class label when it is drawn at random
#: (``scorelib.scores.conditional.Labels.uniform``): ``fold_in(k_b, LABEL_SALT)``. The sampler
#: driver uses ``fold_in(k_b, 0)`` for the start and ``fold_in(k_b, i + 1)`` for scan index
#: ``i`` (far below it); random sources use ``2**32 - 1`` (``scorelib/scores/rdmc.py``).
LABEL_SALT = 0x4C41424C  # "LABL"

#: The fold-in constant of label dropout's key, ``fold_in(k_drop, LABEL_DROPOUT_SALT)``
#: (module docstring): far from the small counters of the network's own dropout draws from
#: ``k_drop`` and distinct from :data:`LABEL_SALT`.
LABEL_DROPOUT_SALT = 0x4C44524F  # "LDRO"


def example_keys(key: jax.Array, batch: int, first_index: Array = 0) -> jax.Array:
    """``[batch]`` keys ``fold_in(key, first_index + b)`` for ``b = 0 .. batch - 1``.

    Args:
      key: one PRNG key (typed ``jax.random.key`` or raw ``uint32[2]``).
      batch: the number of examples (a Python int >= 1).
      first_index: the global index of example 0 (a Python int or a traced integer
        scalar >= 0), e.g. ``process_index * batch`` for a process's share of a global
        batch, or the offset of a sampling batch within all samples.

    Returns:
      ``[batch]`` keys of the same kind as ``key``.

    Raises:
      ValueError: if ``batch < 1``.
    """
    if int(batch) < 1:
        raise ValueError(f"batch must be >= 1; got {batch}")
    idx = jnp.asarray(first_index, jnp.uint32) + jnp.arange(int(batch), dtype=jnp.uint32)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, idx)
