"""The import directions of docs/architecture.md that concern the noise levels and the
training stack: samplers never import objectives or training, distillation never imports
samplers (its noise levels come from ``scorelib.processes.noise_levels``)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "scorelib"


def _imports(package: str) -> set[str]:
    """Every ``scorelib.*`` module named by an import anywhere in ``scorelib/<package>/``."""
    out = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("scorelib.")}


@pytest.mark.parametrize(
    "package, forbidden",
    [("samplers", ("objectives", "training", "distill")), ("distill", ("samplers",))],
)
def test_package_does_not_import(package, forbidden):
    names = _imports(package)
    assert names  # the scan sees the package's imports
    bad = sorted(m for m in names if m.split(".")[1] in forbidden)
    assert not bad, f"scorelib.{package} imports {bad}"
