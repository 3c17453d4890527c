"""Checkpointer: any directory name, save-time read-back, corrupt checkpoints, retention,
async errors, a kill mid-save, and restoring another run's parameters."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils.epath import gpath

sys.path.insert(0, os.path.dirname(__file__))
import toy_train  # noqa: E402

from scorelib.training import (  # noqa: E402
    Checkpointer,
    CheckpointError,
    IncompatibleCheckpoint,
    abstract_state,
    create_state,
    make_optimizer,
    restore_params,
    train,
)
from scorelib.training import checkpoint as checkpoint_mod  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _state(offset=0.0):
    return {"a": jnp.arange(4.0) + offset, "b": {"c": jnp.full((2, 3), 1.0 + offset)}}


def _abstract():
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state())


def _equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


# Names a user can give (Hydra list overrides make brackets and commas; shells make the rest).
NAMES = [
    "brk[1]",
    "model.channel_mult=[2,2,2]",
    "a=b,c=d",
    "with space",
    "x+y",
    "it's",
    'say "hi"',
    "glob*?{a,b}",
    "]odd[",
]


@pytest.mark.parametrize("name", NAMES)
def test_save_restore_under_any_directory_name(tmp_path, name):
    d = tmp_path / name / "checkpoints"
    with Checkpointer(d, save_every=1, keep_last=2) as c:
        c.save(1, _state(1.0))
        c.save(2, _state(2.0))
        c.wait()
        assert c.all_steps() == [1, 2]
        assert _equal(c.restore_latest(_abstract()), _state(2.0))
        assert _equal(c.restore(1, _abstract()), _state(1.0))
    with Checkpointer(d, save_every=1) as c:  # a new manager: nothing cached
        assert _equal(c.restore_latest(_abstract()), _state(2.0))


def test_backslash_in_directory_is_refused(tmp_path):
    # TensorStore's file driver would write "a\b" into "a/b": refused before anything is written
    with pytest.raises(ValueError, match=r"checkpoint directory must be a path without a backsl"):
        Checkpointer(tmp_path / "a\\b", save_every=1)
    assert os.listdir(tmp_path) == []


def test_constructing_writes_nothing(tmp_path):
    c = Checkpointer(tmp_path / "run" / "checkpoints", save_every=1)
    assert c.all_steps() == [] and c.latest_step() is None
    assert c.restore_latest(_abstract()) is None
    c.close()
    assert not (tmp_path / "run").exists()


def test_unreadable_save_is_an_error_at_save_time(tmp_path, monkeypatch):
    # Put back etils' glob (the directory joined into the pattern): under "brk[1]" orbax
    # then skips the OCDBT merge with only a warning. The read-back must catch it.
    monkeypatch.setattr(checkpoint_mod._LiteralDirPath, "glob", gpath.PosixGPath.glob, raising=True)
    d = tmp_path / "brk[1]" / "checkpoints"
    c = Checkpointer(d, save_every=1)
    c.save(1, _state())
    with pytest.raises(CheckpointError, match=r"brk\[1\]/checkpoints/1 was written but cannot be"):
        c.wait()
    c.close()
    # synchronous saves raise from save() itself
    c = Checkpointer(tmp_path / "brk[2]", save_every=1, async_save=False)
    with pytest.raises(CheckpointError, match=r"brk\[2\]/1 was written but cannot be read back"):
        c.save(1, _state())
    c.close()


def test_async_save_error_surfaces_at_next_save_wait_and_close(tmp_path, monkeypatch):
    from orbax.checkpoint._src.serialization import ocdbt_utils

    async def disk_full(*args, **kwargs):
        raise OSError("No space left on device (injected)")

    c = Checkpointer(tmp_path, save_every=1, keep_last=1)
    c.save(1, _state())
    c.wait()
    monkeypatch.setattr(ocdbt_utils, "merge_ocdbt_per_process_files", disk_full)
    assert c.save(2, _state(2.0))  # started in the background
    with pytest.raises(CheckpointError, match=r"checkpoint .*/2: the save failed \(OSError: No sp"):
        c.save(3, _state(3.0))  # raised at the next save, not lost
    c.save(3, _state(3.0))
    with pytest.raises(CheckpointError, match=r"/3: the save failed"):
        c.wait()
    c.save(4, _state(4.0))
    with pytest.raises(CheckpointError, match=r"/4: the save failed"):
        c.close()
    # the failed saves never became checkpoints, and step 1 was not deleted for them
    assert Checkpointer(tmp_path, save_every=1).all_steps() == [1]


def _corrupt(d, how):
    """The three reproductions of a damaged newest checkpoint, plus an emptied item."""
    if how == "state removed":
        shutil.rmtree(f"{d}/20/state")
    elif how == "arrays truncated":
        files = glob.glob(f"{d}/20/state/**/d/*", recursive=True)
        assert files
        for f in files:
            with open(f, "r+b") as fh:
                fh.truncate(os.path.getsize(f) // 2)
    elif how == "metadata emptied":
        open(f"{d}/20/state/_METADATA", "w").close()
    elif how == "fingerprint emptied":
        open(f"{d}/20/meta/metadata", "w").close()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how,reason",
    [
        ("state removed", r"KeyError: .*state.* was not found"),
        ("arrays truncated", r"ValueError: OUT_OF_RANGE"),
        ("metadata emptied", r"JSONDecodeError: Expecting value"),
        ("fingerprint emptied", r"JSONDecodeError: Expecting value"),
    ],
)
def test_corrupt_latest_falls_back_to_previous(tmp_path, caplog, how, reason):
    d = str(tmp_path / "checkpoints")
    with Checkpointer(d, save_every=10) as c:
        c.save(10, _state(10.0))
        c.save(20, _state(20.0))
    _corrupt(d, how)
    c = Checkpointer(d, save_every=10)
    with caplog.at_level(logging.WARNING, logger="scorelib.training"):
        got = c.restore_latest(_abstract())
    assert _equal(got, _state(10.0))
    msgs = [r.getMessage() for r in caplog.records if r.name == "scorelib.training"]
    assert len(msgs) == 1, msgs
    assert f"checkpoint {d}/20 cannot be read" in msgs[0] and "trying step 10" in msgs[0]
    assert __import__("re").search(reason, msgs[0]), msgs[0]
    # the run goes on: step 20 is saved again, the damaged one kept aside for inspection
    assert c.should_save(20)
    assert c.save(20, _state(21.0))
    c.close()
    assert sorted(os.listdir(f"{d}/unreadable")) == ["20"]
    with Checkpointer(d, save_every=10) as c:
        assert c.all_steps() == [10, 20]
        assert _equal(c.restore_latest(_abstract()), _state(21.0))


def test_issue_reproduction_state_removed_same_checkpointer(tmp_path, caplog):
    d = str(tmp_path)
    s = _state()
    c = Checkpointer(d, save_every=1)
    c.save(1, s)
    c.save(2, s)
    c.wait()
    shutil.rmtree(d + "/2/state")
    with caplog.at_level(logging.WARNING, logger="scorelib.training"):
        got = c.restore_latest(s)
    assert _equal(got, s)
    assert any(f"{d}/2 cannot be read" in r.getMessage() for r in caplog.records)
    # the restored state is step 1's: the next save is step 2 again
    assert c.should_save(2)
    c.close()


def test_no_readable_checkpoint_lists_what_was_tried(tmp_path):
    d = str(tmp_path)
    with Checkpointer(d, save_every=10) as c:
        c.save(10, _state())
        c.save(20, _state())
    shutil.rmtree(f"{d}/20/state")
    open(f"{d}/10/meta/metadata", "w").close()
    with pytest.raises(CheckpointError) as e:
        Checkpointer(d, save_every=10).restore_latest(_abstract())
    msg = str(e.value)
    assert msg.startswith(f"no readable checkpoint in {d}; tried:")
    assert "step 20 (KeyError" in msg and "step 10 (JSONDe" in msg
    assert msg.endswith("move the directory aside to train the run again from step 0")


def test_mismatch_is_raised_not_skipped(tmp_path):
    with Checkpointer(tmp_path, save_every=1, config={"model": {"width": 32}}) as c:
        c.save(1, _state())
        c.save(2, _state())
    c = Checkpointer(tmp_path, save_every=1, config={"model": {"width": 16}})
    with pytest.raises(IncompatibleCheckpoint, match=r"config model\.width: checkpoint 32, curr"):
        c.restore_latest(_abstract())  # step 1 is never tried: it would train another model
    c.close()


def test_a_field_added_since_the_checkpoint_matches_while_it_holds_its_default(tmp_path):
    """A checkpoint written before ``model.norm`` existed restores into a config holding
    the field's declared default, and refuses any other value of it."""
    with Checkpointer(tmp_path, save_every=1, config={"model": {"width": 32}}) as c:
        c.save(1, _state(3.0))
    new = {"model": {"width": 32, "norm": "none"}}
    with Checkpointer(
        tmp_path, save_every=1, config=new, config_defaults={"model.norm": "none"}
    ) as c:
        assert _equal(c.restore_latest(_abstract()), _state(3.0))
    new["model"]["norm"] = "layer"
    with Checkpointer(
        tmp_path, save_every=1, config=new, config_defaults={"model.norm": "none"}
    ) as c:
        with pytest.raises(IncompatibleCheckpoint, match="config model.norm: checkpoint <absent>"):
            c.restore_latest(_abstract())
    with Checkpointer(tmp_path, save_every=1, config={"model": {"width": 32, "norm": "none"}}) as c:
        with pytest.raises(IncompatibleCheckpoint, match="config model.norm"):
            c.restore_latest(_abstract())  # no declared default: a difference


