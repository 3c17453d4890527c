"""Fixtures of the entry-point tests (helpers live in entry_helpers.py): one trained toy run
and one tiny trained digits run, each shared by every test of the session, and by every
pytest-xdist worker of it."""

import fcntl
from pathlib import Path

import pytest
from entry_helpers import TINY_DIGITS, TOY, TOY_SAMPLES, run, run_inprocess


@pytest.fixture(scope="session")
def toy_home(tmp_path_factory, worker_id) -> Path:
    """A working directory whose ``outputs/toy_dsm`` is the trained :data:`TOY` run
    (trained once per test run, whatever the number of xdist workers: the first worker to
    take the lock trains it, the others wait and reuse it; do not modify it: copy it with
    :func:`copy_run`)."""
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # shared by the workers
    home = root / "toy_home"
    with open(root / "toy_home.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "outputs" / "toy_dsm" / TOY_SAMPLES / "samples.npz").is_file():
            home.mkdir(exist_ok=True)
            run("train", *TOY, cwd=home)
    return home


@pytest.fixture(scope="session")
def toy_run(toy_home) -> Path:
    return toy_home / "outputs" / "toy_dsm"


@pytest.fixture(scope="session")
def tiny_digits_run(tmp_path_factory, worker_id) -> Path:
    """A 2-step digits score run (:data:`entry_helpers.TINY_DIGITS`: a tiny MLP on EDM, the
    digits_edm sampler with 2 steps), trained once per test run and shared by the xdist
    workers as :func:`toy_home` is (do not modify it: copy it with ``copy_run``)."""
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent
    out = root / "tiny_digits" / "run"
    with open(root / "tiny_digits.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "checkpoints" / "2").is_dir():
            r = run_inprocess("train", *TINY_DIGITS, f"hydra.run.dir={out}")
            assert r.code == 0, r.stderr[-3000:]
    return out
