"""The README's code examples run as written.

A fenced block after ``<!-- readme-test: file NAME -->`` is written to ``NAME``; one after
``<!-- readme-test: run -->`` is run (Python with the project's interpreter, bash with it
first on ``PATH``), in order, in one working directory whose ``outputs/toy_dsm`` is a
trained toy run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from entry_helpers import ROOT, copy_run

pytestmark = pytest.mark.slow

BLOCK = re.compile(r"<!-- readme-test: (run|file (\S+)) -->\s*```(python|bash)\n(.*?)```", re.S)


def readme_blocks() -> list[tuple[str, str | None, str, str]]:
    """``(action, file name, language, code)`` of every marked block, in order."""
    text = (ROOT / "README.md").read_text()
    return [(m[0].split()[0], m[1] or None, m[2], m[3]) for m in BLOCK.findall(text)]


def test_readme_has_the_three_tested_sections():
    text = (ROOT / "README.md").read_text()
    for title in (
        "Load a run from Python",
        "Use your own network",
        "Use your own noise process or score",
    ):
        assert f"### {title}" in text
    assert len([b for b in readme_blocks() if b[0] == "run"]) >= 4


def test_readme_examples_run(toy_run, tmp_path):
    copy_run(toy_run, tmp_path / "outputs" / "toy_dsm")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}"
    for action, name, lang, code in readme_blocks():
        if action == "file":
            (tmp_path / name).write_text(code)
            continue
        cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-ec", code]
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{code}\n--- stderr:\n{proc.stderr[-3000:]}"
