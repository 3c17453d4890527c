"""README.md and the pages of docs/: their text, their marked example blocks and the
``python -m experiments.<app>`` commands their fenced ``bash`` blocks show. Shared by the
tests that hold the documentation to the code (``tests/integration/test_readme.py``,
``tests/integration/test_run_identity.py``, ``tests/slurm/test_cluster_config.py``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: A fenced block after ``<!-- readme-test: file NAME -->`` is written to ``NAME``; one after
#: ``<!-- readme-test: run -->`` is run.
MARKED = re.compile(r"<!-- readme-test: (run|file (\S+)) -->\s*```(python|bash)\n(.*?)```", re.S)
FENCED_BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
COMMAND = re.compile(r"^python -m experiments\.(\w+)(?=\s|$)(.*)$")


def pages() -> list[Path]:
    """README.md first, then every page of docs/ in name order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_text() -> str:
    """The text of every page, in :func:`pages` order."""
    return "\n".join(page.read_text() for page in pages())


def marked_blocks() -> list[tuple[Path, str, str | None, str, str]]:
    """``(page, action, file name, language, code)`` of every marked block, in page order."""
    return [
        (page, m[0].split()[0], m[1] or None, m[2], m[3])
        for page in pages()
        for m in MARKED.findall(page.read_text())
    ]


def shown_commands() -> list[tuple[Path, str, list[str]]]:
    """``(page, app, words)`` of every ``python -m experiments.<app> ...`` line of a fenced
    ``bash`` block: continuation lines joined, the trailing comment dropped, ``words`` the
    shell words after the module name (flags such as ``-m`` included)."""
    out = []
    for page in pages():
        for block in FENCED_BASH.findall(page.read_text()):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                m = COMMAND.match(line.strip())
                if m:
                    out.append((page, m[1], shlex.split(m[2], comments=True)))
    return out
