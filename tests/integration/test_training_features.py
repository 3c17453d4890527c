"""Training features through the command line: fine-tuning from another run, milestone
checkpoints, the EMA warm-up, Ctrl-C, log lines, and run directories of any name.

Tests marked ``needs training branch`` exercise library features of ``scorelib.training``
that land with that branch (bracketed directory names, SIGINT saves, ``keep_every``, the
EMA warm-up, log lines); the entry points already pass them through.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from entry_helpers import ROOT, TOY, TOY_STEPS, run, run_inprocess

pytestmark = pytest.mark.slow

SHORT = [
    "experiment=toy_dsm",
    "trainer.steps=300",
    "trainer.log_every=100",
    "trainer.ckpt_every=50",
    "trainer.keep_last=1",
    "trainer.keep_every=100",
    "sampler.steps=100",
    "sampler.num_samples=1000",
    "sampler.batch_size=1000",
]


def _state(run_dir, step=None):
    from experiments.runs import load_run

    return load_run(run_dir, step=step)[1]


def test_init_from_starts_from_the_other_runs_ema_weights(toy_run, tmp_path):
    import jax

    run_dir = tmp_path / "finetune"
    r = run_inprocess(
        "train",
        *TOY,
        "trainer.steps=1",
        "optim.lr=1e-12",
        f"init_from={toy_run}@{TOY_STEPS}",
        f"hydra.run.dir={run_dir}",
    )
    assert r.code == 0, r.stderr[-3000:]
    src, new = _state(toy_run), _state(run_dir)
    assert int(new.step) == 1
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(src.ema_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    for a, b in zip(jax.tree.leaves(new.ema_params), jax.tree.leaves(src.ema_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """SHORT through a real ``python -m experiments.train`` (Hydra's logging writes
    train.log there, not in-process)."""
    run_dir = tmp_path_factory.mktemp("short") / "run"
    r = run("train", *SHORT, f"hydra.run.dir={run_dir}", check=False)
    return run_dir, r


def test_keep_every_keeps_milestones_beside_the_last(short_run):
    from experiments.runs import saved_steps

    run_dir, r = short_run
    assert r.code == 0, r.stderr[-2000:]
    assert saved_steps(run_dir) == [100, 200, 300]
    r = run_inprocess("sample", f"run_dir={run_dir}", "step=100", "sampler.num_samples=10")
    assert r.code == 0, r.stderr[-3000:]
    assert (run_dir / "samples/step100/euler_maruyama_100_n10_seed0/samples.npz").is_file()


def test_ema_warmup_a_300_step_run_is_not_worse_than_its_raw_weights(short_run):
    from scorelib.data import toy_sample
    from scorelib.metrics import energy_distance

    run_dir, r = short_run
    assert r.code == 0, r.stderr[-2000:]
    r = run_inprocess("sample", f"run_dir={run_dir}", "use_ema=false")
    assert r.code == 0, r.stderr[-3000:]
    step = "samples/step300/euler_maruyama_100_n1000_seed0"
    ema = np.load(run_dir / step / "samples.npz")["samples"]
    raw = np.load(run_dir / f"{step}+use_ema-false" / "samples.npz")["samples"]
    target = toy_sample("8gaussians", 2000, seed=99)
    e_ema, e_raw = energy_distance(ema, target), energy_distance(raw, target)
    assert e_ema <= 1.1 * e_raw, (e_ema, e_raw)


def test_train_log_has_a_loss_line_every_log_every_steps(short_run):
    run_dir, r = short_run
    assert r.code == 0, r.stderr[-2000:]
    lines = [line for line in (run_dir / "train.log").read_text().splitlines() if "loss" in line]
    assert len(lines) >= 3, lines


def test_ctrl_c_saves_the_step_and_says_how_to_resume(tmp_path):
    from experiments.runs import saved_steps

    run_dir = tmp_path / "interrupted"
    # TOY with a checkpoint every 20 steps: interrupted soon after the first
    toy = [a for a in TOY if not a.startswith("trainer.ckpt_every=")] + ["trainer.ckpt_every=20"]
    args = [sys.executable, "-m", "experiments.train", *toy, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not saved_steps(run_dir):
        time.sleep(0.2)
    assert proc.poll() is None, "training finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    step = saved_steps(run_dir)[-1]
    assert last == f"saved step {step}; rerun the same command to resume", err[-2000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("name", ["brk[1]", "a=b,c d"])
def test_train_resume_and_sample_under_any_directory_name(name, tmp_path):
    from experiments.runs import saved_steps

    run_dir = tmp_path / name
    quick = [
        "experiment=toy_dsm",
        "trainer.ckpt_every=5",
        "sampler.steps=10",
        "sampler.num_samples=10",
        f"hydra.run.dir='{run_dir}'",
    ]
    for steps in (10, 15):  # then resumes from step 10
        r = run_inprocess("train", *quick, f"trainer.steps={steps}")
        assert r.code == 0, r.stderr[-3000:]
    assert f"resuming {run_dir} from step 10 of 15" in r.stdout
    assert saved_steps(run_dir)[-1] == 15
    r = run_inprocess("sample", f"run_dir='{run_dir}'", "sampler.seed=1")
    assert r.code == 0, r.stderr[-3000:]
    assert "samples:" in r.stdout
    assert (run_dir / "samples/step15/euler_maruyama_10_n10_seed1/samples.npz").is_file()


@pytest.fixture
def restore_matmul_precision():
    before = jax.config.jax_default_matmul_precision
    yield
    jax.config.update("jax_default_matmul_precision", before)


def _dot_precisions(run, state) -> set[str]:
    """The precision config of every dot in the run's train step as it compiles now."""
    hlo = run.step_fn.lower(state).as_text()
    return set(re.findall(r"dot_general.*?precision = \[(\w+), \w+\]", hlo))


def test_matmul_precision_reaches_the_train_step_and_a_loaded_run(
    tmp_path, restore_matmul_precision, capsys
):
    """trainer.matmul_precision (BENCHMARKS.md, "GPU": TF32 trains the CIFAR-10 U-Net 3.9x
    faster on an H200) is the precision of every dot of the compiled train step, and loading
    the run (experiments.sample / evaluate, a distillation's teacher) sets it again; the
    default is full float32. XLA:CPU computes float32 either way, so the check reads the
    lowered program. The run says its precision where it is not the default (on a CPU)."""
    from compose_train import compose_train

    from experiments.runs import ScoreRun, load_run, train_run

    over = ["experiment=toy_dsm", "trainer.steps=1", "trainer.batch_size=8", "model.width=8"]
    over += ["sampler.steps=2", "sampler.num_samples=8"]
    for precision, hlo_name in (("tensorfloat32", "HIGH"), ("highest", "HIGHEST")):
        cfg = compose_train([*over, f"trainer.matmul_precision={precision}"])
        run, state = train_run(
            ScoreRun, cfg, tmp_path / precision, progress=False, tensorboard=False
        )
        assert _dot_precisions(run, state) == {hlo_name}
        said = "float32 matmuls: tensorfloat32 (trainer.matmul_precision)"
        assert (said in capsys.readouterr().out) == (precision == "tensorfloat32")
        jax.config.update("jax_default_matmul_precision", "bfloat16")  # another run's
        load_run(tmp_path / precision)
        assert jax.config.jax_default_matmul_precision == precision
