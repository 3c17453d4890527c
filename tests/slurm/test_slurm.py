"""The Slurm path on a real single-node Slurm with accounting (``slurm/local/``):

(a) ``sbatch slurm/train.sbatch`` with 2 tasks (two JAX processes) gives the single-process
    result;
(b) a Hydra ``-m`` sweep through the submitit Slurm launcher and the ``cluster/`` group:
    every job's outputs and exit state; a failing job makes the sweep exit non-zero with
    the job's error;
(c) SIGUSR1 (the batch script's time-limit warning) makes the trainer save, requeue its own
    job, and the requeued job resumes and ends with the uninterrupted result, bit for bit;
    submitit's time-limit signal (USR2) makes the trainer save before submitit requeues.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
import pytest
from slurm_helpers import ROOT, RUN, SMALL, losses, samples, start_local_slurm, train_locally

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The local Slurm (skips with the reason where it cannot run)."""
    yield from start_local_slurm(tmp_path_factory)


SBATCH = ROOT / "slurm" / "train.sbatch"
JOB = ["--cpus-per-task=1", "--mem=1G", "--time=10"]


# The signal tests send the signal as soon as the first step line (step 10) is logged, not
# after a fixed time, so a slow start-up cannot make them miss the run; the remaining
# 4,990 steps take 7-25 s on 2 loaded cores (about 3 s at 1,500 steps/s) against well
# under a second from the log line to the signal. Should a run finish first anyway, the
# test says so (RACE) rather than failing on a missing line.
RACE = "the run finished before the signal arrived (raise its trainer.steps)"


