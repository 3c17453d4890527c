"""Sweeps (``-m``) through the real command line with Hydra's basic launcher (the jobs in
the command's process): every job is checked before any starts, and the sweep ends with one
line per job (``experiments/sweeps.py``). The submitit launchers: tests/slurm."""

from __future__ import annotations

import re
import signal

import pytest
from entry_helpers import run

from experiments.sweeps import Outcome, job_labels, report, status_lines

# A tiny toy run: every job trains a few steps and draws 8 samples.
TINY = [
    "experiment=toy_dsm",
    "trainer.steps=3",
    "trainer.log_every=1",
    "trainer.batch_size=16",
    "model.width=8",
    "sampler.steps=2",
    "sampler.num_samples=8",
]


def test_an_invalid_job_refuses_the_sweep_before_any_job_runs(tmp_path):
    """Issue 21, 5: the valid job used to train first, then the sweep stopped on the
    invalid one. Each invalid job gets a line (a range checked when the run is built, a
    type checked when the config is composed), and nothing is run or written."""
    r = run("train", "-m", *TINY[:-2], "model.width=16,0,abc", cwd=tmp_path, check=False)
    assert r.code == 2, r.stderr[-3000:]
    assert r.err_lines == [
        "invalid: model.width=0: model.width must be an integer >= 1; got 0",
        "invalid: model.width=abc: model.width must be an integer; got 'abc'",
        "error: the sweep is refused: 2 of 3 jobs are invalid; no job was started",
    ], r.stderr[-3000:]
    assert "Launching" not in r.stdout
    assert not (tmp_path / "outputs").exists()  # not even Hydra's multirun.yaml


def test_a_refused_sweep_keeps_the_directories_and_files_that_were_there(tmp_path):
    sweep = tmp_path / "outputs" / "toy_dsm"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("an earlier sweep's\n")
    r = run("train", "-m", *TINY, "trainer.seed=-1", cwd=tmp_path, check=False)
    assert r.code == 2
    assert r.err_lines[-1] == "error: the sweep is refused: it is invalid; no job was started"
    assert [p.name for p in sweep.iterdir()] == ["multirun.yaml"]
    assert (sweep / "multirun.yaml").read_text() == "an earlier sweep's\n"


def test_a_distillation_sweep_is_checked_by_building_each_run(tmp_path):
    args = ["experiment=fdistill_gmm", "trainer.steps=2", "distill.divergence=kl,bogus"]
    r = run("distill", "-m", *args, "distill.r1_weight=0,-1", cwd=tmp_path, check=False)
    assert r.code == 2, r.stderr[-3000:]
    bad_r1 = "distill.r1_weight must be a number in [0.0, inf); got -1"
    bad_div = "distill.divergence must be one of ['rkl', 'kl', 'js', 'sf', 'sh', 'jf', 'neyman']"
    assert r.err_lines == [
        f"invalid: distill.divergence=kl distill.r1_weight=-1: {bad_r1}",
        f"invalid: distill.divergence=bogus distill.r1_weight=0: {bad_div}; got 'bogus'",
        f"invalid: distill.divergence=bogus distill.r1_weight=-1: {bad_div}; got 'bogus'",
        "error: the sweep is refused: 3 of 4 jobs are invalid; no job was started",
    ]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_a_job_that_fails_at_run_time_is_reported_and_the_sweep_goes_on(tmp_path):
    """The first job's loss is not finite at its first step (learning rate 1e30): the
    second still runs, and the sweep ends with one line per job and exit status 1.
    (Two tiny trainings in one process: about 30 s on 2 cores.)"""
    r = run("train", "-m", *TINY, "optim.lr=1e30,0.001", cwd=tmp_path, check=False)
    assert r.code == 1, r.stderr[-3000:]
    done = [line for line in r.stdout.splitlines() if line.startswith("done:")]
    run_dir = "outputs/toy_dsm/model.width-8+optim.lr-{}+trainer.batch_size-16"
    assert done == [f"done: optim.lr=0.001 -> {run_dir.format('0.001')}"]
    failed = run_dir.format("1e+30")
    assert re.fullmatch(
        r"failed: optim\.lr=1e\+30: non-finite loss at step \d+ "
        rf"\(log: {re.escape(failed)}/train\.log\)",
        r.err_lines[-2],
    ), r.stderr[-3000:]
    assert r.err_lines[-1] == "error: 1 of 2 jobs did not finish (1 failed)"
    assert "Traceback" not in r.stderr
    assert (tmp_path / run_dir.format("0.001") / "samples/step3").is_dir()


# --------------------------------------------------------------------------- the report


def test_each_job_is_named_by_the_overrides_that_tell_it_from_the_others():
    jobs = [["experiment=toy_dsm", "a=1", "b=x"], ["experiment=toy_dsm", "a=2", "b=x"]]
    assert job_labels(jobs) == ["a=1", "a=2"]
    assert job_labels([["experiment=toy_dsm", "hydra.verbose=true"]]) == ["experiment=toy_dsm"]


def test_the_status_lines_of_a_log_are_found_between_progress_bars(tmp_path):
    log = tmp_path / "job.err"
    log.write_text(
        "toy:  1%| 10/20000\rtoy:  2%| 20/20000 [...][WARNING] - SIGUSR2 received\n"
        "saved step 21 on SIGUSR2; submitit requeued the job\n"
        "toy:  0%| 0/20000\rtoy: 100%| 20000/20000\n"
        "an error: not at the start of a line\nerror: non-finite loss at step 3\n"
    )
    assert status_lines(log) == [
        "saved step 21 on SIGUSR2; submitit requeued the job",
        "error: non-finite loss at step 3",
    ]
    assert status_lines(tmp_path / "missing.err") == []


def test_the_exit_status_says_whether_a_job_failed_or_was_stopped(capsys):
    jobs = [["a=1"], ["a=2"]]
    done = Outcome("done", "outputs/a-1", ret="ret")
    failed = Outcome("failed", "boom", log=None)
    usr1 = 128 + signal.SIGUSR1
    stopped = Outcome("stopped", "saved step 5 on SIGUSR1; rerun", code=usr1)
    assert report([done, done], jobs) == ["ret", "ret"]
    for outcomes, code in [([done, failed], 1), ([stopped, failed], 1), ([done, stopped], usr1)]:
        with pytest.raises(SystemExit) as e:
            report(outcomes, jobs)
        assert e.value.code == code
    out, err = capsys.readouterr()
    assert out.splitlines()[:2] == ["done: a=1 -> outputs/a-1", "done: a=2 -> outputs/a-1"]
    assert err.splitlines()[-2:] == [
        "stopped: a=2: saved step 5 on SIGUSR1; rerun",
        "error: 1 of 2 jobs did not finish (1 stopped); the same command resumes the stopped jobs",
    ]
