"""scorelib.parallel: process settings from the Slurm environment, sharding rules, device
and accelerator checks, requeueing; and data-parallel training on 1, 2 and 8 (forced CPU)
devices and in 2 processes, which must give the single-device loss curve.

JAX fixes its device count at start-up, so the multi-device runs are subprocesses with
``--xla_force_host_platform_device_count`` (``sharded_train.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from scorelib import parallel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = HERE / "sharded_train.py"

SRUN_STEP = {  # what srun -n 2 sets in task 1 (the variables the detection reads)
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
}


# --------------------------------------------------------------------------- settings


def test_no_slurm_is_one_process():
    assert parallel.process_settings(environ={}) == parallel.ProcessSettings()


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_JOB_ID": "42"},  # an interactive allocation (salloc): only the job id
        {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"},  # batch script
        {**SRUN_STEP, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"},  # a one-task step
        {k: v for k, v in SRUN_STEP.items() if k != "SLURM_PROCID"},  # partial step env
    ],
)
def test_partial_slurm_environment_is_one_process(env):
    s = parallel.process_settings(environ=env)
    assert (s.num_processes, s.process_id, s.source) == (1, 0, "single")


def test_srun_step_with_two_tasks():
    s = parallel.process_settings(environ=SRUN_STEP)
    assert (s.num_processes, s.process_id, s.coordinator_address, s.source) == (
        2,
        1,
        None,
        "slurm",
    )


def test_explicit_settings_win_over_slurm():
    s = parallel.process_settings(
        coordinator_address="10.0.0.1:1234", num_processes=3, process_id=2, environ=SRUN_STEP
    )
    assert s == parallel.ProcessSettings(3, 2, "10.0.0.1:1234", "config")


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_processes": 2, "process_id": 0}, "cluster.coordinator_address"),
        ({"coordinator_address": "h:1"}, "cluster.num_processes"),
        ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, "cluster.process_id"),
        ({"coordinator_address": "h", "num_processes": 2, "process_id": 0}, "coordinator_addr"),
        ({"coordinator_address": "h:1", "num_processes": 0, "process_id": 0}, "num_processes"),
    ],
)
def test_bad_explicit_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        parallel.process_settings(**kwargs, environ={})


def test_slurm_variable_not_an_integer():
    with pytest.raises(ValueError, match="SLURM_NTASKS must be an integer; got 'x'"):
        parallel.process_settings(environ={**SRUN_STEP, "SLURM_NTASKS": "x"})


def test_missing_processes_are_named():
    missing = r"expected 3 processes .* processes \[1, 2\] are missing"
    with pytest.raises(RuntimeError, match=missing):
        parallel.check_devices(parallel.ProcessSettings(3, 0, "h:1", "config"))
    parallel.check_devices(parallel.ProcessSettings())
    with pytest.raises(RuntimeError, match="must hold 5 devices; .*process 0: 1"):
        parallel.check_devices(parallel.ProcessSettings(), local_devices=5)


def _start_alone(process_id: int, timeout_s: int = 3) -> tuple[subprocess.CompletedProcess, str]:
    """Process ``process_id`` of 2 started with explicit settings, the other one never."""
    address = f"127.0.0.1:{parallel.free_ports(2)}"
    code = (
        "from scorelib import parallel\n"
        f"s = parallel.process_settings(coordinator_address={address!r}, "
        f"num_processes=2, process_id={process_id})\n"
        f"parallel.initialize(s, timeout_s={timeout_s})\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    return proc, address


def test_missing_coordinator_is_a_clear_error_not_a_hang():
    proc, address = _start_alone(1, timeout_s=2)
    assert proc.returncode == 1, proc.stderr
    assert f"process 1 of 2: process 0 (the coordinator, {address}) did not answer" in (proc.stderr)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_missing_process_is_named_by_the_coordinator_not_an_abort():
    """Without the roll call, JAX's coordinator aborts (status 134) naming no process."""
    proc, address = _start_alone(0, timeout_s=3)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert (
        f"RuntimeError: jax.distributed: processes [1] of 2 did not join within 3 s "
        f"(coordinator {address})"
    ) in proc.stderr, proc.stderr[-3000:]