def test_keep_last_and_keep_every(tmp_path):
    with Checkpointer(tmp_path, save_every=1, keep_last=2, keep_every=5) as c:
        for step in range(1, 13):
            c.save(step, _state(float(step)))
    with Checkpointer(tmp_path, save_every=1) as c:
        assert c.all_steps() == [5, 10, 11, 12]
        assert _equal(c.restore(5, _abstract()), _state(5.0))
    assert sorted(os.listdir(tmp_path), key=int) == ["5", "10", "11", "12"]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"save_every": 0}, "checkpoint.save_every"),
        ({"save_every": 1, "keep_last": 0}, "checkpoint.keep_last"),
        ({"save_every": 1, "keep_every": 0}, "checkpoint.keep_every"),
        ({"save_every": 1, "keep_every": 2.5}, "checkpoint.keep_every"),
    ],
)
def test_bad_fields(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.") + " must be"):
        Checkpointer(tmp_path, **kwargs)


_KILLED_MID_SAVE = textwrap.dedent(
    """
    import sys, time
    import jax.numpy as jnp
    from orbax.checkpoint._src.serialization import ocdbt_utils
    from scorelib.training import Checkpointer

    c = Checkpointer(sys.argv[1], save_every=1)
    c.save(1, {"a": jnp.arange(4.0)})
    c.wait()

    async def stuck(*args, **kwargs):  # the arrays are written, the step is not committed
        print("saving", flush=True)
        time.sleep(3600)

    ocdbt_utils.merge_ocdbt_per_process_files = stuck
    c.save(2, {"a": jnp.arange(4.0) + 1})
    time.sleep(3600)
    """
)


def test_sigkill_mid_save_leaves_previous_checkpoint_readable(tmp_path):
    d = tmp_path / "run[1] a=b"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_SAVE, str(d)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        line = proc.stdout.readline()
        assert line == b"saving\n", line + proc.stdout.read()
        assert (d / "2.orbax-checkpoint-tmp").is_dir()  # the save is under way
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    a = {"a": jax.ShapeDtypeStruct((4,), jnp.float32)}
    with Checkpointer(d, save_every=1) as c:
        assert c.all_steps() == [1]
        assert np.array_equal(c.restore_latest(a)["a"], np.arange(4.0))
        # the leftover temporary directory does not stop step 2 from being saved
        c.save(2, {"a": jnp.arange(4.0) + 2})
    with Checkpointer(d, save_every=1) as c:
        assert c.all_steps() == [1, 2]
        assert np.array_equal(c.restore_latest(a)["a"], np.arange(4.0) + 2)


def _toy_run(run_dir, steps, width=32):
    args = toy_train.parser().parse_args(
        [str(run_dir), "--num-steps", str(steps), "--save-every", "2", "--width", str(width)]
    )
    state, step, ckpt = toy_train.build(args)
    try:
        return train(state, step, num_steps=steps, ckpt=ckpt, log_dir=None, progress=False)
    finally:
        ckpt.close()


def test_restore_params_of_another_run(tmp_path):
    src = tmp_path / "src[1]"
    final = jax.device_get(_toy_run(src, 4))
    fresh, _, ck = toy_train.build(
        toy_train.parser().parse_args([str(tmp_path / "new"), "--num-steps", "0"])
    )
    ck.close()
    fingerprint = {"model": {"kind": "mlp", "width": 32, "depth": 2}}
    got = restore_params(src / "ckpt", fresh, expected_fingerprint=fingerprint)
    assert got.step == 4
    assert _equal(got.params, final.params) and _equal(got.ema_params, final.ema_params)
    assert jax.tree.structure(got.params) == jax.tree.structure(fresh.params)
    assert not _equal(got.params, fresh.params)  # not the new run's initialisation
    # an explicit step, given the params alone (another optimizer may follow)
    at2 = restore_params(src / "ckpt", abstract_state(fresh).params, step=2)
    ref2 = Checkpointer(src / "ckpt", save_every=2, config=fingerprint)
    ref2 = ref2.restore(2, abstract_state(fresh))
    assert (
        at2.step == 2
        and _equal(at2.params, ref2.params)
        and _equal(at2.ema_params, ref2.ema_params)
    )
    with pytest.raises(FileNotFoundError, match=r"step=3: no checkpoint in .*; have \[2, 4\]"):
        restore_params(src / "ckpt", fresh, step=3)
    with pytest.raises(FileNotFoundError, match="no checkpoint to restore parameters from"):
        restore_params(tmp_path / "nothing", fresh)


def test_restore_params_checks_the_model_config(tmp_path):
    src = tmp_path / "src"
    _toy_run(src, 2)
    narrow, _, ck = toy_train.build(
        toy_train.parser().parse_args([str(tmp_path / "n"), "--num-steps", "0", "--width", "16"])
    )
    ck.close()
    with pytest.raises(
        IncompatibleCheckpoint, match=r"config model\.width: checkpoint 32, current 16"
    ) as e:
        restore_params(
            src / "ckpt",
            narrow,
            expected_fingerprint={"model": {"kind": "mlp", "width": 16, "depth": 2}},
        )
    # the leaf shapes are named too, for params and EMA params alike
    leaf = ".params['hidden'][0]['kernel'].value"
    shapes = "checkpoint shape (32, 32) float32, current shape (16, 16) float32"
    assert f"state leaf {leaf}: {shapes}" in str(e.value)
    assert ".ema_params['hidden'][0]['kernel'].value" in str(e.value)


def test_restore_params_from_the_checkpointer_that_saved(tmp_path):
    opt = make_optimizer(1e-3)
    st = create_state({"w": jnp.arange(3.0)}, opt, seed=0)
    c = Checkpointer(tmp_path / "run[1]", save_every=1)
    c.save(1, st)
    got = c.restore_params(st.params)
    assert got.step == 1 and _equal(got.params, st.params) and _equal(got.ema_params, st.params)
    assert _equal(c.restore_latest(abstract_state(st)), st)
    c.save(2, st)  # nothing was taken for unreadable
    c.close()
    assert sorted(os.listdir(tmp_path / "run[1]")) == ["1", "2"]


def test_closed_loop_tracebacks_are_dropped_and_everything_else_kept():
    """orbax's reads of a damaged checkpoint print one ``Event loop is closed`` traceback per
    array in flight, piecewise from several threads at once: the filter drops those (and
    only those), whatever the interleaving, and keeps other tracebacks and lines whole."""
    import io
    import threading

    from scorelib.training import ClosedLoopTracebackFilter

    noise = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/asyncio/base_events.py", line 806, in call_soon_threadsafe\n'
        "    self._check_closed()\n"
        '  File "/usr/lib/python3.11/asyncio/base_events.py", line 519, in _check_closed\n'
        "    raise RuntimeError('Event loop is closed')\n"
        "RuntimeError: Event loop is closed\n"
    )
    other = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: real\n'
    out = io.StringIO()
    f = ClosedLoopTracebackFilter(out)
    barrier = threading.Barrier(8)

    def writer():
        barrier.wait()
        pieces = noise.split(" ")
        for _ in range(20):
            for i, piece in enumerate(pieces):  # many small writes, interleaved across threads
                f.write(piece + (" " if i < len(pieces) - 1 else ""))

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    f.write("a line\n")
    f.write(other)
    for t in threads:
        t.join()
    f.write("progress 50%\r")
    f.write("last words without a newline")
    f.close_filter()
    text = out.getvalue()
    assert "Event loop is closed" not in text and "_check_closed" not in text, text[:500]
    assert "a line\n" in text and other in text
    assert "progress 50%\r" in text and text.endswith("last words without a newline")