def _wait_for_log_line(run_dir, job, slurm, timeout=180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if (run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").read_text():
            return
        assert slurm.state(job).startswith(("RUNNING", "PENDING")), slurm.state(job)
        time.sleep(0.05)
    raise TimeoutError("the job logged no step")


def test_sbatch_two_tasks_equals_one_process(slurm, tmp_path):
    args = [*SMALL, "trainer.steps=30"]
    job = slurm.sbatch(*JOB, "--ntasks-per-node=2", SBATCH, *args, cwd=tmp_path)
    ref_home = tmp_path / "ref"
    ref_home.mkdir()
    train_locally(ref_home, *args, env=slurm.env)
    slurm.wait(job)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert slurm.sacct(job) == [(job, "COMPLETED", "0:0")], out[-3000:]
    assert "process 1 of 2 (slurm settings)" in out, out[-3000:]
    two, one = tmp_path / "outputs/toy_dsm" / RUN, ref_home / "outputs/toy_dsm" / RUN
    got, ref = losses(two), losses(one)
    assert list(got) == list(ref) == [10, 20, 30]
    np.testing.assert_allclose(list(got.values()), list(ref.values()), rtol=1e-5)
    np.testing.assert_allclose(samples(two, 30), samples(one, 30), rtol=1e-3, atol=1e-4)
    assert '"devices": [\n' in (two / "run_info.json").read_text()


def test_hydra_sweep_through_submitit(slurm, tmp_path):
    args = [*SMALL, "trainer.steps=20", "cluster.mem_gb=1", "cluster.cpus_per_task=1"]
    proc = slurm.cmd(
        sys.executable,
        "-m",
        "experiments.train",
        "-m",
        "hydra/launcher=slurm",
        "cluster=cpu",
        "cluster.time_min=10",
        *args,
        "trainer.seed=0,1,-1",  # the third job fails on its config, in the job
        cwd=tmp_path,
        check=False,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stdout
    assert "error: trainer.seed must be an integer >= 0; got -1" in proc.stderr, proc.stderr
    assert "state: FAILED" in proc.stderr
    sweep = tmp_path / "outputs/toy_dsm"
    jobs = sorted(
        p.name for p in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name)
    )
    states = {row[0]: row[1:] for j in jobs for row in slurm.sacct(j)}
    assert sorted(states.values()) == [("COMPLETED", "0:0")] * 2 + [("FAILED", "2:0")]
    # each job wrote where the same run outside Slurm writes: outputs/<name>/<overrides>
    for seed in (0, 1):
        run_dir = sweep / f"{RUN}+trainer.seed-{seed}"
        assert list(losses(run_dir)) == [10, 20]
        assert samples(run_dir, 20).shape == (64, 2)
    assert not (sweep / f"{RUN}+trainer.seed--1" / "checkpoints").exists()


def test_sigusr1_saves_requeues_and_resumes_bit_identical(slurm, tmp_path):
    steps = 5000  # long enough to be running when the signal arrives
    args = [*SMALL, f"trainer.steps={steps}"]
    job = slurm.sbatch(*JOB, SBATCH, *args, cwd=tmp_path)
    run_dir = tmp_path / "outputs/toy_dsm" / RUN
    _wait_for_log_line(run_dir, job, slurm)
    slurm.cmd("scancel", "--signal=USR1", job)
    ref_home = tmp_path / "ref"
    ref_home.mkdir()
    train_locally(ref_home, *args, env=slurm.env)
    slurm.wait(job)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    records = slurm.sacct(job)
    assert len(records) > 1 or "saved step" in out, RACE
    assert [r[1] for r in records] == ["REQUEUED", "COMPLETED"], (records, out[-3000:])
    assert f"requeued Slurm job {job}" in out
    saved = [line for line in out.splitlines() if line.startswith("saved step")]
    assert len(saved) == 1, out[-3000:]
    stopped = int(saved[0].split()[2].rstrip(";"))
    assert 10 <= stopped < steps
    assert f"from step {stopped} of {steps}" in out
    assert "restart 1" in out
    assert list(losses(run_dir)) == list(range(10, steps + 1, 10))
    ref = samples(ref_home / "outputs/toy_dsm" / RUN, steps)
    assert np.array_equal(samples(run_dir, steps), ref)


def test_submitit_time_limit_signal_saves_before_requeue(slurm, tmp_path):
    steps = 5000  # long enough to be running when the signal arrives
    args = [*SMALL, f"trainer.steps={steps}", "cluster.mem_gb=1", "cluster.cpus_per_task=1"]
    cmd = [sys.executable, "-m", "experiments.train", "-m", "hydra/launcher=slurm", "cluster=cpu"]
    sweep = subprocess.Popen(
        [*cmd, "cluster.time_min=10", *args],
        cwd=tmp_path,
        env=slurm.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_dir = tmp_path / "outputs/toy_dsm" / RUN
        t0 = time.time()
        while not (tmp_path / "outputs/toy_dsm/.submitit").is_dir() or not any(
            p.name.isdigit() for p in (tmp_path / "outputs/toy_dsm/.submitit").iterdir()
        ):
            assert sweep.poll() is None and time.time() - t0 < 120, sweep.stdout.read()
            time.sleep(0.2)
        (job,) = [
            p.name for p in (tmp_path / "outputs/toy_dsm/.submitit").iterdir() if p.name.isdigit()
        ]
        _wait_for_log_line(run_dir, job, slurm)
        slurm.cmd("scancel", "--signal=USR2", job)
        slurm.wait(job)
        out, _ = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 0, out
    logs = tmp_path / "outputs/toy_dsm/.submitit" / job
    err, out = (logs / f"{job}_0_log.err").read_text(), (logs / f"{job}_0_log.out").read_text()
    assert "Caught signal SIGUSR2" in err, err[-3000:]
    records = slurm.sacct(job)
    assert len(records) > 1 or "Caught signal" in err, RACE
    assert [r[1] for r in records] == ["REQUEUED", "COMPLETED"], (records, err[-3000:])
    # ckpt_every=100000: the step it resumed from was saved on the signal, before the requeue
    resumed = re.findall(r"from step (\d+) of 5000", out)
    assert len(resumed) == 1 and 10 <= int(resumed[0]) < steps, out[-3000:]
    assert samples(run_dir, steps).shape == (64, 2)
