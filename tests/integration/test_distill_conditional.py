"""experiments.distill from a class-conditional teacher, end to end at smoke scale: the exact
teacher of a labelled mixture target (``data.labels=true``, a component is a class) gives a
conditional student whose one-step samples are saved with their classes (balanced by
default, a class on request), and bad combinations are refused in one line before anything
is written."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from entry_helpers import run_inprocess
from test_distill import SMOKE

from experiments.runs.distill import check_teacher_guidance
from scorelib.distill import DistillConfig

#: The 8-mode mixture preset with its components as classes.
CONDITIONAL = [*SMOKE, "data.labels=true", "model.num_classes=8"]


@pytest.mark.slow
def test_a_conditional_teacher_gives_a_conditional_student(tmp_path):
    """4 steps (student and critics) of the exact class-conditional teacher of the mixture
    with classifier-free guidance 1.5 (its null label is the mixture), then its samples:
    by default 25 of each of the 8 classes in turn, their labels in samples.npz; with
    ``sampler.labels=3`` every sample is of class 3, in a directory of its own."""
    out = tmp_path / "run"
    command = [*CONDITIONAL, "distill.teacher_guidance=1.5", "trainer.steps=4"]
    r = run_inprocess("distill", *command, f"hydra.run.dir={out}")
    assert r.code == 0, r.stderr
    with np.load(out / "samples/step4/onestep_1_n200_seed0/samples.npz") as z:
        assert z["samples"].shape == (200, 2) and np.isfinite(z["samples"]).all()
        np.testing.assert_array_equal(z["labels"], np.arange(200) % 8)
    s = run_inprocess("sample", f"run_dir={out}", "sampler.labels=3", "sampler.num_samples=20")
    assert s.code == 0, s.stderr
    with np.load(out / "samples/step4/onestep_1_n20_seed0+labels-3/samples.npz") as z:
        np.testing.assert_array_equal(z["labels"], np.full(20, 3))
        # the same noise as the balanced draw's first 20 samples, another class for most
        first = np.load(out / "samples/step4/onestep_1_n200_seed0/samples.npz")["samples"][:20]
        assert np.array_equal(z["samples"][3], first[3])
        assert not np.allclose(z["samples"][:3], first[:3])
    bad = run_inprocess("sample", f"run_dir={out}", "sampler.labels=8")
    assert bad.code == 2 and "error: sampler.labels must be" in bad.stderr, bad.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            [*SMOKE, "sampler.labels=3"],
            "error: sampler.labels: the model is unconditional",
        ),
        (
            [*SMOKE, "distill.teacher_guidance=2"],
            "error: distill.teacher_guidance must be 1 for an unconditional teacher",
        ),
        (
            [*SMOKE, "data.labels=true"],
            "error: model.num_classes must be 8 (the classes of data=target) with data.labels=true",
        ),
        (
            [*CONDITIONAL, "teacher.num_classes=10"],
            "error: data=target: the teacher is 8 classes; teacher.num_classes=10 expects",
        ),
        (
            [*SMOKE, "teacher.num_classes=10"],
            "error: data=target: the teacher is unconditional (no classes)",
        ),
        ([*CONDITIONAL, "sampler.labels=[1,9]"], "error: sampler.labels must be null"),
        (
            [*CONDITIONAL, "distill.teacher_guidance=nan"],
            "error: distill.teacher_guidance must be a number",
        ),
    ],
)
def test_bad_conditioning_is_refused_before_anything_is_written(args, message, tmp_path):
    r = run_inprocess("distill", *args, f"hydra.run.dir={tmp_path / 'r'}")
    assert r.code == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "r").exists()


def test_teacher_guidance_needs_the_teacher_runs_trained_null_label():
    """A class-conditional teacher run trained without label dropout has an untrained null
    label: guiding it is refused (naming the field and the fix); w = 1 is always fine."""
    cfg = DistillConfig(teacher_guidance=2.0)
    untrained = SimpleNamespace(num_classes=10, null_trained=False)
    with pytest.raises(ValueError, match=r"^distill.teacher_guidance must be 1: the teacher run's"):
        check_teacher_guidance(cfg, untrained)
    check_teacher_guidance(cfg, SimpleNamespace(num_classes=10, null_trained=True))
    check_teacher_guidance(DistillConfig(), untrained)


def test_the_conditional_presets_differ_from_their_bases_in_conditioning_only():
    """fdistill_digits_cond is fdistill_digits with the conditional teacher
    (outputs/digits_edm_cond), which it requires to have 10 classes, and balanced samples;
    fdistill_cifar10 asks for a 10-class teacher, balanced samples and no guidance."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from experiments.common import CONFIG_DIR
    from experiments.schema import register_configs

    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cond, base, cifar = (
            OmegaConf.to_container(compose("distill", overrides=[f"experiment={e}"]))
            for e in ("fdistill_digits_cond", "fdistill_digits", "fdistill_cifar10")
        )
    assert cond["name"] == "fdistill_digits_cond"
    assert cond["teacher"] == {
        **base["teacher"],
        "run_dir": "outputs/digits_edm_cond",
        "num_classes": 10,
    }
    assert cond["sampler"] == {**base["sampler"], "labels": "balanced"}
    for key in ("distill", "optim", "trainer"):
        assert cond[key] == base[key], key
    assert base["teacher"]["num_classes"] is None and base["sampler"]["labels"] is None
    assert cifar["teacher"]["num_classes"] == 10 and cifar["sampler"]["labels"] == "balanced"
    assert cifar["distill"]["teacher_guidance"] == 1.0


