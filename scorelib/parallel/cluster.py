"""The cluster environment: processes, devices, accelerators and Slurm requeueing.

The only module of the library that reads the cluster environment (``SLURM_*``,
``CUDA_VISIBLE_DEVICES``, submitit's signal) or starts ``jax.distributed``.

Which processes make up a run (:func:`process_settings`):

* explicit settings (``cluster.coordinator_address``, ``cluster.num_processes``,
  ``cluster.process_id`` in the config) win;
* inside a Slurm job step started by ``srun`` with several tasks (``SLURM_STEP_ID``,
  ``SLURM_NTASKS > 1``, ``SLURM_PROCID`` set) one process per task, with the coordinator
  on the step's first node (JAX's own Slurm detection);
* anything else is one process: no Slurm, an interactive allocation (only
  ``SLURM_JOB_ID``), a batch script outside ``srun`` (one task), a one-task step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

import jax

from scorelib._checks import check_int, require

log = logging.getLogger("scorelib.parallel")

#: Seconds that :func:`initialize` waits for every process to connect before it fails.
CONNECT_TIMEOUT_S = 120


@dataclasses.dataclass(frozen=True)
class ProcessSettings:
    """How this process joins a run.

    Attributes:
      num_processes: processes in the run (1: no ``jax.distributed``).
      process_id: this process's index in ``0 .. num_processes - 1``.
      coordinator_address: ``host:port`` of process 0's coordinator, or ``None`` to let
        JAX derive it from the Slurm step.
      source: where the settings came from (``'single'``, ``'config'``, ``'slurm'``), for
        messages.
    """

    num_processes: int = 1
    process_id: int = 0
    coordinator_address: str | None = None
    source: str = "single"


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer; got {value!r}") from None


def process_settings(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProcessSettings:
    """The processes of this run, from explicit settings or the Slurm step (module docstring).

    Args:
      coordinator_address: ``host:port`` of process 0 (explicit multi-process settings
        need all three of these arguments).
      num_processes: >= 1.
      process_id: in ``0 .. num_processes - 1``.
      environ: the environment (default ``os.environ``).

    Raises:
      ValueError: naming ``cluster.<field>`` for partial or out-of-range explicit settings,
        or a Slurm variable that is not an integer.
    """
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    if any(v is not None for v in given.values()):
        missing = [k for k, v in given.items() if v is None]
        require(
            not missing or (num_processes == 1 and coordinator_address is None),
            f"cluster.{missing[0] if missing else ''}",
            "given with the other explicit process settings "
            "(coordinator_address, num_processes, process_id)",
            None,
        )
        n = check_int(num_processes, "cluster.num_processes", low=1)
        if n == 1:
            return ProcessSettings(source="config")
        i = check_int(process_id, "cluster.process_id", low=0, high=n - 1)
        host, sep, port = str(coordinator_address).rpartition(":")
        require(
            bool(host) and sep == ":" and port.isdigit(),
            "cluster.coordinator_address",
            "host:port",
            coordinator_address,
        )
        return ProcessSettings(n, i, str(coordinator_address), "config")
    env = _env(environ)
    ntasks = _env_int(env, "SLURM_NTASKS")
    procid = _env_int(env, "SLURM_PROCID")
    in_step = "SLURM_STEP_ID" in env and "SLURM_STEP_NODELIST" in env
    if "SLURM_JOB_ID" in env and in_step and ntasks and ntasks > 1 and procid is not None:
        require(0 <= procid < ntasks, "SLURM_PROCID", f"in [0, {ntasks - 1}]", procid)
        return ProcessSettings(ntasks, procid, None, "slurm")
    return ProcessSettings()


def initialize(settings: ProcessSettings, *, timeout_s: int = CONNECT_TIMEOUT_S) -> None:
    """Start ``jax.distributed`` for ``settings`` (nothing for one process).

    Call before any other JAX operation. Idempotent within a process. A line on stderr
    says what this process waits for. When a process is missing, JAX's coordinator aborts
    the process after its timeout (status 134) with a message that names no process, so a
    roll call comes first (:func:`roll_call`): process 0 listens on the port after the
    coordinator's (in a Slurm step :func:`slurm_roll_call_port`), every other process
    reports its id there, and only when all have reported does any of them call
    ``jax.distributed.initialize``.

    Raises:
      RuntimeError: a process did not report within ``timeout_s`` (the message names the
        missing process ids and the coordinator address), or JAX failed to connect (its
        error chained).
    """
    if settings.num_processes == 1 or jax.distributed.is_initialized():
        return
    address = settings.coordinator_address or _slurm_coordinator_address()
    where = address or "the Slurm step's first node"
    me = f"process {settings.process_id} of {settings.num_processes}"
    print(
        f"jax.distributed: {me} ({settings.source} settings) joining the coordinator at "
        f"{where}; waiting up to {timeout_s} s for every process",
        file=sys.stderr,
        flush=True,
    )
    if address is not None:
        port = None if settings.source != "slurm" else slurm_roll_call_port()
        roll_call(address, settings.num_processes, settings.process_id, timeout_s, port=port)
    kwargs = dict(initialization_timeout=int(timeout_s))
    if settings.source == "config":
        kwargs.update(
            coordinator_address=settings.coordinator_address,
            num_processes=settings.num_processes,
            process_id=settings.process_id,
        )
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as e:  # noqa: BLE001 - JAX raises several kinds; re-raised with context
        raise RuntimeError(
            f"jax.distributed: {me} could not join the coordinator at {where} within "
            f"{timeout_s} s ({settings.source} settings); a process is missing or the address "
            f"is unreachable: {e}"
        ) from e


def _slurm_coordinator_address() -> str | None:
    """The coordinator JAX derives inside a Slurm step (its ``SlurmCluster``, a private JAX
    module: ``None`` if it moved, and then no roll call is made)."""
    try:
        from jax._src.clusters.slurm_cluster import SlurmCluster

        return SlurmCluster.get_coordinator_address(None, None)
    except Exception:  # noqa: BLE001 - any failure: fall back to JAX's own start-up
        return None


def roll_call_port(coordinator_address: str) -> int:
    """The roll-call port of explicit settings: the one after the coordinator's (the one
    before it at 65535)."""
    port = int(coordinator_address.rpartition(":")[2])
    return port + 1 if port < 65535 else port - 1


def slurm_roll_call_port(environ: Mapping[str, str] | None = None) -> int:
    """The roll-call port in a Slurm step: ``57344 + SLURM_JOB_ID % 4096``, below JAX's own
    coordinator ports (``61440 + SLURM_JOB_ID % 4096``), so that the roll call of one job
    never takes the coordinator port of the next job id on the same node."""
    return 57344 + int(_env(environ)["SLURM_JOB_ID"]) % 4096


def roll_call(
    address: str,
    num_processes: int,
    process_id: int,
    timeout_s: float,
    *,
    port: int | None = None,
) -> None:
    """Wait until every process of the run is up, before ``jax.distributed`` starts.

    Process 0 listens on ``port`` of the coordinator's host (default
    :func:`roll_call_port` of ``address``); each other process connects
    (retrying until ``timeout_s``), sends its id and waits for process 0's answer: ``go``
    once all ``num_processes - 1`` have reported, else the ids that did not.

    Raises:
      RuntimeError: naming the process ids that did not report within ``timeout_s`` and the
        coordinator address (in every process that did report, and in process 0); in a
        process other than 0, that process 0 did not answer; in process 0, that the
        roll-call port is taken.
    """
    host, _, _ = address.rpartition(":")
    port = roll_call_port(address) if port is None else int(port)
    deadline = time.monotonic() + timeout_s
    me = f"process {process_id} of {num_processes}"
    if process_id == 0:
        _roll_call_lead(port, num_processes, deadline, address, timeout_s)
        return
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=2)
            break
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"jax.distributed: {me}: process 0 (the coordinator, {address}) did not "
                    f"answer the roll call on port {port} within {timeout_s} s: process 0 is "
                    f"missing or the address is unreachable ({e})"
                ) from None
            time.sleep(0.2)
    with conn:
        conn.sendall(f"{process_id}\n".encode())
        conn.settimeout(max(deadline - time.monotonic(), 0) + 30)
        try:
            answer = conn.makefile().readline().strip()
        except OSError:
            answer = ""
    if answer == "go":
        return
    if answer.startswith("missing "):
        ids = answer.split()[1].replace(",", ", ")
        raise RuntimeError(_missing_message(ids, num_processes, address, timeout_s))
    raise RuntimeError(
        f"jax.distributed: {me}: process 0 (the coordinator, {address}) stopped the roll "
        f"call without an answer ({answer!r})"
    )


def _missing_message(ids: str, n: int, address: str, timeout_s: float) -> str:
    return (
        f"jax.distributed: processes [{ids}] of {n} did not join within {timeout_s} s "
        f"(coordinator {address}): start every process (cluster.num_processes={n}, "
        "cluster.process_id 0 .. n-1, or srun with that many tasks)"
    )


def _roll_call_lead(port: int, n: int, deadline: float, address: str, timeout_s: float):
    joined: dict[int, socket.socket] = {}
    try:
        server = socket.create_server(("", port))
    except OSError as e:
        raise RuntimeError(
            f"jax.distributed: process 0 cannot listen for the roll call on port {port} "
            f"(coordinator {address}): {e}; choose another coordinator port"
        ) from None
    with server:
        server.settimeout(0.2)
        while len(joined) < n - 1 and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            try:
                pid = int(conn.makefile().readline().strip())
            except (OSError, ValueError):
                conn.close()
                continue
            if 0 < pid < n and pid not in joined:
                joined[pid] = conn
            else:
                conn.close()
    missing = [i for i in range(1, n) if i not in joined]
    answer = "go" if not missing else "missing " + ",".join(map(str, missing))
    for conn in joined.values():
        with conn:
            try:
                conn.sendall(f"{answer}\n".encode())
            except OSError:
                pass
    if missing:
        raise RuntimeError(_missing_message(", ".join(map(str, missing)), n, address, timeout_s))


def check_devices(settings: ProcessSettings, *, local_devices: int | None = None) -> None:
    """Check that every expected process, and each one's devices, is present.

    Args:
      settings: what :func:`process_settings` found.
      local_devices: devices each process must hold (``None``: any number, the same in
        every process).

    Raises:
      RuntimeError: naming the processes missing, or the processes whose device count
        differs.
    """
    have = jax.process_count()
    if have != settings.num_processes:
        raise RuntimeError(
            f"expected {settings.num_processes} processes ({settings.source} settings) but "
            f"JAX sees {have}: processes {list(range(have, settings.num_processes))} are missing"
        )
    counts: dict[int, int] = {}
    for d in jax.devices():
        counts[d.process_index] = counts.get(d.process_index, 0) + 1
    missing = [p for p in range(have) if p not in counts]
    if missing:
        raise RuntimeError(f"processes {missing} have no devices")
    want = counts[0] if local_devices is None else int(local_devices)
    bad = {p: n for p, n in counts.items() if n != want}
    if bad:
        raise RuntimeError(
            f"every process must hold {want} devices; processes with another count: "
            + ", ".join(f"process {p}: {n}" for p, n in sorted(bad.items()))
        )


# --------------------------------------------------------------------------- accelerators


def requested_gpus(environ: Mapping[str, str] | None = None) -> int:
    """GPUs the scheduler gave this job on this node (``SLURM_GPUS_ON_NODE``,
    ``SLURM_JOB_GPUS``, ``SLURM_STEP_GPUS``), 0 when none or outside Slurm."""
    env = _env(environ)
    n = _env_int(env, "SLURM_GPUS_ON_NODE")
    if n:
        return n
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        ids = [g for g in env.get(name, "").split(",") if g.strip()]
        if ids:
            return len(ids)
    return 0


def check_accelerator(gpus_per_node: int, *, allow_cpu: bool, environ=None) -> str:
    """Refuse to train on the CPU when GPUs were asked for.

    Args:
      gpus_per_node: GPUs the config asked for (``cluster.gpus_per_node``); the Slurm
        allocation (:func:`requested_gpus`) counts too.
      allow_cpu: ``cluster.allow_cpu``: go on with a CPU backend anyway.

    Returns:
      JAX's backend name (``'cpu'``, ``'gpu'``, ``'tpu'``).

    Raises:
      ValueError: GPUs were asked for, JAX sees only a CPU, and ``allow_cpu`` is false;
        the message names the config fields and says how to install a CUDA build of JAX.
    """
    check_int(gpus_per_node, "cluster.gpus_per_node", low=0)
    backend = jax.default_backend()
    want = max(int(gpus_per_node), requested_gpus(environ))
    if want > 0 and backend == "cpu" and not allow_cpu:
        raise ValueError(
            f"{want} GPU(s) per node were asked for (cluster.gpus_per_node={gpus_per_node}, "
            f"Slurm: {requested_gpus(environ)}) but JAX sees only the CPU: install a CUDA "
            "build of JAX on the cluster (pip install -e '.[cuda]', see docs/clusters.md), or set "
            "cluster.allow_cpu=true to train on the CPU anyway"
        )
    return backend


def check_gpus(
    gpus_per_node: int, *, tasks_per_node: int = 1, devices: Sequence | None = None
) -> None:
    """Check that this process sees the GPUs the config asked for.

    Each process sees either the node's ``gpus_per_node`` GPUs, or its share of them
    (``gpus_per_node / tasks_per_node``: one process per GPU). Nothing is checked when
    ``gpus_per_node`` is 0 or the backend is not a GPU (:func:`check_accelerator` decides
    about a CPU-only JAX).

    Args:
      gpus_per_node: ``cluster.gpus_per_node``.
      tasks_per_node: ``cluster.tasks_per_node``.
      devices: this process's devices (default ``jax.local_devices()``), each with a
        ``platform`` (``'gpu'``, ``'cuda'``, ``'rocm'``, ``'cpu'``).

    Raises:
      RuntimeError: the process sees another number of GPUs; the message names the config
        fields, the host, the GPUs it sees and ``CUDA_VISIBLE_DEVICES``.
    """
    check_int(gpus_per_node, "cluster.gpus_per_node", low=0)
    check_int(tasks_per_node, "cluster.tasks_per_node", low=1)
    devices = list(jax.local_devices() if devices is None else devices)
    gpus = [d for d in devices if d.platform in ("gpu", "cuda", "rocm")]
    if gpus_per_node == 0 or not gpus:
        return
    share = gpus_per_node // tasks_per_node if gpus_per_node % tasks_per_node == 0 else None
    if len(gpus) in (gpus_per_node, share):
        return
    want = f"{gpus_per_node}" + (f" (or {share}, one share per task)" if share else "")
    raise RuntimeError(
        f"cluster.gpus_per_node={gpus_per_node} (cluster.tasks_per_node={tasks_per_node}) but "
        f"this process on {socket.gethostname()} sees {len(gpus)} GPU(s) "
        f"({', '.join(str(d) for d in gpus)}), not {want}: a GPU is missing, busy or hidden "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
    )


# --------------------------------------------------------------------------- preemption


def preempt_signals(environ: Mapping[str, str] | None = None) -> tuple[signal.Signals, ...]:
    """Extra signals that mean "the time limit is near: save and requeue" in this job.

    Inside a submitit job (``SUBMITIT_FOLDER`` set) submitit's preemption signal
    (``SUBMITIT_PREEMPT_SIGNAL``, default USR2); the training loop already stops on SIGINT,
    SIGTERM and SIGUSR1 (``scorelib.training.STOP_SIGNALS``).
    """
    env = _env(environ)
    if "SUBMITIT_FOLDER" not in env:
        return ()
    name = env.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return (signal.Signals[f"SIG{name}" if not name.startswith("SIG") else name],)


def slurm_job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The id ``scontrol`` knows this job by (``<array job>_<task>`` for an array task)."""
    env = _env(environ)
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def requeue_after_stop(signum: int, environ: Mapping[str, str] | None = None) -> str | None:
    """After the training loop saved and stopped on ``signum``, requeue the Slurm job.

    ``--requeue`` makes Slurm requeue a job on preemption or node failure, never at its
    time limit: a job warned of its time limit (``#SBATCH --signal=USR1@90``) must requeue
    itself, and the requeued job runs the same command, which resumes.

    * SIGUSR1 in a Slurm job: ``scontrol requeue <job>`` from task 0 (the other tasks saved
      the same step and exit).
    * submitit's preemption signal, in a submitit job on Slurm or on this machine
      (``hydra/launcher=submitit_local``): the handler submitit had installed (the one
      active now that the loop has put its handlers back) is called: it requeues the job,
      counting ``max_num_timeout``, and exits (the local executor restarts the job).
    * SIGINT (a user), SIGTERM (``scancel``, or a preemption that Slurm requeues itself),
      or no Slurm job: nothing.

    Returns:
      A line for the user (``'requeued Slurm job 12'``, or, when ``scontrol requeue``
      fails or ``scontrol`` is not on ``PATH`` (an interactive job, a container inside the
      job), ``'could not requeue Slurm job 12 (...)'``: the step is saved either way), or
      ``None`` when nothing was done.
    """
    env = _env(environ)
    if signum in (signal.SIGINT, signal.SIGTERM):
        return None
    handler = signal.getsignal(signum)
    if signum in preempt_signals(env) and callable(handler):
        handler(signum, None)  # submitit: checkpoint the submission, requeue, exit
        return None
    job = slurm_job_id(env)
    if job is None or signum != signal.SIGUSR1:
        return None
    if (_env_int(env, "SLURM_PROCID") or 0) != 0:
        return None
    scontrol = shutil.which("scontrol")
    if scontrol is None:  # e.g. a container inside the job, without Slurm's commands
        proc = subprocess.CompletedProcess([], 127, "", "scontrol is not on PATH")
    else:
        proc = subprocess.run(
            [scontrol, "requeue", job], capture_output=True, text=True, timeout=60, check=False
        )
    if proc.returncode != 0:  # e.g. an interactive job: the step is saved all the same
        message = (
            f"could not requeue Slurm job {job} (scontrol requeue: {proc.stderr.strip()}); "
            "resubmit the same command to resume"
        )
        log.warning(message)
        return message
    log.warning("requeued Slurm job %s", job)
    return f"requeued Slurm job {job}"
