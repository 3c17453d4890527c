"""The sampler driver: one validated, compiled entry shared by every sampler.

A sampler is a :class:`StepRule` (its step, in a few lines that follow the paper) wrapped
in a :class:`Sampler`, the callable with the library signature::

    sample(source, key, shape, *, grid, x_T=None, first_index=0, float64=False, **opts)
        -> (x, info)

The driver (``Sampler.__call__`` and the compiled ``_run``) owns everything that is not
the step itself:

* validation, on the host, before anything is traced or compiled: the common arguments,
  the key, then the options (an option the sampler does not declare is refused);
* float64 scoping (``jax.enable_x64`` inside the call only) and the dtype of the grid;
* the per-example keys and the start state (below);
* the ``lax.scan`` over the rule's steps, between its ``init`` and ``final`` hooks;
* ``info = {"nfe": ..., "steps": N}``, ``nfe`` a Python int from the rule's count;
* on XLA:CPU, the speed settings that give the same samples: a batch larger than
  :data:`CPU_CHUNK` runs in blocks of that many examples, and the compiled program takes
  :data:`CPU_COMPILER_OPTIONS` (BENCHMARKS.md, "scorelib vs k-diffusion").

Key scheme (relied on by tests and by anyone who reproduces a draw): example ``b`` of a
call owns ``k_b = fold_in(key, first_index + b)`` (:func:`scorelib.keys.example_keys`).
Its starting draw is ``normal(fold_in(k_b, 0), data_shape)``; scan index ``i`` (a grid
step, or a noise level for annealed Langevin; 0-based) draws
``normal(fold_in(fold_in(k_b, i + 1), j), data_shape)`` for its ``j``-th noise vector
(``j = 0`` first). The source is bound to the same examples before it is called,
``source.for_examples(key, batch, first_index)`` (per block of examples on XLA:CPU): a
random source's draws and a conditional source's labels follow the global index too. So a
sample does not depend on the batch or block it was drawn in, only on ``key`` and its
global index.

Adding a sampler: write a ``StepRule`` subclass (``options``, ``stochastic`` or
``is_stochastic``, ``default_grid``, ``check``, ``nfe``, ``init``, ``scan_inputs``, ``step``,
``final``), wrap it
with ``Sampler(MyRule())`` and add it to ``SAMPLERS`` in ``scorelib/samplers/__init__.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_int, note_text, require
from scorelib.keys import example_keys
from scorelib.scores.base import ScoreSource

Array = Any

DRIVER_OPTIONS: Mapping[str, Any] = {"unroll": 1}
"""Options every sampler takes from the driver: ``unroll``, the ``lax.scan`` unroll factor."""


# --------------------------------------------------------------------------- host side
def check_common(source, shape, grid, x_T, first_index, float64) -> tuple[tuple, np.ndarray]:
    """Validate the arguments shared by every sampler; return ``(shape, grid)``.

    ``grid`` comes back as a float64 numpy array.

    Raises:
      ValueError: naming ``source``, ``shape``, ``sampler.grid``, ``x_T``, ``first_index``
        or ``float64``.
    """
    require(
        isinstance(source, ScoreSource), "source", "a scorelib ScoreSource", type(source).__name__
    )
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"shape must be a tuple (batch, *data_shape); got {shape!r}") from None
    require(
        len(shape) >= 1 and all(s >= 1 for s in shape),
        "shape",
        "(batch, *data_shape) with every size >= 1",
        shape,
    )
    data_shape, note = source.expected_data_shape()
    if data_shape and tuple(data_shape) != shape[1:]:
        require(False, "shape[1:]", f"{tuple(data_shape)}{note_text(note)}", shape)
    g = np.asarray(grid, dtype=np.float64)
    require(
        g.ndim == 1 and g.shape[0] >= 2,
        "sampler.grid",
        "1-D with at least 2 points (N + 1 for N >= 1 steps)",
        f"shape {g.shape}",
    )
    require(bool(np.all(np.isfinite(g))), "sampler.grid", "finite", g)
    require(
        bool(np.all(g[:-1] > 0) and g[-1] >= 0),
        "sampler.grid",
        "VE noise levels > 0, except the last which may be exactly 0",
        g,
    )
    cast = g.astype(np.float64 if float64 else np.float32)
    require(
        bool(np.all(np.diff(cast) < 0)),
        "sampler.grid",
        "strictly decreasing"
        + ("" if float64 else " in float32 (use float64=True for finer grids)"),
        g,
    )
    if x_T is not None and tuple(np.shape(x_T)) != shape:
        raise ValueError(f"x_T must have shape {shape} (= shape); got {tuple(np.shape(x_T))}")
    check_int(first_index, "first_index", low=0)
    require(isinstance(float64, bool), "float64", "a bool", float64)
    return shape, g


def check_key(key) -> None:
    """Raise ``ValueError`` unless ``key`` is one typed PRNG key or one raw ``uint32[2]`` key."""
    dtype = getattr(key, "dtype", None)
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    raw = dtype == np.uint32 and tuple(np.shape(key)) == (2,)
    require(
        (typed and np.shape(key) == ()) or raw,
        "key",
        "one PRNG key (jax.random.key(seed) or jax.random.PRNGKey(seed))",
        f"{type(key).__name__} of shape {np.shape(key)}",
    )


def x64_scope(float64: bool):
    """``jax.enable_x64(True)`` when ``float64`` (scoped: nothing leaks out), else a no-op."""
    return jax.enable_x64(True) if float64 else contextlib.nullcontext()


# --------------------------------------------------------------------------- traced side
def step_keys(keys: jax.Array, i: Array) -> jax.Array:
    """Per-example keys of scan index ``i`` (0-based): ``fold_in(k_b, i + 1)``, ``[batch]``."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i + 1)


