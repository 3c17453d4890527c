"""A failed command removes the Hydra output directory it made, never one that held the logs
of earlier commands (``<run>/eval_logs`` is shared by every ``evaluate`` of a run)."""

from __future__ import annotations

import time

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
    (out / "eval.json").write_text("{}")
    discard_unused_output_dir(out, tmp_path / "run", started)
    assert (out / "eval.json").exists()