def test_roll_call_names_every_missing_process_to_those_that_came():
    address = f"127.0.0.1:{parallel.free_ports(2)}"
    errors = {}

    def join(i, n=4):
        try:
            parallel.roll_call(address, n, i, timeout_s=2)
        except RuntimeError as e:
            errors[i] = str(e)

    threads = [threading.Thread(target=join, args=(i,)) for i in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(errors) == [0, 2]
    for message in errors.values():
        assert f"processes [1, 3] of 4 did not join within 2 s (coordinator {address})" in message
    # all present: everyone goes on
    address = f"127.0.0.1:{parallel.free_ports(2)}"
    threads = [threading.Thread(target=join, args=(i, 3)) for i in range(3)]
    errors.clear()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == {}


def test_roll_call_ports():
    assert parallel.cluster.roll_call_port("h:1234") == 1235
    assert parallel.cluster.roll_call_port("h:65535") == 65534
    # in a Slurm step: below JAX's coordinator ports 61440 + job % 4096, never one of them
    ports = {parallel.cluster.slurm_roll_call_port({"SLURM_JOB_ID": str(j)}) for j in range(8192)}
    assert min(ports) == 57344 and max(ports) == 61439 and len(ports) == 4096


def test_a_taken_roll_call_port_is_named():
    port = parallel.free_ports(2)
    with socket.create_server(("", port + 1)):
        with pytest.raises(
            RuntimeError, match=f"cannot listen for the roll call on port {port + 1}"
        ):
            parallel.roll_call(f"127.0.0.1:{port}", 2, 0, timeout_s=1)


# --------------------------------------------------------------------------- sharding


def test_rules_raise_on_an_unmatched_leaf():
    mesh = parallel.make_mesh()
    tree = {"dense": {"kernel": jnp.ones((4, 2)), "bias": jnp.ones(2)}, "step": jnp.zeros(())}
    with pytest.raises(ValueError, match=r"no sharding rule matches the leaf \['step'\]"):
        parallel.leaf_shardings(tree, mesh, [(r".*'(kernel|bias)'\]", P())])
    with pytest.raises(ValueError, match="a spec of at most 0 axes"):
        parallel.leaf_shardings(tree, mesh, [(r".*", P("data"))])
    got = parallel.leaf_shardings(tree, mesh, [(r".*kernel.*", P("data")), (r".*", P())])
    assert got["dense"]["kernel"].spec == P("data") and got["step"].spec == P()
    placed = parallel.shard(tree, mesh)
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(placed))
    host = parallel.to_host(placed)
    assert isinstance(host["dense"]["kernel"], np.ndarray)


def test_mesh_axis_is_auto_and_batch_size_must_divide():
    mesh = parallel.make_mesh()
    assert mesh.axis_names == ("data",)
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,)
    assert parallel.check_batch_size(8, mesh) == 8 // mesh.size
    with pytest.raises(ValueError, match=r"trainer.batch_size must be a multiple of the number"):
        parallel.check_batch_size(0, mesh)


# --------------------------------------------------------------------------- accelerators


def test_gpus_asked_but_cpu_backend_stops_unless_allowed():
    with pytest.raises(ValueError, match=r"cluster.gpus_per_node=1.*cluster.allow_cpu=true"):
        parallel.check_accelerator(1, allow_cpu=False, environ={})
    with pytest.raises(ValueError, match=r"Slurm: 2"):
        parallel.check_accelerator(0, allow_cpu=False, environ={"SLURM_JOB_GPUS": "0,1"})
    assert parallel.check_accelerator(1, allow_cpu=True, environ={}) == "cpu"
    assert parallel.check_accelerator(0, allow_cpu=False, environ={}) == "cpu"
    assert parallel.requested_gpus({"SLURM_GPUS_ON_NODE": "4"}) == 4
    with pytest.raises(ValueError, match="cluster.gpus_per_node must be an integer >= 0"):
        parallel.check_accelerator(-1, allow_cpu=False, environ={})


class _FakeDevice:
    def __init__(self, platform: str, i: int):
        self.platform, self.id = platform, i

    def __str__(self):
        return f"{self.platform}:{self.id}"


def _devices(platform, n):
    return [_FakeDevice(platform, i) for i in range(n)]


def test_a_node_showing_fewer_gpus_than_asked_stops():
    with pytest.raises(RuntimeError, match=r"gpus_per_node=4 .* sees 3 GPU\(s\) \(cuda:0, cuda:1"):
        parallel.check_gpus(4, devices=_devices("cuda", 3))
    with pytest.raises(RuntimeError, match=r"not 4 \(or 2, one share per task\)"):
        parallel.check_gpus(4, tasks_per_node=2, devices=_devices("gpu", 3))
    parallel.check_gpus(4, devices=_devices("gpu", 4))
    parallel.check_gpus(4, tasks_per_node=4, devices=_devices("gpu", 1))  # one per task
    parallel.check_gpus(4, tasks_per_node=4, devices=_devices("gpu", 4))  # all visible
    parallel.check_gpus(0, devices=_devices("gpu", 3))  # none asked for: any number
    parallel.check_gpus(2, devices=_devices("cpu", 1))  # a CPU: check_accelerator's case
    parallel.check_gpus(1)  # this machine's devices


# --------------------------------------------------------------------------- requeue


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """An ``scontrol`` on PATH that records its arguments."""
    log = tmp_path / "scontrol.log"
    exe = tmp_path / "bin" / "scontrol"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    return log


