"""experiments.distill end to end at smoke scale: target, Gaussian, training-set and
trained-run teachers, the bit-identical resume, sample/evaluate of a distillation run, and
bad input refused before compute naming the field."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from entry_helpers import copy_run, run_inprocess
from hydra import compose, initialize_config_dir

from experiments.common import CONFIG_DIR
from experiments.runs import saved_steps

#: The smallest teacher, student and discriminator networks (SMOKE's and FITTED's).
TINY_NETWORKS = [
    "model.width=16",
    "model.depth=1",
    "model.emb_dim=8",
    "distill.backbone_width=16",
    "distill.backbone_depth=1",
    "distill.disc_width=8",
]
SMOKE = [
    "experiment=fdistill_gmm",
    *TINY_NETWORKS,
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
def test_distill_gmm_resume_then_sample_and_evaluate(tmp_path):
    """experiments.distill end to end through its ``main()`` (test_distill_cluster.py runs it
    as a real ``python -m`` process): 20 steps, checkpoints at 10 and 20, one-step samples
    and the ratio diagnostics logged; the same command again trains nothing. The resumed
    run is bit identical to the uninterrupted one: the run as it was at step 10 (its step-10
    checkpoint), continued by the same command to 20, ends with the uninterrupted run's
    whole DistillState (params, EMA, three optimizers, ratio means) through the checkpoint.
    Then experiments.sample and experiments.evaluate on the distillation run."""
    from experiments.runs import load_run

    out = tmp_path / "run"
    command = [*SMOKE, "trainer.steps=20"]
    r = run_inprocess("distill", *command, f"hydra.run.dir={out}")
    assert r.code == 0, r.stderr
    assert (out / "samples/step20/onestep_1_n200_seed0/samples.npz").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = set(rows[-1])
    assert {"r_mean", "r_min", "r_max", "h_max", "ratio_bin0", "ratio_bin9"} <= logged
    assert {"loss_student", "loss_fake", "loss_disc"} <= logged
    assert "run directory" in r.stdout
    assert "discriminator: 1 head on its MLP backbone's features 16\n" in r.stdout
    # the same command again: complete, nothing retrained
    again = run_inprocess("distill", *command, f"hydra.run.dir={out}")
    assert again.code == 0, again.stderr
    assert "resuming" not in again.stdout

    # interrupted after step 10: the same command resumes from its checkpoint
    half = copy_run(out, tmp_path / "half")
    assert saved_steps(half) == [10, 20]
    shutil.rmtree(half / "checkpoints" / "20")
    resumed_cmd = run_inprocess("distill", *command, f"hydra.run.dir={half}")
    assert resumed_cmd.code == 0, resumed_cmd.stderr
    assert f"resuming {half} from step 10 of 20" in resumed_cmd.stdout
    run_, whole = load_run(out, step=20)
    _, resumed = load_run(half, step=20)
    whole, resumed = jax.device_get(whole), jax.device_get(resumed)
    assert int(resumed.step) == int(whole.step) == 20
    assert _same(resumed, whole)
    assert not _same(whole.params["student"], jax.device_get(run_.state.params["student"]))

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
    its weights, the discriminator heads read its hidden layers. One step, the student's:
    its forward pass is the critics' step's too (teacher, fake score, discriminator heads);
    both steps run in test_distill_gmm_resume_then_sample_and_evaluate."""
    out = tmp_path / "from_run"
    args = [
        f"teacher.run_dir={toy_run}",
        "distill.backbone_width=null",
        "distill.backbone_depth=null",
        "distill.disc_width=8",
        "trainer.steps=1",
        "trainer.batch_size=16",
        "trainer.log_every=1",
        "trainer.ckpt_every=1",
        "sampler.num_samples=100",
        "sampler.batch_size=100",
        f"hydra.run.dir={out}",
    ]
    r = run_inprocess("distill", *args)
    assert r.code == 0, r.stderr
    assert "discriminator: 3 heads on the teacher network's features 256, 256, 256" in r.stdout
    with np.load(out / "samples/step1/onestep_1_n100_seed0/samples.npz") as z:
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
        ("+distill.foo=1", "error: distill.foo is not a field of distill"),
        ("teacher.run_dir=/nonexistent", "error: teacher.run_dir=/nonexistent: no config.yaml"),
        ("sampler.num_samples=0", "error: sampler.num_samples must be"),
    ],
)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
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


