"""A failed command removes the Hydra output directory it made, never one that held the logs
of earlier commands (``<run>/eval_logs`` is shared by every ``evaluate`` of a run)."""

from __future__ import annotations

import time

from entry_helpers import copy_run, run

from experiments.common import discard_unused_output_dir


def test_a_directory_made_by_the_failed_command_goes_with_its_empty_parents(tmp_path):
    started = time.time()
    run_dir = tmp_path / "no_such_run"
    out = run_dir / "eval_logs"
    out.mkdir(parents=True)
    (out / "evaluate.log").write_text("this command's log\n")
    discard_unused_output_dir(out, run_dir, started)
    assert not run_dir.exists()
    assert tmp_path.exists()


def test_a_directory_that_held_earlier_logs_is_kept(tmp_path):
    run_dir = tmp_path / "run"
    out = run_dir / "eval_logs"
    out.mkdir(parents=True)
    log = out / "evaluate.log"
    log.write_text("an earlier evaluate\n")
    time.sleep(0.1)  # file-system timestamps are coarse (up to 10 ms)
    started = time.time()
    with log.open("a") as f:  # Hydra appends this command's log to the same file
        f.write("this command's log\n")
    discard_unused_output_dir(out, run_dir, started)
    assert log.read_text() == "an earlier evaluate\nthis command's log\n"


def test_a_directory_with_outputs_is_kept_whenever_it_was_made(tmp_path):
    started = time.time()
    out = tmp_path / "run" / "eval_logs"
    out.mkdir(parents=True)
    (out / "eval_samples.json").write_text("{}")
    discard_unused_output_dir(out, tmp_path / "run", started)
    assert (out / "eval_samples.json").exists()


def test_a_refused_command_removes_the_log_it_added_to_an_existing_directory(tmp_path):
    """``sample_logs/`` of earlier commands is kept, with their logs; the empty log a
    refused command added there goes (issue 39, item 5)."""
    out = tmp_path / "run" / "sample_logs"
    (out / "experiment-cfdm_moons").mkdir(parents=True)
    (out / "earlier.log").write_text("an earlier command\n")
    # what RecordOutputDirs records before Hydra makes the output directory
    existed = frozenset([out, *out.parents, *out.iterdir()])
    (out / "sample.log").write_text("")  # Hydra's job logging, then the refusal
    discard_unused_output_dir(out, tmp_path / "run", time.time(), existed)
    assert sorted(p.name for p in out.iterdir()) == ["earlier.log", "experiment-cfdm_moons"]


def test_the_log_holds_what_the_command_printed(toy_run, tmp_path):
    """``eval_logs/evaluate.log`` holds what ``experiments.evaluate`` printed, after a line
    with the time and the command (issue 39, item 6)."""
    run_dir = copy_run(toy_run, tmp_path / "run")
    r = run("evaluate", f"run_dir={run_dir}", "seed=1", cwd=tmp_path)
    log = (run_dir / "eval_logs" / "evaluate.log").read_text()
    assert log.startswith("== ") and log.count("== ") == 1, log
    assert f"python -m experiments.evaluate run_dir={run_dir} seed=1\nevaluating " in log
    assert "| samples |" in r.stdout and log.endswith(r.stdout), log
