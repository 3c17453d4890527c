"""What a run is: its identity (the config fields that define what it trains) and the lock
that keeps two commands from training it at once.

A run directory, ``outputs/<preset>/<overrides>``, is named by the overrides of its
identity (Hydra's ``exclude_keys``, ``experiments.schema.not_identity_keys``, leave the
rest out), so the same command finds the same directory; :func:`check_same_run` refuses a
directory that holds a run of another config before anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from experiments.schema import TRAINER_NOT_IDENTITY
from scorelib.training.checkpoint import flatten_config

_ABSENT = "<absent>"
#: Fields of the configs without a schema (``configs/distill.yaml``: ``teacher``, ``distill``)
#: added after runs were written, with the value an absent field stands for (a schema
#: field's comes from the schema, :func:`schema_default`): the behaviour before the field.
ADDED_FIELDS = {
    "distill.teacher_guidance": 1.0,  # no classifier-free guidance of the teacher
    "distill.ema_clock": "steps",  # the student EMA's warm-up counted in global steps
    "optim.grad_clip": None,  # no gradient clipping of the distillation's parts
    "teacher.num_classes": None,  # any teacher's classes
}
#: Top-level config fields that are not part of a run's identity.
NOT_IDENTITY = ("sampler", "name", "cluster", "set_default_sampler")


def identity(cfg: DictConfig | dict) -> dict:
    """``{field: value}`` of everything that defines the trained model: the resolved config
    without the sampler (and ``set_default_sampler``), the cluster, the preset's name and the
    trainer fields that do not change the model (``schema.TRAINER_NOT_IDENTITY``)."""
    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    tree = {k: v for k, v in tree.items() if k not in NOT_IDENTITY}
    tree["trainer"] = {
        k: v for k, v in tree.get("trainer", {}).items() if k not in TRAINER_NOT_IDENTITY
    }
    return flatten_config(tree)


def schema_default(cfg: DictConfig, key: str):
    """The structured-config default of the dotted field ``key`` of ``cfg`` (its schema
    dataclass's field default), or ``_ABSENT`` when there is none."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if not dataclasses.is_dataclass(kind):
        return _ABSENT
    field = next((f for f in dataclasses.fields(kind) if f.name == name), None)
    if field is None:
        return _ABSENT
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return OmegaConf.to_container(OmegaConf.create({"v": field.default_factory()}))["v"]
    return _ABSENT


def identity_diffs(old: dict, new: dict, cfg: DictConfig) -> list[str]:
    """The fields where two identities differ. A field absent from ``old`` (a run written
    before the field existed) counts as equal when ``new`` holds its schema default (or its
    :data:`ADDED_FIELDS` value): a new option's default keeps the behaviour the library had
    before it."""
    diffs = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, _ABSENT), new.get(k, _ABSENT)
        default = ADDED_FIELDS[k] if k in ADDED_FIELDS else schema_default(cfg, k)
        if a == b or (a == _ABSENT and b == default):
            continue
        diffs.append(f"{k}: run {a!r}, this command {b!r}")
    return diffs


def check_same_run(run_dir: Path, cfg: DictConfig) -> None:
    """Refuse to train into ``run_dir`` when its ``config.yaml`` defines another run
    (:func:`identity_diffs`: fields added to the schema since the run was written do not
    count while they hold their defaults).

    Raises:
      ValueError: naming up to three differing fields.
    """
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return
    old, new = identity(OmegaConf.to_container(OmegaConf.load(path))), identity(cfg)
    diffs = identity_diffs(old, new, cfg)
    if diffs:
        more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
        raise ValueError(
            f"config {'; '.join(diffs[:3])}{more}: {run_dir} holds a run of another config "
            "(choose another hydra.run.dir, or the run's own overrides)"
        )


@contextlib.contextmanager
def exclusive(run_dir: Path):
    """Hold an exclusive lock on ``run_dir`` (``.lock``): a second command on the same run
    (a sweep over samplers, say) waits until the first is done, then resumes from its
    checkpoint."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another command training {run_dir}", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield
