"""Sweeps (``-m``) through the real command line with Hydra's basic launcher (the jobs in
the command's process): every job is checked before any starts; and the line the sweep
prints for a failed submitit job (``hydra_plugins/scorelib_sweeps.py``). Sweeps through the
submitit launchers: tests/slurm."""

from __future__ import annotations

import traceback

import pytest
from entry_helpers import TOY_STEPS, run
from submitit.core.utils import FailedJobError, JobPaths, UncompletedJobError, cloudpickle_dump

from hydra_plugins.scorelib_sweeps import JobFailed, failure_line, job_labels

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


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
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


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
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


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_a_sampling_sweep_is_checked_before_any_job_draws(toy_run, tmp_path):
    """``experiments.sample`` builds each job's run with its sampler and finds its
    checkpoint before any job draws: nothing is written under the run's ``samples/``."""
    before = sorted(p.relative_to(toy_run) for p in (toy_run / "samples").rglob("*"))
    args = [
        f"run_dir={toy_run}",
        "sampler.num_samples=8",
        f"step={TOY_STEPS},7",
        "sampler.steps=2,0",
    ]
    r = run("sample", "-m", *args, cwd=tmp_path, check=False)
    assert r.code == 2, r.stderr[-3000:]
    assert len(r.err_lines) == 4, r.stderr[-3000:]
    assert r.err_lines[0].startswith(f"invalid: step={TOY_STEPS} sampler.steps=0: sampler.steps ")
    assert r.err_lines[1].startswith("invalid: step=7 sampler.steps=2: step=7: no such checkpoint")
    assert r.err_lines[2].startswith("invalid: step=7 sampler.steps=0: ")
    refused = "error: the sweep is refused: 3 of 4 jobs are invalid; no job was started"
    assert r.err_lines[3] == refused
    assert sorted(p.relative_to(toy_run) for p in (toy_run / "samples").rglob("*")) == before


def test_a_table_sweep_is_checked_before_any_table_runs(tmp_path):
    r = run("reproduce", "-m", "table=rdmc", "table.name=rdmc,nosuch", cwd=tmp_path, check=False)
    assert r.code == 2, r.stderr[-3000:]
    assert r.err_lines == [
        "invalid: table.name=nosuch: table.name: no table module 'experiments.tables.nosuch'",
        "error: the sweep is refused: 1 of 2 jobs are invalid; no job was started",
    ]
    assert not (tmp_path / "outputs").exists()


# --------------------------------------------------------------------------- the report


def test_each_job_is_named_by_the_overrides_that_tell_it_from_the_others():
    jobs = [["experiment=toy_dsm", "a=1", "b=x"], ["experiment=toy_dsm", "a=2", "b=x"]]
    assert job_labels(jobs) == ["a=1", "a=2"]
    assert job_labels([["experiment=toy_dsm", "hydra.verbose=true"]]) == ["experiment=toy_dsm"]


class _Job:
    """A finished submitit job as the sweep sees it (``exception``, ``paths``, ``state``)."""

    def __init__(self, folder, err, state="FAILED"):
        self.paths = JobPaths(folder, job_id="7_1", task_id=0)
        self.err, self.state = err, state

    def exception(self):
        return self.err


def test_a_failed_jobs_line_is_the_reason_submitit_kept(tmp_path):
    """The last line of the traceback submitit pickles for a job that raised: the reason
    alone for the JobFailed a job raises on its one-line error, ``<type>: <message>`` for
    an error nothing anticipated; the job's state when it left no result (killed)."""
    job = _Job(tmp_path, FailedJobError("..."))
    job.paths.folder.mkdir(parents=True, exist_ok=True)

    def raised(err):
        try:
            raise err
        except Exception:
            cloudpickle_dump(("error", traceback.format_exc()), job.paths.result_pickle)
        return failure_line(job)

    assert raised(JobFailed("non-finite loss at step 3")) == "non-finite loss at step 3"
    assert raised(KeyError("x")) == "KeyError: 'x'"
    gone = _Job(tmp_path, UncompletedJobError("... has not produced any output"), "OUT_OF_MEMORY")
    assert failure_line(gone) == "the job ended without a result (state: OUT_OF_MEMORY)"
    assert failure_line(_Job(tmp_path, None)) is None
