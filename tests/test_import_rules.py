"""The import directions of docs/architecture.md that concern the noise levels and the
training stack: samplers never import objectives or training, distillation never imports
samplers (its noise levels come from ``scorelib.processes.noise_levels``); and an import
inside a function says why in a comment."""

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


def _function_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, source)`` of each import inside a function of ``path`` without a comment
    saying why: on its line, or on the line above it or above the imports it is grouped with
    (a ``try``'s imports are optional by construction and pass)."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    guarded = {
        id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for s in t.body for n in ast.walk(s)
    }
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in guarded:
                continue
            i = node.lineno - 1
            if "#" in lines[i]:
                continue
            j = i - 1
            while j >= 0 and (
                lines[j].strip().startswith(("import ", "from ")) or not lines[j].strip()
            ):
                j -= 1
            if not lines[j].strip().startswith("#"):
                out.append((node.lineno, lines[i].strip()))
    return out


@pytest.mark.parametrize("package", ["scorelib", "experiments"])
def test_imports_inside_functions_say_why(package):
    """docs/architecture.md: modules import at the top; an import inside a function is there
    to keep a heavy optional dependency off the import path, and says so in a comment."""
    root = ROOT.parent / package
    bad = [
        f"{p.relative_to(root.parent)}:{n}: {src}"
        for p in sorted(root.rglob("*.py"))
        for n, src in _function_imports(p)
    ]
    assert not bad, "imports inside functions without a comment saying why:\n" + "\n".join(bad)