def normal(keys: jax.Array, j: Array, data_shape: tuple, dtype) -> Array:
    """``[batch, *data_shape]`` standard normals, example ``b`` from ``fold_in(keys[b], j)``."""

    def one(k):
        return jax.random.normal(jax.random.fold_in(k, j), data_shape, dtype)

    return jax.vmap(one)(keys)


def initial_state(process, keys, sigma0, x_T, shape, dtype) -> Array:
    """The starting state ``[batch, *data_shape]`` in process coordinates at VE level ``sigma0``.

    ``x_T`` when given; else ``alpha(t0) * sigma0 * eps`` with ``eps`` from
    ``fold_in(k_b, 0)``: the noise-only approximation of ``p_{t0}`` (Karras et al.
    2022, Algorithm 1 line 2, ``x_0 ~ N(0, t_0^2 I)``, mapped to the process frame).
    When the grid starts at the process's ``t_max`` this is the process prior
    ``N(0, prior_std^2 I)`` (exactly for VE and EDM; for VP and sub-VP up to
    ``sigma(t_max) = 1 - O(alpha(t_max)^2)``).
    """
    if x_T is not None:
        return jnp.asarray(x_T, dtype)
    t0 = process.t_of_ve_sigma(sigma0)
    scale = process.alpha(t0) * sigma0
    return (scale * normal(keys, 0, shape[1:], dtype)).astype(dtype)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a step rule sees inside the compiled sampler (built at trace time, never passed
    through ``jit``).

    Fields:
      source: the score source (``source.process`` is the process).
      grid: ``[N + 1]`` VE noise levels in the run's dtype.
      keys: ``[batch]`` per-example keys ``k_b``.
      shape: ``(batch, *data_shape)``.
      final_zero: whether ``grid[-1] == 0``.
      opts: the rule's validated options (name -> value; Python scalars).
      unroll: the ``lax.scan`` unroll factor.
      tables: arrays the rule precomputed once over the grid (``StepRule.tables``).
    """

    source: ScoreSource
    grid: Array
    keys: jax.Array
    shape: tuple
    final_zero: bool
    opts: Mapping[str, Any]
    unroll: int
    tables: Mapping[str, Array] = dataclasses.field(default_factory=dict)

    @property
    def process(self):
        """The source's noise process."""
        return self.source.process

    @property
    def n(self) -> int:
        """The number of grid steps ``N``."""
        return self.grid.shape[0] - 1

    @property
    def dtype(self):
        """The state's dtype (float32, or float64 under ``float64=True``)."""
        return self.grid.dtype

    @property
    def data_shape(self) -> tuple:
        """The shape of one sample, ``shape[1:]``."""
        return self.shape[1:]

    def step_keys(self, i: Array) -> jax.Array:
        """``[batch]`` keys ``fold_in(k_b, i + 1)`` of scan index ``i``."""
        return step_keys(self.keys, i)

    def noise(self, i: Array, j: Array = 0) -> Array:
        """The ``j``-th noise draw of scan index ``i``, ``[batch, *data_shape]``."""
        return normal(self.step_keys(i), j, self.data_shape, self.dtype)

    def ve_alpha(self, sigma: Array) -> Array:
        """``alpha(t(sigma))`` at a VE level ``sigma > 0``."""
        return self.process.alpha(self.process.t_of_ve_sigma(sigma))

    def ve_denoiser(self, x_ve: Array, sigma: Array) -> Array:
        """``D(alpha x_ve, t(sigma))``: the denoiser in the VE frame at level ``sigma > 0``."""
        t = self.process.t_of_ve_sigma(sigma)
        return self.source.denoiser(self.process.alpha(t) * x_ve, t)


