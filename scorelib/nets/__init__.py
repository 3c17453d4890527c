"""Flax NNX networks ``F(x, c_noise)`` and the EDM preconditioning."""

from scorelib.nets.cascade import Cascade, with_blend
from scorelib.nets.classifier import ClassifierMLP
from scorelib.nets.local import LocalMLP, PatchMLP
from scorelib.nets.mlp import MLP
from scorelib.nets.precond import Precond, edm_precond
from scorelib.nets.unet import UNet

__all__ = [
    "Cascade",
    "with_blend",
    "MLP",
    "LocalMLP",
    "PatchMLP",
    "UNet",
    "ClassifierMLP",
    "edm_precond",
    "Precond",
]
