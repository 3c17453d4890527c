"""Fixtures of the entry-point tests (helpers live in entry_helpers.py): one trained toy run
shared by every test of the session."""

from pathlib import Path

import pytest
from entry_helpers import TOY, run


@pytest.fixture(scope="session")
def toy_home(tmp_path_factory) -> Path:
    """A working directory whose ``outputs/toy_dsm`` is the trained :data:`TOY` run
    (trained once per session; do not modify it: copy it with :func:`copy_run`)."""
    home = tmp_path_factory.mktemp("toy_home")
    run("train", *TOY, cwd=home)
    return home


@pytest.fixture(scope="session")
def toy_run(toy_home) -> Path:
    return toy_home / "outputs" / "toy_dsm"
