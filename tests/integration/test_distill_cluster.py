"""experiments.distill on a cluster (experiments.cluster_run): submitit's time-limit signal
(SIGUSR2) saves the step before submitit's own handler runs, and the resumed run is bit
identical to the uninterrupted one; data-parallel over 4 devices in 2 processes (``python
-m experiments.distill``), the one-device run's losses and student."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from entry_helpers import ROOT, run_inprocess
from hydra import compose, initialize_config_dir
from test_distill import SMOKE, _same

from experiments.common import CONFIG_DIR
from scorelib import parallel

STEPS = 200


def _signal_after_first_log(metrics, signum, timeout=300):
    """Send ``signum`` to this process once ``metrics`` has a line (training runs)."""

    def wait():
        t0 = time.time()
        while time.time() - t0 < timeout:
            if metrics.is_file() and metrics.read_text().strip():
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _compose(*overrides):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("distill", overrides=[*SMOKE, *overrides])


@pytest.fixture(scope="module")
def smoke_run():
    """SMOKE's DistillRun, built once: the in-process runs of this module share its
    compiled step (SMOKE's trainer.steps, log_every and ckpt_every are not in it)."""
    from experiments.runs import DistillRun

    return DistillRun.build(_compose())


@pytest.fixture
def same_build(smoke_run, monkeypatch):
    """``DistillRun.build(cfg)`` returns :func:`smoke_run` with ``cfg`` and a fresh state:
    copies (the step donates) committed to the device as a restored checkpoint is, so that
    a resumed run reuses the uninterrupted run's executables (an uncommitted fresh state
    compiles the step a second time; test_distill.py resumes a fresh run's checkpoint
    through those other executables)."""
    from experiments.runs import DistillRun

    device = jax.devices()[0]

    def build(cls, cfg, mesh=None):
        state = jax.device_put(jax.tree.map(jnp.copy, smoke_run.state), device)
        return dataclasses.replace(smoke_run, cfg=cfg, state=state)

    monkeypatch.setattr(DistillRun, "build", classmethod(build))


@pytest.mark.slow
def test_submitit_time_limit_signal_saves_then_resume_is_bit_identical(
    tmp_path, monkeypatch, same_build
):
    from experiments.runs import DistillRun, saved_steps, train_run
    from scorelib import training

    cfg = _compose(f"trainer.steps={STEPS}")
    cfg.trainer.ckpt_every = 100000  # only the signal and the end save
    quiet = dict(progress=False, tensorboard=False)

    _, whole = train_run(DistillRun, cfg, tmp_path / "whole", handle_signals=False, **quiet)
    whole = jax.device_get(whole)

    # inside a submitit job: submitit's USR2 handler is installed, and a Slurm job id set
    handled = []
    monkeypatch.setenv("SUBMITIT_FOLDER", str(tmp_path / "submitit"))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: handled.append(signum))
    run_dir = tmp_path / "signalled"
    try:
        thread = _signal_after_first_log(run_dir / "metrics.jsonl", signal.SIGUSR2)
        with pytest.raises(training.Interrupted) as stop:
            train_run(DistillRun, cfg, run_dir, handle_signals=True, **quiet)
        thread.join(10)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert stop.value.signum == signal.SIGUSR2
    saved = saved_steps(run_dir)
    assert len(saved) == 1 and 5 <= saved[0] < STEPS, saved  # the signal's checkpoint
    assert handled == [signal.SIGUSR2]  # submitit's handler (it requeues) ran after the save

    monkeypatch.delenv("SUBMITIT_FOLDER")
    monkeypatch.delenv("SLURM_JOB_ID")
    _, resumed = train_run(DistillRun, cfg, run_dir, handle_signals=False, **quiet)
    resumed = jax.device_get(resumed)
    assert int(resumed.step) == int(whole.step) == STEPS
    assert _same(resumed, whole)


#: The runs compared: 8 steps, each logged, one checkpoint at the end.
EIGHT = ["trainer.steps=8", "trainer.log_every=1", "trainer.ckpt_every=8"]


def _distill(run_dir, devices, *extra):
    """``python -m experiments.distill`` (SMOKE, :data:`EIGHT`) in a process whose JAX sees
    ``devices`` CPU devices."""
    args = [*SMOKE, *EIGHT]
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.distill", *args, f"hydra.run.dir={run_dir}", *extra],
        cwd=ROOT,
        env=parallel.forced_devices_env(devices, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out + err[-3000:]
    return out


def _losses(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ("loss_student", "loss_fake", "loss_disc", "r_mean", "h_max", "ratio_bin0")
    return np.array([[r[k] for k in keys] for r in rows])


@pytest.mark.slow
def test_data_parallel_distillation_on_2_processes_of_2_devices_is_the_one_device_run(
    tmp_path, same_build
):
    """The global batch split over 4 devices in 2 processes (``python -m
    experiments.distill``, jax.distributed on localhost): the losses, ratios and per-bin
    means of every step, and the student's samples, are the one-device run's (the same
    run in this process, with the module's compiled step) up to the order of the
    reductions."""
    from experiments.runs import DistillRun, train_run

    one = tmp_path / "one"
    quiet = dict(progress=False, handle_signals=False, tensorboard=False)
    run_, state = train_run(DistillRun, _compose(*EIGHT), one, **quiet)
    run_.save_samples(state, one, progress=False)  # as experiments.distill does
    port = parallel.free_ports(2)  # the coordinator's and the roll call's
    four = tmp_path / "four"
    cluster = [f"cluster.coordinator_address=127.0.0.1:{port}", "cluster.num_processes=2"]
    procs = [_distill(four, 2, *cluster, f"cluster.process_id={i}") for i in range(2)]
    outs = [_finish(p) for p in procs]
    assert "discriminator:" in outs[0] and "discriminator:" not in outs[1]  # process 0 speaks
    ref, got = _losses(one), _losses(four)
    assert ref.shape == (8, 6) and np.ptp(ref[:, 0]) > 0  # the losses move: the test can fail
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)
    (a,) = (one / "samples/step8").iterdir()
    (b,) = (four / "samples/step8").iterdir()
    with np.load(a / "samples.npz") as x, np.load(b / "samples.npz") as y:
        np.testing.assert_allclose(y["samples"], x["samples"], rtol=1e-4, atol=1e-5)


def test_gpus_asked_for_on_a_cpu_only_jax_are_refused(tmp_path):
    r = run_inprocess("distill", *SMOKE, "cluster=gpu", f"hydra.run.dir={tmp_path / 'r'}")
    assert r.code == 2, r.stderr
    assert "but JAX sees only the CPU" in r.stderr and "cluster.allow_cpu=true" in r.stderr


def test_no_cluster_field_names_a_distillation_run():
    from experiments import schema

    schema.register_configs()

    def run_dir(overrides):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("distill", overrides=overrides, return_hydra_config=True)
        return f"{cfg.hydra.sweep.dir}/{cfg.hydra.job.override_dirname}"

    fields = [f"cluster.{f}" for f in schema.CLUSTER_FIELDS if f.endswith(("nodes", "_per_node"))]
    moved = run_dir([*SMOKE, "hydra/launcher=slurm", "cluster=gpu", *(f"{f}=2" for f in fields)])
    assert moved == run_dir(SMOKE)
    assert "cluster" not in moved
