"""Config schemas of ``experiments.train_classifier`` (``configs/train_classifier.yaml``).

Read from the library as ``experiments.schema`` reads the others: the objectives' fields
are the arguments of ``scorelib.objectives.classifier.NoisyCrossEntropy`` / ``DLSM`` (the
process and DLSM's frozen score are built, not configured), the network's those of
``scorelib.nets.ClassifierMLP`` (its ``num_classes`` comes from the data's labels). The
objective options ``objective=ce | dlsm`` live in the ``objective`` group beside the score
objectives; ``experiments.train`` refuses them (``experiments.build``) and
``experiments.train_classifier`` refuses the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from experiments.schema import (
    BUILT_ARGUMENTS,
    CLUSTER_FIELDS,
    SCHEMA_GROUP,
    TRAINER_NOT_IDENTITY,
    ClusterConfig,
    OptimConfig,
    TrainerConfig,
    make_schema,
    signature_fields,
)
from scorelib.nets.classifier import ClassifierMLP
from scorelib.objectives.classifier import CLASSIFIER_OBJECTIVES, DLSM, NoisyCrossEntropy

#: ``_target_`` of each classifier objective option -> its option name (``objective=<name>``).
CLASSIFIER_OBJECTIVE_TARGETS = {
    f"{cls.__module__}.{cls.__name__}": name for name, cls in CLASSIFIER_OBJECTIVES.items()
}


def _objective_schema(name: str, cls) -> type:
    target = f"{cls.__module__}.{cls.__name__}"
    fields = [("_target_", str, target), *signature_fields(cls, BUILT_ARGUMENTS + ("score",))]
    return make_schema(name, fields, f"``{target}``: its arguments and their defaults.")


NoisyCEConfig = _objective_schema("NoisyCEConfig", NoisyCrossEntropy)
DLSMConfig = _objective_schema("DLSMConfig", DLSM)

#: ``classifier``: the arguments of ``scorelib.nets.ClassifierMLP`` but the data shape and the
#: number of classes (the data's).
ClassifierNetConfig = make_schema(
    "ClassifierNetConfig",
    signature_fields(ClassifierMLP, BUILT_ARGUMENTS + ("num_classes",)),
    "``classifier``: the arguments of ``scorelib.nets.ClassifierMLP`` and their defaults.",
)


@dataclass
class TrainClassifierConfig:
    """The primary config of ``experiments.train_classifier``."""

    name: str = MISSING
    process: Any = MISSING
    objective: Any = MISSING  # objective=ce | dlsm
    data: Any = MISSING  # labelled images: digits | mnist | npz with `labels`
    classifier: ClassifierNetConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    cluster: ClusterConfig = MISSING
    # objective=dlsm: the experiments.train run whose EMA score is DLSM's frozen score (at its
    # null label when class-conditional), and its checkpoint step (null: the newest)
    score_run: str | None = None
    score_step: int | None = None


def classifier_group_schemas() -> dict[tuple[str, str], type]:
    """``(group, option) -> schema`` of the options this app adds to shared groups."""
    return {("objective", "ce"): NoisyCEConfig, ("objective", "dlsm"): DLSMConfig}


def not_identity_keys() -> list[str]:
    """The overrides that do not name a classifier run (Hydra's ``exclude_keys``): the preset
    and its name, where it runs, and the trainer fields that do not change the classifier."""
    keys = ["experiment", "name", "hydra/launcher", "cluster"]
    keys += [f"cluster.{f}" for f in CLUSTER_FIELDS]
    keys += [f"trainer.{f}" for f in TRAINER_NOT_IDENTITY]
    return keys


def register_classifier_configs() -> None:
    """Register the primary schema and the run-name rule of ``experiments.train_classifier``
    (the objective options are registered with the other groups' by
    ``experiments.schema.register_configs``, through :func:`classifier_group_schemas`)."""
    cs = ConfigStore.instance()
    for (group, option), node in classifier_group_schemas().items():
        cs.store(group=f"{SCHEMA_GROUP}/{group}", name=option, node=node)
    dirname = {"exclude_keys": not_identity_keys()}
    node = {"hydra": {"job": {"config": {"override_dirname": dirname}}}}
    cs.store(
        group=f"{SCHEMA_GROUP}/run_name", name="train_classifier", node=node, package="_global_"
    )
    cs.store(name="train_classifier_schema", node=TrainClassifierConfig)