class StepRule:
    """One sampler's numerics: how to start, one scanned step, how to finish.

    The driver calls, inside one compiled function::

        ctx = Context(..., tables=rule.tables(ctx))
        carry = rule.init(ctx, x)          # x: start state, process coordinates, grid[0]
        for xs_i in rule.scan_inputs(ctx):   # one lax.scan over the leading axis
            carry = rule.step(ctx, carry, xs_i)
        x = rule.final(ctx, carry)         # process coordinates at grid[-1]

    ``scan_inputs`` gives what each scanned step reads (its index and levels or times,
    sliced from the grid: Heun's ``(arange(m), grid[:m], grid[1:m + 1])``), so a step reads
    ``(t_i, t_{i+1})`` from the grid, never recomputes it; the steps it leaves out (a
    last step to ``sigma = 0``, a first-order first step) are done by ``init``/``final``.

    Class attributes:
      name: the registry name.
      options: option name -> default (what ``**opts`` may hold besides ``unroll``).
      stochastic: whether the output depends on the step noise (not a function of
        ``x_T`` alone); rules whose answer depends on their options override
        :meth:`is_stochastic` instead.
      unroll_scan: whether the driver's scan takes the ``unroll`` option (a rule with an
        inner loop may apply it there instead).
      default_grid: the grid (a name of ``grids.GRIDS``) the sampler is run on unless told
        otherwise (the paper's discretisation: EDM's rho-schedule for Heun).
    """

    name: ClassVar[str]
    options: ClassVar[Mapping[str, Any]] = {}
    stochastic: ClassVar[bool]
    unroll_scan: ClassVar[bool] = True
    default_grid: ClassVar[str] = "edm"

    def is_stochastic(self, opts: Mapping[str, Any]) -> bool:
        """Whether a run with the validated options ``opts`` draws step noise."""
        return self.stochastic

    def check(self, opts: dict, grid: np.ndarray | None) -> dict:
        """Validate ``opts`` (every declared option present) on the host; return them as
        Python scalars. ``grid`` is the run's float64 grid, or ``None`` when only the
        options are checked (``Sampler.is_stochastic``). Raises ``ValueError`` naming
        ``sampler.<option>``."""
        return opts

    def nfe(self, n: int, final_zero: bool, opts: Mapping[str, Any]) -> int:
        """Score or denoiser evaluations of one run over ``n`` steps."""
        raise NotImplementedError

    def tables(self, ctx: Context) -> dict:
        """Arrays computed once over the grid (e.g. process times), kept in ``ctx.tables``."""
        return {}

    def init(self, ctx: Context, x: Array) -> Any:
        """The carry before the scan, from the start state ``x``."""
        raise NotImplementedError

    def scan_inputs(self, ctx: Context) -> Any:
        """A pytree of arrays with one leading entry per scanned step (length 0 allowed)."""
        raise NotImplementedError

    def step(self, ctx: Context, carry: Any, xs: Any) -> Any:
        """One scanned step, given its slice ``xs`` of ``scan_inputs``."""
        raise NotImplementedError

    def final(self, ctx: Context, carry: Any) -> Array:
        """The result in process coordinates at ``grid[-1]`` from the carry after the scan."""
        raise NotImplementedError


def _sample(source, keys, grid, x_T, *, rule, opts, shape, final_zero, unroll):
    """One batch: start state, ``init``, one ``lax.scan`` of ``step``, ``final``."""
    ctx = Context(source, grid, keys, shape, final_zero, dict(opts), unroll)
    ctx = dataclasses.replace(ctx, tables=rule.tables(ctx))
    x = initial_state(source.process, keys, grid[0], x_T, shape, grid.dtype)
    carry = rule.init(ctx, x)
    carry, _ = jax.lax.scan(
        lambda c, xs: (rule.step(ctx, c, xs), None),
        carry,
        rule.scan_inputs(ctx),
        unroll=unroll if rule.unroll_scan else 1,
    )
    return rule.final(ctx, carry)


