"""The config schemas are read from the library: a field no YAML option sets holds what the
library does without the argument, and grids and samplers declare their own options."""

from __future__ import annotations

import inspect

import pytest
from entry_helpers import ROOT
from hydra.utils import get_object
from omegaconf import OmegaConf

from experiments import schema
from experiments.runs.score import model_fingerprint_defaults
from scorelib.nets import UNet
from scorelib.processes import EDM
from scorelib.samplers import SAMPLERS
from scorelib.training import make_train_step


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    schema.register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize(
    "group,option",
    [
        ("process", "edm"),
        ("process", "ve"),
        ("process", "vp"),
        ("process", "subvp"),
        ("objective", "edm"),
        ("objective", "dsm"),
    ],
)
def test_a_schema_default_is_what_the_class_does_without_the_argument(group, option):
    node = OmegaConf.to_container(OmegaConf.structured(schema.group_schemas()[group, option]))
    cls = get_object(node.pop("_target_"))
    if group == "objective":  # the train step's field, not the objective's (experiments.build)
        assert node.pop("label_dropout") == 0.0
        assert inspect.signature(make_train_step).parameters["label_dropout"].default == 0.0
    built = cls() if group == "process" else cls(EDM())
    assert node  # every argument is a field
    for key, value in node.items():
        assert getattr(built, key) == value, key


def test_unet_arguments_no_yaml_sets_are_fields_holding_the_library_default():
    cfg = _compose("experiment=mnist_edm")
    params = inspect.signature(UNet.__init__).parameters
    defaults = model_fingerprint_defaults(cfg)
    for key in ("num_groups", "attn_heads", "scale_shift"):
        assert cfg.model[key] == params[key].default == defaults[f"model.{key}"], key
    assert _compose("experiment=mnist_edm", "model.num_groups=8").model.num_groups == 8
    # tuples of the signature are lists in the config, typed by their elements
    assert list(_compose("experiment=mnist_edm", "model.channel_mult=[1,2]").model.channel_mult)
    with pytest.raises(Exception, match="channel_mult"):
        _compose("experiment=mnist_edm", "model.channel_mult=[a]")
    assert _compose("objective=dsm", "objective.t_range=[0.01,1.0]").objective.t_range == [
        0.01,
        1.0,
    ]


def test_each_sampler_schema_runs_on_its_declared_grid_and_has_every_grid_option():
    for name, sampler in SAMPLERS.items():
        node = OmegaConf.structured(schema.sampler_schema(name))
        assert node.grid == sampler.default_grid, name
        for option in schema.GRID_FIELDS:
            assert node[option] is None, (name, option)
    assert set(schema.GRID_FIELDS) == {"sigma_min", "sigma_max", "rho", "t_min", "t_max"}


def test_a_distillation_checkpoint_without_sigma_refine_stands_for_no_refining_stage():
    """A checkpoint written before ``distill.sigma_refine`` existed resumes as a run whose
    option is the library's and the preset's default (no refining stage)."""
    import dataclasses
    import types

    from experiments.runs.distill import DistillRun
    from scorelib.distill import DistillConfig

    run = types.SimpleNamespace(cfg=OmegaConf.create({}))  # a teacher run: no model section
    defaults = DistillRun.fingerprint_defaults(run)
    library = {f.name: f.default for f in dataclasses.fields(DistillConfig)}
    yaml = OmegaConf.load(ROOT / "configs/distill/fdistill.yaml")
    distill_keys = {k: v for k, v in defaults.items() if k.startswith("distill.")}
    for key, value in distill_keys.items():
        name = key.removeprefix("distill.")
        assert library[name] == yaml[name] == value, key
    assert distill_keys == {
        "distill.sigma_refine": None,
        "distill.teacher_guidance": 1.0,
        "distill.ema_clock": "steps",
    }
    # fields added with conditioning: an unconditional model of unlabelled data
    assert defaults["model.num_classes"] == 0 and defaults["data.labels"] is False