#: A fitted teacher (teacher.kind=gaussian or training_set) on the digits at smoke scale.
FITTED = [
    "data=digits",
    "process=edm",
    "model=mlp",
    *TINY_NETWORKS,
    "trainer.steps=1",
    "trainer.batch_size=8",
    "trainer.log_every=1",
    "trainer.ckpt_every=1",
    "sampler.num_samples=20",
    "sampler.batch_size=20",
]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian", "training_set"])
def test_distill_a_fitted_teacher_of_the_digits(kind, tmp_path):
    """teacher.kind=gaussian (the Gaussian fit of the training digits) and training_set
    (their exact noised score): one step (the student's, whose forward pass through the
    teacher is the critics' step's too), finite one-step samples of the digits' shape."""
    out = tmp_path / kind
    r = run_inprocess("distill", f"teacher.kind={kind}", *FITTED, f"hydra.run.dir={out}")
    assert r.code == 0, r.stderr
    with np.load(out / "samples/step1/onestep_1_n20_seed0/samples.npz") as z:
        assert z["samples"].shape == (20, 8, 8, 1) and np.isfinite(z["samples"]).all()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["teacher.kind=gaussian", "teacher.run_dir=/x", *FITTED],
            "error: teacher.run_dir is not used by teacher.kind=gaussian",
        ),
        (
            ["teacher.kind=training_set", "teacher.step=3", *FITTED],
            "error: teacher.step is not used by teacher.kind=training_set",
        ),
        (["teacher.kind=target", *FITTED], "error: data must be target with teacher.kind=target"),
        (["teacher.kind=gaussian"], "error: data is required with teacher.kind=gaussian"),
        (
            ["experiment=fdistill_gmm", "teacher.kind=gaussian", *SMOKE[1:]],
            "error: data must be a data set with a training split",
        ),
        (
            ["teacher.kind=gaussian", "teacher.data_shape=[2]", *FITTED],
            "error: data: examples of shape [8, 8, 1]; teacher.data_shape=[2] expects",
        ),
        (["teacher.kind=exact", *FITTED], "error: teacher.kind must be one of"),
        (["teacher.kind=run"], "error: teacher.run_dir must be an experiments.train run"),
    ],
)
def test_teacher_kinds_refuse_what_they_do_not_use(args, message, tmp_path):
    r = run_inprocess("distill", *args, f"hydra.run.dir={tmp_path / 'r'}")
    assert r.code == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_teacher_run_of_another_data_shape_is_refused_before_compute(toy_run, tmp_path):
    """experiment=fdistill_digits expects 8x8x1 digits: a 2-D toy run is refused at
    start-up in one line naming teacher.data_shape, nothing written; an experiments.distill
    run is not a teacher."""
    out = tmp_path / "r"
    r = run_inprocess(
        "distill",
        "experiment=fdistill_digits",
        f"teacher.run_dir={toy_run}",
        f"hydra.run.dir={out}",
    )
    assert r.code == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"error: teacher.run_dir={toy_run}: a run of data=toy" in r.stderr, r.stderr
    assert "teacher.data_shape=[8, 8, 1] expects examples of shape [8, 8, 1]" in r.stderr
    assert not out.exists()


@pytest.mark.slow
def test_a_network_teacher_starts_student_and_fake_at_its_ema_weights(toy_run):
    from experiments.runs import DistillRun, load_run

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "distill",
            overrides=[
                f"teacher.run_dir={toy_run}",
                "distill.backbone_width=null",
                "distill.backbone_depth=null",
                "distill.disc_width=8",
            ],
        )
    run_ = DistillRun.build(cfg)
    _, tstate = load_run(toy_run)
    ema, raw = jax.device_get(tstate.ema_params), jax.device_get(tstate.params)
    assert not _same(ema, raw)  # the EMA differs from the raw weights: the test can fail
    for part in ("student", "fake"):
        assert _same(jax.device_get(run_.state.params[part]), ema), part
    assert _same(jax.device_get(run_.state.ema_params), ema)


@pytest.mark.slow
def test_a_non_finite_loss_stops_the_distillation_with_its_step(tmp_path):
    """optim.lr=1e30: step 0 is finite, its update overflows the student, so step 1's loss
    is not; the command exits 2 with one line naming the step."""
    out = tmp_path / "nan"
    r = run_inprocess("distill", *SMOKE, "optim.lr=1e30", "trainer.steps=4", f"hydra.run.dir={out}")
    assert r.code == 2, (r.stdout, r.stderr)
    assert "error: non-finite loss at step 1" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "target, ok",
    [
        ("scorelib.nets.MLP", True),
        ("scorelib.nets.LocalMLP", True),
        ("scorelib.nets.UNet", True),
        ("scorelib.nets.embeddings.FourierEmbedding", False),  # a module without features
        ("nope.Net", False),
    ],
)
def test_a_teacher_run_needs_a_network_with_features(target, ok):
    """The discriminator heads read the teacher network's ``features``: a run whose model
    class has none is refused before anything is built, naming the class."""
    from omegaconf import OmegaConf

    from experiments.runs.distill import check_teacher_run

    cfg = OmegaConf.create({"data": {"name": "digits"}, "model": {"_target_": target}})
    if ok:
        check_teacher_run(cfg, (8, 8, 1), [8, 8, 1], "teacher.run_dir=r")
    else:
        with pytest.raises(ValueError, match=f"teacher.run_dir=r: its model \\({target}\\)"):
            check_teacher_run(cfg, (8, 8, 1), [8, 8, 1], "teacher.run_dir=r")
