"""``slurm/local/up.sh`` refuses a second local Slurm on the same machine, in one line that
says which ``SLURM_LOCAL_PORT`` to use instead, before it starts or writes anything.

The "already running" conditions are faked (a listening socket on one of its ports; a live
process named ``slurmctld`` in the directory's pid file), so these tests need neither the
Slurm packages nor root: as root they run the script as ``nobody`` to show that.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from slurm_helpers import ROOT

from scorelib.parallel import free_ports

UP = ROOT / "slurm" / "local" / "up.sh"
LINE = re.compile(r"SLURM_LOCAL_PORT=(\d+) SLURM_DIR=(\S+)$")


def _as_user() -> list[str]:
    """``runuser -u nobody --`` when root (the refusal needs no root), else nothing."""
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("root without runuser: the script would start a real Slurm")
        return ["runuser", "-u", "nobody", "--"]
    return []


@pytest.fixture
def public_dir():
    """A directory that ``nobody`` can read (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="scorelib-up-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _up(state: Path, port: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_as_user(), "bash", str(UP), str(state)],
        env={**os.environ, "SLURM_LOCAL_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _free(base: int) -> bool:
    """Whether the 4 ports from ``base`` can be bound now."""
    socks = []
    try:
        for p in range(base, base + 4):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def _one_line_refusal(proc: subprocess.CompletedProcess) -> tuple[str, int]:
    """The refusal's one line and the free port it names."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    m = LINE.search(lines[0])
    assert m, lines[0]
    return lines[0], int(m[1])


def test_a_taken_port_is_refused_in_one_line_naming_a_free_port(public_dir):
    base = free_ports(4)
    state = public_dir / "state"
    with socket.socket() as taken:  # a daemon of another local Slurm on slurmdbd's port
        taken.bind(("127.0.0.1", base + 2))
        taken.listen()
        line, other = _one_line_refusal(_up(state, base))
    assert line.startswith(f"up.sh: port {base + 2} is in use")
    assert f"SLURM_LOCAL_PORT={base} to {base + 3}" in line
    assert other != base and _free(other)
    assert not state.exists()  # nothing written, nothing started


def test_a_second_slurm_in_the_same_directory_is_refused(public_dir):
    fake = public_dir / "slurmctld"  # a live process named slurmctld: the first Slurm
    shutil.copy(shutil.which("sleep"), fake)
    proc = subprocess.Popen([str(fake), "120"])
    try:
        state = public_dir / "state"
        (state / "run").mkdir(parents=True)
        (state / "run" / "slurmctld.pid").write_text(f"{proc.pid}\n")
        before = sorted(p.name for p in state.rglob("*"))
        line, other = _one_line_refusal(_up(state, free_ports(4)))
        assert f"a local Slurm already runs in {state} (slurmctld pid {proc.pid})" in line
        assert f"slurm/local/down.sh {state}" in line
        assert _free(other)
        assert sorted(p.name for p in state.rglob("*")) == before  # untouched
    finally:
        proc.kill()
        proc.wait()


def test_a_stale_pid_file_or_a_bad_port_is_not_taken_for_a_running_slurm(public_dir):
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("root without runuser: the script would start a real Slurm")
    state = public_dir / "state"
    (state / "run").mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (state / "run" / "slurmctld.pid").write_text(f"{dead.pid}\n")
    proc = _up(state, free_ports(4))  # gets past the checks to the next one: root
    assert proc.returncode == 2 and "must run as root" in proc.stderr, proc.stderr
    bad = _up(state, 70000)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "up.sh: SLURM_LOCAL_PORT must be an integer in [1024, 65532] (it uses 4 ports); got '70000'"
    )
