"""Checkpoints written by an earlier revision restore with the current code: a score-training
``TrainState`` and a distillation ``DistillState`` saved by revision e9d9739 (before the
distillation state became a ``TrainState`` subclass) pass ``check_compatible`` and restore
leaf for leaf, so existing runs resume. The fixtures and how they were written:
``tests/training/fixtures/make_old_checkpoints.py``."""

import importlib.util
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from scorelib import training

FIXTURES = Path(__file__).parent / "fixtures"


def _fixture_module():
    spec = importlib.util.spec_from_file_location(
        "make_old_checkpoints", FIXTURES / "make_old_checkpoints.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["score", "distill"])
def test_a_checkpoint_of_the_earlier_layout_restores_leaf_for_leaf(name, tmp_path):
    gen = _fixture_module()
    fresh, _ = getattr(gen, f"{name}_state")()  # the current code's state of that run
    shutil.copytree(FIXTURES / name, tmp_path / name)
    abstract = training.abstract_state(fresh)
    with training.Checkpointer(tmp_path / name, save_every=1, config={"fixture": name}) as ckpt:
        assert ckpt.all_steps() == [gen.STEPS]
        ckpt.check_compatible(gen.STEPS, abstract)
        restored = ckpt.restore(gen.STEPS, abstract)
    assert type(restored) is type(fresh)
    assert jax.tree.structure(restored) == jax.tree.structure(fresh)
    saved = np.load(FIXTURES / f"{name}_leaves.npz")
    got = gen.leaves(restored)
    assert sorted(got) == sorted(saved.files)
    for path, value in got.items():
        assert value.dtype == saved[path].dtype, path
        np.testing.assert_array_equal(value, saved[path], err_msg=path)
    assert int(restored.step) == gen.STEPS
