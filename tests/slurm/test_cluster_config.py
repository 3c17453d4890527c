"""The cluster/ group and the Slurm launcher config, without a Slurm: the launcher takes its
resources from cluster/, no cluster field is part of a run's name, a sweep's job writes
where the same single run writes, and the docs' CIFAR-10 recipe (docs/clusters.md) points the
table at the directory its training command writes. Sweeps through submitit's local
launcher: every job checked before any is submitted, one line per failed job, and a
time-limit signal (USR2) that saves, requeues and resumes the job
(hydra_plugins/scorelib_sweeps.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doc_pages import all_text
from hydra import compose, initialize_config_dir
from slurm_helpers import ROOT

from experiments import schema
from experiments.runs.identity import identity


def _compose(overrides, name="train", hydra=True):
    schema.register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(name, overrides=overrides, return_hydra_config=hydra)


def _run_dir(cfg) -> str:
    return f"{cfg.hydra.sweep.dir}/{cfg.hydra.job.override_dirname}"


@pytest.mark.parametrize("option", ["local", "cpu", "gpu"])
def test_launcher_takes_its_resources_from_the_cluster_group(option):
    cfg = _compose(["hydra/launcher=slurm", f"cluster={option}", "cluster.mem_gb=3"])
    launcher, cluster = cfg.hydra.launcher, cfg.cluster
    assert launcher.mem_gb == 3
    for field, key in [
        ("timeout_min", "time_min"),
        ("nodes", "nodes"),
        ("tasks_per_node", "tasks_per_node"),
        ("gpus_per_node", "gpus_per_node"),
        ("cpus_per_task", "cpus_per_task"),
        ("partition", "partition"),
        ("account", "account"),
        ("signal_delay_s", "signal_delay_s"),
        ("max_num_timeout", "max_num_timeout"),
    ]:
        assert launcher[field] == cluster[key], field
    assert (cluster.gpus_per_node > 0) == (option == "gpu")


def test_reproduce_gets_the_launcher_defaults_without_a_cluster_node():
    cfg = _compose(["hydra/launcher=slurm", "table=gaussian_teleport"], name="reproduce")
    assert (cfg.hydra.launcher.gpus_per_node, cfg.hydra.launcher.timeout_min) == (1, 1440)


def test_no_cluster_field_names_or_identifies_a_run():
    fields = [f"cluster.{f}" for f in schema.CLUSTER_FIELDS]
    plain = _compose(["experiment=toy_dsm", "trainer.seed=1"])
    moved = _compose(
        ["experiment=toy_dsm", "trainer.seed=1", "hydra/launcher=slurm", "cluster=gpu"]
        + [f"{f}=1" for f in fields if f.endswith(("nodes", "_per_node", "num_processes"))]
    )
    assert _run_dir(plain) == _run_dir(moved) == "outputs/toy_dsm/trainer.seed-1"
    plain, moved = (_compose(c.hydra.overrides.task, hydra=False) for c in (plain, moved))
    assert identity(plain) == identity(moved)
    assert not any(k.startswith("cluster") for k in identity(moved))


def test_bad_cluster_field_is_refused_at_start_up():
    with pytest.raises(Exception, match="gpus_per_node"):
        _compose(["cluster.gpus_per_node=two"])


def test_the_docs_cifar_recipe_points_the_table_at_the_trained_run():
    text = all_text()
    block = re.search(
        r"python -m experiments\.train -m (hydra/launcher=slurm cluster=gpu [^#]*?"
        r"name=cifar10_edm[^#]*?)\n# the run directory",
        text,
    )
    assert block, "the CIFAR-10 recipe is not where this test expects it"
    overrides = shlex.split(block[1].replace("\\\n", " "))
    (shown,) = re.findall(r"RUN='(outputs/cifar10_edm/[^']+)'", text)
    assert _run_dir(_compose(overrides)) == shown
    assert '"table.checkpoint=$RUN"' in text


@pytest.mark.parametrize(
    "module", ["train", "distill", "sample", "evaluate", "reproduce", "reconstruct"]
)
def test_the_task_function_pickles_by_value(module):
    """Submitit pickles the Hydra task function with cloudpickle, by value when the command
    runs as ``python -m experiments.<module>`` (module ``__main__``): every global it
    reaches must pickle (a ContextVar did not, and broke hydra/launcher=slurm)."""
    import importlib

    import cloudpickle

    mod = importlib.import_module(f"experiments.{module}")
    task = mod.main.__wrapped__  # what hydra.main hands the launcher
    cloudpickle.register_pickle_by_value(mod)
    try:
        back = cloudpickle.loads(cloudpickle.dumps(task))
    finally:
        cloudpickle.unregister_pickle_by_value(mod)
    assert callable(back)


def _local_sweep(tmp_path, *args, popen=False):
    """``python -m experiments.train -m hydra/launcher=submitit_local <args>`` in
    ``tmp_path``, outside any Slurm or submitit job (``popen``: started, not waited for)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    for k in list(env):
        if k.startswith(("SLURM_", "SUBMITIT_")) or k in ("HYDRA_FULL_ERROR", "SCORELIB_TRACEBACK"):
            del env[k]
    cmd = [sys.executable, "-m", "experiments.train", "-m", "hydra/launcher=submitit_local", *args]
    if popen:
        pipe = subprocess.PIPE
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=pipe, stderr=pipe, text=True)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_sweep_through_the_submitit_launcher_runs_without_slurm(tmp_path):
    """``-m hydra/launcher=submitit_local``: the same pickling and job start-up as the Slurm
    launcher, on any machine; the job writes where the single run would. (One job: 30-40 s
    on 2 cores, most of it JAX's start-up in the job.)"""
    args = ["experiment=toy_dsm", "trainer.steps=5", "trainer.log_every=5", "model.width=8"]
    args += ["sampler.steps=2", "sampler.num_samples=8", "trainer.seed=1"]  # one job
    proc = _local_sweep(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "outputs/toy_dsm/model.width-8+trainer.seed-1"
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [5], proc.stderr[-3000:]
    assert (run_dir / "samples/step5").is_dir()
    assert (tmp_path / "outputs/toy_dsm/.submitit").is_dir()  # it went through submitit


# Issue 21, 5: sweeps through submitit without Slurm (hydra/launcher=submitit_local).
TINY = ["experiment=toy_dsm", "trainer.steps=3", "trainer.batch_size=16", "model.width=8"]
TINY += ["sampler.steps=2", "sampler.num_samples=8"]


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_an_invalid_job_refuses_a_submitit_sweep_before_any_job_is_submitted(tmp_path):
    """The issue's input: the valid job used to run, then a 48-line UncompletedJobError."""
    proc = _local_sweep(tmp_path, "experiment=toy_dsm", "trainer.steps=200", "model.width=16,0")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        "invalid: model.width=0: model.width must be an integer >= 1; got 0",
        "error: the sweep is refused: 1 of 2 jobs are invalid; no job was started",
    ]
    assert not (tmp_path / "outputs").exists()  # nothing submitted (no .submitit/)


