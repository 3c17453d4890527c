"""Several processes or devices on this machine, for tests, benchmarks and local runs.

* :func:`free_ports`: a block of free TCP ports on localhost (a coordinator address and
  its roll-call port, or the local Slurm's daemons);
* :func:`forced_devices_env`: the environment of a subprocess whose JAX sees ``devices``
  CPU devices (JAX fixes its device count at start-up, so this must be a fresh process).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def free_ports(n: int = 1, *, tries: int = 100) -> int:
    """The first of ``n`` consecutive TCP ports that are free on 127.0.0.1 now.

    A port found free may be taken by another program before it is used: callers that
    start a server on it should be ready to retry.

    Raises:
      RuntimeError: no such block after ``tries`` attempts.
    """
    for _ in range(tries):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65536:
            continue
        try:
            for k in range(1, n):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no block of {n} free ports on 127.0.0.1 in {tries} tries")


def forced_devices_env(
    devices: int, environ: Mapping[str, str] | None = None, **extra: str
) -> dict[str, str]:
    """``environ`` (default ``os.environ``) for a subprocess with ``devices`` CPU devices.

    Sets ``XLA_FLAGS=--xla_force_host_platform_device_count=<devices>`` (replacing any
    earlier count in ``XLA_FLAGS``, keeping its other flags) and ``JAX_PLATFORMS=cpu``;
    ``extra`` variables are added last (e.g. ``PYTHONPATH``).
    """
    env = dict(os.environ if environ is None else environ)
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={int(devices)}")
    env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu", **extra)
    return env
