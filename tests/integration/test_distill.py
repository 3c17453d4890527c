"""experiments.distill end to end at smoke scale: target and trained-run teachers, the
bit-identical resume, sample/evaluate of a distillation run, and bad input refused
before compute naming the field."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from entry_helpers import run, run_inprocess
from hydra import compose, initialize_config_dir

from experiments.common import CONFIG_DIR

SMOKE = [
    "experiment=fdistill_gmm",
    "model.width=16",
    "model.depth=1",
    "model.emb_dim=8",
    "distill.backbone_width=16",
    "distill.backbone_depth=1",
    "distill.disc_width=8",
    "trainer.batch_size=32",
    "trainer.log_every=5",
    "trainer.ckpt_every=10",
    "sampler.num_samples=200",
    "sampler.batch_size=200",
]


def _same(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))


@pytest.mark.slow
def test_resumed_distillation_is_bit_identical(tmp_path):
    """Uninterrupted 20 steps == 10 steps, then the same run continued to 20 (the whole
    DistillState through the checkpoint: params, EMA, three optimizers, ratio means)."""
    from experiments.distill import checkpointer, setup_distill
    from scorelib import training

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("distill", overrides=SMOKE + ["trainer.steps=20"])
    run_ = setup_distill(cfg)
    fresh = lambda: jax.tree.map(jnp.copy, run_.state)  # noqa: E731 (the step donates)
    kw = dict(log_every=5, progress=False, handle_signals=False, tensorboard=False)
    a = checkpointer(run_, tmp_path / "a")
    whole = jax.device_get(training.train(fresh(), run_.step_fn, num_steps=20, ckpt=a, **kw))
    a.close()
    b = checkpointer(run_, tmp_path / "b")
    half = training.train(fresh(), run_.step_fn, num_steps=10, ckpt=b, **kw)
    assert int(half.step) == 10
    b.close()
    b = checkpointer(run_, tmp_path / "b")
    resumed = jax.device_get(training.train(fresh(), run_.step_fn, num_steps=20, ckpt=b, **kw))
    b.close()
    assert int(resumed.step) == 20 and int(whole.step) == 20
    assert _same(resumed, whole)
    assert not _same(whole.params["student"], jax.device_get(run_.state.params["student"]))


@pytest.mark.slow
def test_distill_gmm_cli_then_sample_and_evaluate(tmp_path):
    out = tmp_path / "run"
    r = run("distill", *SMOKE, "trainer.steps=20", f"hydra.run.dir={out}", cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert (out / "samples/step20/onestep_1_n200_seed0/samples.npz").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = set(rows[-1])
    assert {"r_mean", "r_min", "r_max", "h_max", "ratio_bin0", "ratio_bin9"} <= logged
    assert {"loss_student", "loss_fake", "loss_disc"} <= logged
    assert "run directory" in r.stdout
    # the same command again: complete, nothing retrained
    again = run_inprocess("distill", *SMOKE, "trainer.steps=20", f"hydra.run.dir={out}")
    assert again.code == 0, again.stderr
    assert "resuming" not in again.stdout
    s = run_inprocess("sample", f"run_dir={out}", "sampler.num_samples=50", "sampler.seed=3")
    assert s.code == 0, s.stderr
    with np.load(out / "samples/step20/onestep_1_n50_seed3/samples.npz") as z:
        assert z["samples"].shape == (50, 2) and np.isfinite(z["samples"]).all()
    e = run_inprocess("evaluate", f"run_dir={out}", "sampler.num_samples=50", "sampler.seed=3")
    assert e.code == 0, e.stderr
    assert "energy distance" in e.stdout
    bad = run_inprocess("sample", f"run_dir={out}", "sampler.steps=4")
    assert bad.code == 2 and "one step" in bad.stderr


@pytest.mark.slow
def test_distill_from_a_trained_run(toy_run, tmp_path):
    """The teacher is the toy run's network (VP process): student and fake start from
    its weights, the discriminator heads read its hidden layers."""
    out = tmp_path / "from_run"
    args = [
        f"teacher.run_dir={toy_run}",
        "distill.backbone_width=null",
        "distill.backbone_depth=null",
        "distill.disc_width=8",
        "trainer.steps=6",
        "trainer.batch_size=16",
        "trainer.log_every=3",
        "trainer.ckpt_every=3",
        "sampler.num_samples=100",
        "sampler.batch_size=100",
        f"hydra.run.dir={out}",
    ]
    r = run_inprocess("distill", *args)
    assert r.code == 0, r.stderr
    with np.load(out / "samples/step6/onestep_1_n100_seed0/samples.npz") as z:
        assert z["samples"].shape == (100, 2) and np.isfinite(z["samples"]).all()
    bad = run_inprocess("distill", *args[:-1], "model=mlp", f"hydra.run.dir={tmp_path / 'x'}")
    assert bad.code == 2 and "error: model: the teacher run's model is used" in bad.stderr
    bad = run_inprocess("distill", *args[:1], f"hydra.run.dir={tmp_path / 'y'}")
    assert bad.code == 2 and "distill.backbone_width" in bad.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        ("distill.divergence=tv", "error: distill.divergence must be one of"),
        ("distill.student_every=0", "error: distill.student_every must be an integer"),
        ("distill.gan_weight=-0.1", "error: distill.gan_weight must be a number in [0.0"),
        ("+distill.foo=1", "error: distill.foo must be one of"),
        ("teacher.run_dir=/nonexistent", "error: teacher.run_dir=/nonexistent: no config.yaml"),
        ("sampler.num_samples=0", "error: sampler.num_samples must be"),
    ],
)
def test_bad_input_is_refused_before_compute(override, message, tmp_path):
    args = [*SMOKE, override, f"hydra.run.dir={tmp_path / 'r'}"]
    if override.startswith("teacher.run_dir"):  # no preset: no data, process, model
        args = [
            override,
            "distill.backbone_width=null",
            "distill.backbone_depth=null",
            f"hydra.run.dir={tmp_path / 'r'}",
        ]
    r = run_inprocess("distill", *args)
    assert r.code == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert not (tmp_path / "r").exists()  # nothing written