def _run(source, key, grid, x_T, first_index, *, rule, opts, shape, final_zero, unroll, chunk):
    """The compiled sampler: :func:`_sample` on the whole batch, or (``chunk`` set, smaller
    than the batch) on consecutive blocks of ``chunk`` examples one after the other
    (``lax.map``) and the remainder. Each block gets its own examples' keys and the source
    bound to them, ``source.for_examples(key, block, first_index + offset)`` (a random
    source's draws, a conditional source's labels; the source itself when it has neither),
    so every example's result depends on ``key`` and its global index only, never on its
    batch or block. ``opts`` is a sorted tuple of ``(name, value)`` (static)."""
    kw = dict(rule=rule, opts=opts, final_zero=final_zero, unroll=unroll)
    batch = shape[0]

    def block(start, size, x0):
        keys = example_keys(key, size, start)
        bound = source.for_examples(key, size, start)
        return _sample(bound, keys, grid, x0, shape=(size, *shape[1:]), **kw)

    if chunk is None or chunk >= batch:
        return block(first_index, batch, x_T)
    n, rest = divmod(batch, chunk)
    head = n * chunk
    starts = first_index + chunk * jnp.arange(n, dtype=jnp.int32)
    xs = None if x_T is None else x_T[:head].reshape(n, chunk, *shape[1:])
    out = jax.lax.map(lambda a: block(a[0], chunk, a[1]), (starts, xs))
    out = out.reshape(head, *shape[1:])
    if rest == 0:
        return out
    tail = block(first_index + head, rest, None if x_T is None else x_T[head:])
    return jnp.concatenate([out, tail])


CPU_CHUNK: int | None = int(os.environ.get("SCORELIB_CPU_CHUNK", "1024")) or None
"""On XLA:CPU, the sampler runs a batch larger than this in consecutive blocks of this many
examples (``None``: never), so that the network's activations stay in the core's cache; the
samples are the same (BENCHMARKS.md, "scorelib vs k-diffusion")."""


