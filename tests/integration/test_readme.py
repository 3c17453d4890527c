"""The examples of README.md and docs/*.md run as written, and every command they show
composes.

A fenced block after ``<!-- readme-test: file NAME -->`` is written to ``NAME``; one after
``<!-- readme-test: run -->`` is run (Python with the project's interpreter, bash with it
first on ``PATH``), in order (README first, then the pages of docs/ in name order), in one
working directory whose ``outputs/toy_dsm`` is a trained toy run. Every
``python -m experiments.<app> ...`` line of a fenced ``bash`` block is composed with Hydra
against the app's primary config (``configs/<app>.yaml``), which refuses an unknown group
option, preset or field and a value of the wrong type.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from doc_pages import ROOT, marked_blocks, pages, shown_commands
from entry_helpers import copy_run
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from experiments import schema

APPS = ("train", "sample", "evaluate", "distill", "reproduce", "train_classifier", "reconstruct")
#: Hydra's command-line flags that take a value (the value is not an override).
FLAGS_WITH_VALUE = ("--cfg", "-c", "--package", "-p")
#: The docs showed 95 composable commands when this test was written; fewer means commands
#: were dropped from the docs or this test stopped finding them.
MIN_COMPOSED = 90


def test_the_python_page_has_the_tested_sections():
    text = (ROOT / "docs" / "python.md").read_text()
    for title in (
        "Load a run from Python",
        "Teleport a trained run",
        "Use your own network",
        "Use your own noise process or score",
    ):
        assert f"## {title}" in text
    runs = [b for b in marked_blocks() if b[1] == "run"]
    assert len(runs) >= 8, [(b[0].name, b[3]) for b in runs]
    assert {b[0].name for b in runs} >= {"README.md", "python.md"}


def _jobs(words: list[str]) -> list[list[str]]:
    """The override lists a command's words launch, flags dropped: one, or for a sweep
    (``a=1,2 b=x,y``) each value of each swept key with the other keys at their first value
    (group options are checked that way; the full product adds nothing compose can refuse)."""
    kept, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w.startswith("-"):
            skip = w in FLAGS_WITH_VALUE
        else:
            kept.append(w)
    parsed = OverridesParser.create().parse_overrides(kept)
    values = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
        if o.is_sweep_override()
        else [o.input_line]
        for o in parsed
    ]
    first = [v[0] for v in values]
    jobs = [first]
    for i, vs in enumerate(values):
        jobs += [first[:i] + [v] + first[i + 1 :] for v in vs[1:]]
    return jobs


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_every_command_the_docs_show_composes():
    schema.register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        composed, skipped, failures = _compose_all()
    print(f"composed {composed} commands of the docs; skipped {len(skipped)} with placeholders")
    assert not failures, "\n".join(failures)
    assert composed >= MIN_COMPOSED, (composed, skipped)
    assert len(skipped) <= 10, skipped


def _compose_all() -> tuple[int, list[str], list[str]]:
    """Compose every shown command (inside an initialised Hydra); ``(composed, skipped,
    failures)``. A job the docs show twice is composed once (composing is deterministic):
    its error, if any, is reported for every line that shows it."""
    composed, skipped, failures = 0, [], []
    errors: dict[tuple, Exception | None] = {}  # (app, overrides) -> what composing raised
    for page, app, words in shown_commands():
        line = f"{page.name}: python -m experiments.{app} {' '.join(words)}"
        if app not in APPS:
            failures.append(f"{line}\n  no such app (the apps: {', '.join(APPS)})")
            continue
        if any("<" in w or "$" in w for w in words):  # a placeholder or a shell variable
            skipped.append(line)
            continue
        for overrides in _jobs(words):
            job = (app, tuple(overrides))
            if job not in errors:
                try:
                    compose(app, overrides=overrides, return_hydra_config=True)
                    errors[job] = None
                except Exception as e:  # report every failing command at once
                    errors[job] = e
            if errors[job] is not None:
                e = errors[job]
                failures.append(f"{line}\n  {type(e).__name__}: {str(e).splitlines()[0]}")
                break
        else:
            composed += 1
    return composed, skipped, failures


#: Runs the marked blocks given as JSON on stdin, in order, in one Python process (one JAX
#: start-up for all of them): a file block is written, a Python block is executed in a fresh
#: namespace as ``__main__`` (as ``python -c`` would), a bash block runs in ``bash -e`` (its
#: ``python -m`` commands are processes of their own). Stops at the first failing block,
#: naming it, with exit status 1.
RUNNER = """
import json, subprocess, sys, traceback
from pathlib import Path
for page, action, name, lang, code in json.load(sys.stdin):
    if action == "file":
        Path(name).write_text(code)
        continue
    if lang == "python":
        try:
            exec(compile(code, f"<{page}>", "exec"), {"__name__": "__main__"})
        except BaseException:
            sys.exit(f"{page}:\\n{code}\\n--- {traceback.format_exc()[-3000:]}")
        continue
    proc = subprocess.run(["bash", "-ec", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"{page}:\\n{code}\\n--- stderr:\\n{proc.stderr[-3000:]}")
"""


@pytest.mark.slow
def test_the_docs_examples_run(toy_run, tmp_path):
    copy_run(toy_run, tmp_path / "outputs" / "toy_dsm")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}"
    blocks = marked_blocks()
    assert {page for page, *_ in blocks} <= set(pages())
    steps = [(page.name, action, name, lang, code) for page, action, name, lang, code in blocks]
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(steps),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
