"""A real single-node Slurm with accounting (``slurm/local/up.sh``) for the session.

Skipped, with the reason, where it cannot run: not root (the daemons need it), or the
Slurm packages are not installed (``.ci/run`` installs them: ``apt-get install slurm-wlm
slurmdbd munge mariadb-server``).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from slurm_helpers import ROOT, Slurm, _free_port_block, _unavailable


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm") / "state"
    env = {**os.environ, "SLURM_LOCAL_PORT": str(_free_port_block())}
    up = subprocess.run(
        [str(ROOT / "slurm" / "local" / "up.sh"), str(state)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        if up.returncode != 0:
            logs = "\n".join(p.read_text()[-1500:] for p in sorted((state / "log").glob("*.log")))
            pytest.fail(f"slurm/local/up.sh failed:\n{up.stdout}\n{up.stderr}\n{logs}")
        yield Slurm(state, tmp_path_factory.mktemp("jax_cache"))
    finally:
        subprocess.run(
            [str(ROOT / "slurm" / "local" / "down.sh"), str(state)], timeout=120, check=False
        )