def cpu_chunk(source) -> int | None:
    """The CPU block size for ``source``: :data:`CPU_CHUNK` divided by its
    ``batch_multiple()`` (classifier-free guidance's batched call doubles the network's
    batch), at least 1; ``None`` when blocks are off. BENCHMARKS.md, "Guided sampling"."""
    if CPU_CHUNK is None:
        return None
    return max(1, CPU_CHUNK // source.batch_multiple())


CPU_COMPILER_OPTIONS: Mapping[str, Any] = {"xla_cpu_experimental_ynn_fusion_type": ""}
"""XLA:CPU options of the compiled sampler: matmuls through Eigen instead of YNNPACK (the
same results, faster at these shapes; BENCHMARKS.md). Left out when ``XLA_FLAGS`` sets the
option, or when the installed jaxlib does not know it."""


@functools.cache
def _compiled_run(backend: str):
    """``_run`` jit-compiled for ``backend``, with :data:`CPU_COMPILER_OPTIONS` on CPU."""
    static = ("rule", "opts", "shape", "final_zero", "unroll", "chunk")
    options = cpu_compiler_options() if backend == "cpu" else {}
    return jax.jit(_run, static_argnames=static, compiler_options=options or None)


@functools.cache
def cpu_compiler_options() -> dict:
    """:data:`CPU_COMPILER_OPTIONS`, less those that ``XLA_FLAGS`` sets and those the
    installed jaxlib refuses (checked once by compiling a trivial function)."""
    flags = os.environ.get("XLA_FLAGS", "")
    options = {k: v for k, v in CPU_COMPILER_OPTIONS.items() if k not in flags}
    try:
        jax.jit(lambda a: a + 1, compiler_options=options).lower(1.0).compile()
    except Exception:  # noqa: BLE001 - an older or newer jaxlib without the option
        return {}
    return options


_SIGNATURE_HEAD = [
    inspect.Parameter("source", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("key", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("shape", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("grid", inspect.Parameter.KEYWORD_ONLY),
    inspect.Parameter("x_T", inspect.Parameter.KEYWORD_ONLY, default=None),
    inspect.Parameter("first_index", inspect.Parameter.KEYWORD_ONLY, default=0),
    inspect.Parameter("float64", inspect.Parameter.KEYWORD_ONLY, default=False),
]


class Sampler:
    """A registered sampler: a :class:`StepRule` behind the driver, with the library signature.

    ``sampler(source, key, shape, *, grid, x_T=None, first_index=0, float64=False, **opts)
    -> (x, info)``: ``source`` a ``ScoreSource``, ``key`` one PRNG key (typed or raw),
    ``shape = (batch, *data_shape)``, ``grid`` ``[N + 1]`` strictly decreasing VE noise
    levels (last ``>= 0``), ``x_T`` an optional ``shape`` start state in process
    coordinates at ``grid[0]``, ``first_index >= 0`` the global index of the first
    example. ``x`` has ``shape``, in process coordinates at ``grid[-1]`` (the data frame
    when it is 0); ``info = {"nfe": int, "steps": N}``.

    Attributes:
      name: the registry name.
      options: option name -> default, ``unroll`` included.
      default_grid: the grid it is run on unless told otherwise (``StepRule.default_grid``).
      rule: the :class:`StepRule`.

    Raises (when called):
      ValueError: ``sampler.<opt> is not used by sampler <name> (its options: ...)`` for
        an option the sampler does not declare, or naming the argument or
        ``sampler.<option>`` for an invalid value; all before anything is compiled.
    """

    def __init__(self, rule: StepRule):
        self.rule = rule
        self.name = rule.name
        self.options: Mapping[str, Any] = {**rule.options, **DRIVER_OPTIONS}
        self.default_grid: str = rule.default_grid
        self.__name__ = self.__qualname__ = rule.name
        self.__doc__ = rule.__doc__
        self.__module__ = type(rule).__module__
        self.__signature__ = inspect.Signature(
            _SIGNATURE_HEAD
            + [
                inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v)
                for k, v in self.options.items()
            ]
        )

    def __repr__(self) -> str:
        return f"<sampler {self.name}>"

    def with_defaults(self, opts: Mapping[str, Any]) -> dict:
        """``opts`` completed with the defaults; refuses an option this sampler does not use.

        Raises:
          ValueError: ``sampler.<opt> is not used by sampler <name> (its options: ...)``.
        """
        for k in opts:
            if k not in self.options:
                raise ValueError(
                    f"sampler.{k} is not used by sampler {self.name} "
                    f"(its options: {', '.join(self.options) or 'none'})"
                )
        return {**self.options, **opts}

    def _checked(self, opts: Mapping[str, Any], grid: np.ndarray | None) -> tuple[dict, int]:
        opts = self.with_defaults(opts)
        unroll = check_int(opts.pop("unroll"), "sampler.unroll", low=1)
        return self.rule.check(opts, grid), unroll

    def is_stochastic(self, **opts) -> bool:
        """Whether the output with these options depends on step noise, i.e. is not a
        function of ``x_T`` alone (Heun: ``S_churn > 0``; the SDE samplers: always).

        Raises:
          ValueError: for an option the sampler does not use or an invalid value.
        """
        return bool(self.rule.is_stochastic(self._checked(opts, None)[0]))

    def __call__(self, source, key, shape, *, grid, x_T=None, first_index=0, float64=False, **opts):
        shape, g = check_common(source, shape, grid, x_T, first_index, float64)
        check_key(key)
        opts, unroll = self._checked(opts, g)
        n, final_zero = g.shape[0] - 1, bool(g[-1] == 0)
        with x64_scope(float64):
            dtype = jnp.float64 if float64 else jnp.float32
            backend = jax.default_backend()
            args = (source, key, jnp.asarray(g, dtype), x_T, first_index)
            static = dict(
                rule=self.rule,
                opts=tuple(sorted(opts.items())),
                shape=shape,
                final_zero=final_zero,
                unroll=unroll,
                chunk=cpu_chunk(source) if backend == "cpu" else None,
            )
            try:
                x = _compiled_run(backend)(*args, **static)
            except ValueError as e:  # inside a caller's jax.jit: its compiler options apply
                if "compiler_options" not in str(e):
                    raise
                x = _compiled_run("nested")(*args, **static)
        return x, {"nfe": int(self.rule.nfe(n, final_zero, opts)), "steps": n}


def declared_stochastic(sampler, opts: Mapping[str, Any]) -> bool:
    """The declared property of ``sampler`` called with ``opts``: a :class:`Sampler`, or a
    ``functools.partial`` of one (its bound keywords count as options).

    Raises:
      ValueError: when ``sampler`` declares no property (a plain function, a wrapper), so
        that no caller silently treats it as deterministic; or for an option it refuses.
    """
    if isinstance(sampler, functools.partial):
        return declared_stochastic(sampler.func, {**sampler.keywords, **opts})
    if not isinstance(sampler, Sampler):
        raise ValueError(
            f"the sampler {sampler!r} declares no stochastic/deterministic property: pass a "
            "registered sampler (scorelib.samplers.get_sampler(name)) or a functools.partial "
            "of one, or say which start to use (teleport.start='ode' or 'marginal')"
        )
    return sampler.is_stochastic(**opts)