def test_time_limit_signal_requeues_the_job(fake_scontrol):
    env = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0"}
    assert parallel.requeue_after_stop(signal.SIGUSR1, env) == "requeued Slurm job 42"
    array = {**env, "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}
    assert parallel.requeue_after_stop(signal.SIGUSR1, array) == "requeued Slurm job 40_3"
    # a user's Ctrl-C, scancel's SIGTERM, task 1, or no Slurm job: nothing
    assert parallel.requeue_after_stop(signal.SIGINT, env) is None
    assert parallel.requeue_after_stop(signal.SIGTERM, env) is None
    assert parallel.requeue_after_stop(signal.SIGUSR1, {**env, "SLURM_PROCID": "1"}) is None
    assert parallel.requeue_after_stop(signal.SIGUSR1, {}) is None
    assert fake_scontrol.read_text().splitlines() == ["requeue 42", "requeue 40_3"]


def test_failed_requeue_is_reported_not_raised(tmp_path, monkeypatch):
    exe = tmp_path / "scontrol"
    exe.write_text("#!/bin/sh\necho 'Invalid job id specified' >&2\nexit 1\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    got = parallel.requeue_after_stop(signal.SIGUSR1, {"SLURM_JOB_ID": "7"})
    assert got == (
        "could not requeue Slurm job 7 (scontrol requeue: Invalid job id specified); "
        "resubmit the same command to resume"
    )


def test_no_scontrol_on_path_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # e.g. a container inside the Slurm job
    got = parallel.requeue_after_stop(signal.SIGUSR1, {"SLURM_JOB_ID": "7"})
    assert got == (
        "could not requeue Slurm job 7 (scontrol requeue: scontrol is not on PATH); "
        "resubmit the same command to resume"
    )


def test_submitit_signal_goes_to_submitits_handler_after_the_save():
    env = {"SLURM_JOB_ID": "42", "SUBMITIT_FOLDER": "/x"}
    assert parallel.preempt_signals(env) == (signal.SIGUSR2,)
    assert parallel.preempt_signals({**env, "SUBMITIT_PREEMPT_SIGNAL": "USR1"}) == (signal.SIGUSR1,)
    assert parallel.preempt_signals({"SLURM_JOB_ID": "42"}) == ()
    called = []
    old = signal.signal(signal.SIGUSR2, lambda signum, frame: called.append(signum))
    try:
        assert parallel.requeue_after_stop(signal.SIGUSR2, env) is None
        # a submitit job on this machine (submitit_local): no Slurm job, submitit requeues
        assert parallel.requeue_after_stop(signal.SIGUSR2, {"SUBMITIT_FOLDER": "/x"}) is None
        assert parallel.requeue_after_stop(signal.SIGUSR2, {}) is None  # not in submitit
    finally:
        signal.signal(signal.SIGUSR2, old)
    assert called == [signal.SIGUSR2] * 2


# --------------------------------------------------------------------------- same numbers


def _env(devices: int, cache) -> dict:
    return parallel.forced_devices_env(
        devices,
        PYTHONPATH=str(ROOT),
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )


def _run(args, devices, cache, timeout=300) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        env=_env(devices, cache),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _two_processes(args, cache, timeout=300) -> dict:
    port = parallel.free_ports(2)  # the coordinator's and the roll call's
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), *map(str, args), "--coordinator", f"127.0.0.1:{port}"]
            + ["--num-processes", "2", "--process-id", str(i)],
            env=_env(1, cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out + err[-3000:]
    return json.loads(outs[0][0].strip().splitlines()[-1])


@pytest.mark.slow
def test_same_loss_curve_on_1_2_8_devices_and_2_processes(tmp_path):
    args = ["--steps", 12, "--batch", 32, "--log-every", 4]
    one = _run(args, 1, tmp_path)
    assert one["devices"] == 1 and not one["all_reduce"]
    runs = {f"{d} devices": _run(args, d, tmp_path) for d in (2, 8)}
    runs["2 processes"] = _two_processes(args, tmp_path)
    assert runs["2 processes"]["processes"] == 2
    ref = np.array(one["losses"])
    assert len(ref) == 12 and np.ptp(ref) > 0.1  # the curve moves: the test can fail
    for name, run in runs.items():
        # the batch really is split: the compiled step all-reduces the gradients
        assert run["all_reduce"] and run["shardings"] == ["P()"], name
        np.testing.assert_allclose(run["losses"], ref, rtol=2e-6, atol=0, err_msg=name)
        np.testing.assert_allclose(run["params"], one["params"], rtol=1e-5, err_msg=name)


@pytest.mark.slow
def test_checkpoint_saved_on_8_devices_restores_on_1_and_4(tmp_path):
    """Also: a long unsynced stretch on 8 devices does not deadlock."""
    ckpt, saved = tmp_path / "ckpt", tmp_path / "saved.npz"
    # 300 steps with no log step before the end: the loop's own syncs (every 10 steps on
    # several devices) keep XLA:CPU's all-reduce from deadlocking (without them this run
    # aborted with status 134)
    args = ["--steps", 300, "--log-every", 1000, "--save-every", 150]
    _run([*args, "--ckpt", ckpt, "--dump", saved], 8, tmp_path)
    ref = np.load(saved)
    for devices in (1, 4):
        out = tmp_path / f"restored{devices}.npz"
        got = _run(["--ckpt", ckpt, "--restore-only", "--dump", out], devices, tmp_path)
        assert got == {"devices": devices, "step": 300}
        back = np.load(out)
        assert sorted(back.files) == sorted(ref.files) and len(ref.files) > 10
        for k in ref.files:
            assert np.array_equal(back[k], ref[k]), (devices, k)
