"""``compose_train(overrides)``: the ``experiments.train`` config that Hydra composes from
``configs/`` with these overrides (schemas registered), for tests of the config path that
build library objects without running the entry point."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from experiments import schema


def compose_train(overrides):
    schema.register_configs()
    root = Path(__file__).resolve().parents[1]
    with initialize_config_dir(config_dir=str(root / "configs"), version_base="1.3"):
        return compose("train", overrides=overrides)