@pytest.mark.slow
def test_a_submitit_sweep_reports_each_failed_job_in_one_line(tmp_path):
    """Issue 21, 5: a job that fails at run time (its loss is not finite at once: learning
    rate 1e30) used to end the sweep with submitit's UncompletedJobError and the job's log
    (about 50 lines). Now: one line with its overrides, error and log, the other job done,
    exit status 1; the job itself exited non-zero with its traceback in its log.
    (About 80 s on 2 cores.)"""
    proc = _local_sweep(tmp_path, *TINY, "optim.lr=1e30,0.001")
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    failed = re.fullmatch(
        r"failed: optim\.lr=1e\+30: non-finite loss at step 1 \(log: (\S+)\)", lines[0]
    )
    assert failed, lines
    assert re.fullmatch(r"outputs/toy_dsm/\.submitit/\d+/\d+_0_log\.err", failed[1])
    assert "JobFailed: non-finite loss at step 1" in (tmp_path / failed[1]).read_text()
    assert lines[1] == "error: 1 of 2 jobs failed"
    run = "outputs/toy_dsm/model.width-8+optim.lr-0.001+trainer.batch_size-16"
    assert (tmp_path / run / "samples/step3").is_dir()


def _writer_of(path: Path) -> int | None:
    """The process that has ``path`` open (Linux: /proc/<pid>/fd), or None."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in fds):
                return int(pid)
        except OSError:
            continue
    return None


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the jobs in /proc")
def test_a_time_limit_signal_saves_requeues_and_resumes_a_local_job(tmp_path):
    """Issue 21, 5: submitit's time-limit signal (USR2) to a submitit_local job used to
    save the step, then fail the sweep with 275 lines. Now the step is saved, submitit
    requeues the job (the local executor restarts it), it resumes from that step and
    finishes. USR1 (no requeue outside Slurm) to the other job: the step is saved and the
    job's line says so. (About 2 minutes on 2 cores.)"""
    steps = 5000  # long enough to be running when the signal arrives
    args = [f"trainer.steps={steps}", "trainer.log_every=10", "trainer.ckpt_every=100000"]
    args += ["trainer.batch_size=64", "model.width=32", "sampler.steps=10"]
    sweep = _local_sweep(tmp_path, "experiment=toy_dsm", *args, "trainer.seed=0,1", popen=True)
    name = "outputs/toy_dsm/model.width-32+trainer.batch_size-64+trainer.seed-{}"
    runs = {seed: tmp_path / name.format(seed) for seed in (0, 1)}
    signals = {0: signal.SIGUSR2, 1: signal.SIGUSR1}
    jobs = {}  # seed: its local job's folder, named by the pid of submitit's controller
    try:
        t0 = time.time()
        while signals and time.time() - t0 < 300 and sweep.poll() is None:
            for seed in list(signals):
                metrics = runs[seed] / "metrics.jsonl"
                task = _writer_of(runs[seed] / "train.log") if metrics.is_file() else None
                if task is not None and metrics.read_text():
                    jobs[seed] = tmp_path / f"outputs/toy_dsm/.submitit/{_parent(task)}"
                    os.kill(task, signals.pop(seed))
            time.sleep(0.05)
        assert not signals, "the jobs did not log a step in time"
        out, err = sweep.communicate(timeout=300)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 1, (out[-2000:], err[-3000:])
    job = jobs[0].name
    log_err = (jobs[0] / f"{job}_0_log.err").read_text()
    saved = re.findall(r"saved step (\d+) on SIGUSR2", log_err)
    assert len(saved) == 1, log_err[-3000:]
    assert (
        f"resuming {runs[0]} from step {saved[0]} of {steps}"
        in (jobs[0] / f"{job}_0_log.out").read_text()
    )
    assert (runs[0] / "checkpoints" / str(steps)).is_dir()
    lines = err.splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err[-3000:]
    usr1 = re.fullmatch(
        r"failed: trainer\.seed=1: saved step (\d+); rerun the same command to resume "
        rf"\(log: outputs/toy_dsm/\.submitit/{jobs[1].name}/{jobs[1].name}_0_log\.err\)",
        lines[0],
    )
    assert usr1, lines
    assert sorted(p.name for p in (runs[1] / "checkpoints").iterdir()) == [usr1[1]]
    assert lines[1] == "error: 1 of 2 jobs failed"