def test_a_distillation_written_before_conditioning_is_the_same_run(tmp_path):
    """A run directory whose config.yaml predates distill.teacher_guidance and
    teacher.num_classes is the same run while they hold the old behaviour (1, null);
    another guidance is another run."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from experiments.common import CONFIG_DIR
    from experiments.runs.identity import check_same_run
    from experiments.schema import register_configs

    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("distill", overrides=["experiment=fdistill_digits"])
        guided = compose("distill", overrides=["experiment=fdistill_digits_cond"])
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["distill"]["teacher_guidance"], old["teacher"]["num_classes"], old["sampler"]["labels"]
    OmegaConf.save(OmegaConf.create(old), tmp_path / "config.yaml")
    check_same_run(tmp_path, cfg)
    with pytest.raises(ValueError, match="teacher.num_classes: run '<absent>', this command 10"):
        check_same_run(tmp_path, guided)


def test_a_distillation_written_before_the_ema_clock_and_clipping_is_the_same_run(tmp_path):
    """A run whose config.yaml predates distill.ema_clock and optim.grad_clip is the same
    run while they hold the old behaviour (steps, null); either changed is another run."""
    from hydra import compose, initialize_config_dir  # this test alone composes configs
    from omegaconf import OmegaConf

    from experiments.common import CONFIG_DIR
    from experiments.runs.identity import check_same_run
    from experiments.schema import register_configs

    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("distill", overrides=["experiment=fdistill_digits"])
        keyed = compose(
            "distill", overrides=["experiment=fdistill_digits", "distill.ema_clock=student_updates"]
        )
        clipped = compose("distill", overrides=["experiment=fdistill_digits", "optim.grad_clip=10"])
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["distill"]["ema_clock"], old["optim"]["grad_clip"]
    OmegaConf.save(OmegaConf.create(old), tmp_path / "config.yaml")
    check_same_run(tmp_path, cfg)
    with pytest.raises(ValueError, match="distill.ema_clock: run '<absent>', this command"):
        check_same_run(tmp_path, keyed)
    with pytest.raises(ValueError, match="optim.grad_clip: run '<absent>', this command 10"):
        check_same_run(tmp_path, clipped)
