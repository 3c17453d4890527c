"""Suite-wide fixture: each test module starts with no compiled executables left over.

Every executable XLA:CPU compiles keeps about three memory mappings (code, constants, data)
alive for as long as JAX's caches hold it. The whole suite in one process compiles tens of
thousands of them; past the kernel's ``vm.max_map_count`` (65,530 by default) the next
compilation's ``mmap`` fails and XLA dies with a segmentation fault instead of an error
(CI, twice, in tests/teleport, about 930 tests in). Clearing JAX's caches after each module
keeps the count at a few thousand, and the guard below names the module if it ever grows
near the limit again.

Every test computes float32 matmuls in full float32, on a GPU too, and compiles XLA:CPU
code at LLVM's O1 (below).

The suite shares one persistent XLA compilation cache (``.pytest_cache/jax`` of the
checkout, empty on a fresh clone): the entry-point tests start many ``python -m
experiments.*`` processes that compile the same train steps and samplers, and each test
module starts with cleared in-memory caches; both then load the compiled executable from
disk instead of compiling it again. A cached executable is the one XLA would compile.

(Helpers shared between test files live in modules named after them, e.g.
``tests/closed_forms.py``, never here: ``from conftest import`` is ambiguous when several
``conftest.py`` are collected.)
"""

from __future__ import annotations

import gc
import os
from collections import Counter
from pathlib import Path

# Before JAX is imported anywhere (subprocesses of the tests inherit these).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".pytest_cache/jax")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
# float32 matmuls in full float32 on every backend, as every run sets
# (experiments/runs/base.py, MATMUL_PRECISION). XLA:CPU computes them so anyway; on a GPU
# JAX's default is a TF32 pass, under which tests/samplers/test_samplers_accuracy.py failed
# on an H200 (residual variance 2.7e-8 against its bound 1e-8; BENCHMARKS.md, "GPU").
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# XLA:CPU generates code with LLVM's O1 instead of its default O3 (appended to any XLA_FLAGS
# given; subprocesses inherit it, scorelib.parallel.local keeps it, the Slurm tests' jobs get
# it). The suite spends much of its time compiling programs it runs a few times: at O1 a
# random draw of a small conv kernel compiles in 0.16 s instead of about 1 s, the test U-Net's
# train step in 18 s instead of 33, for code that runs about 20% slower (docs/development.md
# gives the suite's times). The two levels compute the same numbers to float32 rounding
# (tests/test_optimisation_level.py).
SUITE_XLA_LEVEL = "--xla_backend_optimization_level=1"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_LEVEL}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

_MAPS = Path("/proc/self/maps")
_MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")


def _map_count() -> int | None:
    """The number of memory mappings of this process (Linux), else None."""
    try:
        with _MAPS.open() as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def _map_limit() -> int | None:
    try:
        return int(_MAX_MAP_COUNT.read_text())
    except (OSError, ValueError):
        return None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables(request):
    yield
    jax.clear_caches()
    gc.collect()
    count, limit = _map_count(), _map_limit()
    if count is not None and limit is not None and count > limit // 2:
        pytest.fail(
            f"{request.module.__name__} leaves {count} memory mappings after clearing JAX's "
            f"caches (vm.max_map_count = {limit}): something keeps compiled executables alive",
            pytrace=False,
        )


@pytest.fixture(autouse=True, scope="session")
def _config_schemas():
    """Hydra's config store holds the generated schemas in every test process, whichever
    test runs first there: the entry points register them when imported, and a test that
    composes a config without importing one would otherwise depend on the order."""
    from experiments.schema import register_configs  # after JAX's cache settings above

    register_configs()


# The slowest test modules, in seconds (`make test` with 3 workers, revision 489de1b, summed
# from `--junitxml`): `make test` hands them to its workers first, then the others, the
# larger first (`--no-loadscope-reorder`: pytest-xdist would otherwise order the modules by
# their number of tests alone, and tests/slurm/test_slurm.py, 6 tests and 4 minutes, started
# near the end). A stale figure changes the order only, never what runs.
SLOWEST_MODULES = {
    "tests/slurm/test_slurm.py": 254,
    "tests/slurm/test_cluster_config.py": 113,
    "tests/scores/test_rdmc.py": 98,
    "tests/integration/test_readme.py": 95,
    "tests/integration/test_distill.py": 89,
    "tests/integration/test_errors.py": 83,
    "tests/parallel/test_parallel.py": 78,
    "tests/integration/test_training_features.py": 62,
    "tests/distill/test_step.py": 61,
    "tests/integration/test_edges.py": 55,
    "tests/integration/test_reproduce_fdistill.py": 54,
    "tests/samplers/test_samplers_finite.py": 54,
}


def pytest_collection_modifyitems(items):
    """Longest first: the modules of :data:`SLOWEST_MODULES`, then the others by their
    number of tests (a stable sort: each module's tests keep their order)."""

    def module(item):
        return item.nodeid.split("::")[0]

    counts = Counter(map(module, items))
    items.sort(key=lambda item: (-SLOWEST_MODULES.get(module(item), 0), -counts[module(item)]))