def test_the_cifar10_fdistill_recipe_asks_the_launcher_for_a_node_of_gpus():
    """The Slurm command in the fdistill_cifar10 preset's comment composes to the preset
    with 8 GPUs per job, one task (JAX process) each, the 2048 batch a multiple of them
    (without ``cluster=gpu`` the jobs get ``cluster=local``'s resources: no GPU); the
    docs give the same command."""
    command = re.search(
        r"#   (python -m experiments\.distill -m (?:[^\n]*\\\n#)*[^\n]*)",
        (ROOT / "configs/experiment/fdistill_cifar10.yaml").read_text(),
    )
    assert command, "the preset's Slurm command is not where this test expects it"
    words = shlex.split(re.sub(r"\\\n#", " ", command[1]).replace("<your CIFAR-10 EDM run>", "t"))
    assert words[:4] == ["python", "-m", "experiments.distill", "-m"]
    overrides = [w.split(",")[0] for w in words[4:]]  # a sweep's first job
    cfg = _compose(overrides, name="distill")
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.gpus_per_node == 8 and cfg.cluster.gpus_per_node == 8
    assert cfg.hydra.launcher.tasks_per_node == 8 and cfg.cluster.tasks_per_node == 8
    assert cfg.trainer.batch_size % 8 == 0
    assert (cfg.trainer.batch_size, cfg.trainer.steps, cfg.distill.r1_weight) == (2048, 60000, 1)
    docs = " ".join(all_text().split())
    assert " ".join(words[:7]) in docs, " ".join(words[:7])
