"""Training objectives: ``objective(source, x0, key) -> (loss, metrics)``.

Each objective's per-example losses come from ``objective.example_losses(source, x0,
key)``; their weights live in :mod:`scorelib.objectives.weights`. A penalty on the
asymmetry of the score's Jacobian wraps any of them (:class:`QuasiConservative`). A biased
training set with a density ratio to its unbiased law: :class:`TIWLoss` (TIW-DSM). Cas-DM's
cascaded denoiser with a metric loss: :class:`CascadeLoss`.
"""

from scorelib.objectives import weights
from scorelib.objectives.base import Objective, example_draws, reduce_per_example
from scorelib.objectives.cascade import CascadeLoss, SourcePair, cascade_denoisers
from scorelib.objectives.classifier import DLSM, NoisyCrossEntropy
from scorelib.objectives.conservative import QuasiConservative, quasi_conservative
from scorelib.objectives.dsm import DSM, EDMLoss
from scorelib.objectives.smoothed import SmoothedScoreMatching
from scorelib.objectives.sure import SURE, denoiser_sure, sure_risk
from scorelib.objectives.tiw import ClassifierLogRatio, ExactLogRatio, TIWLoss
from scorelib.objectives.tsm import (
    KAPPAS,
    TSM,
    MixedScoreMatching,
    kappa_schedule,
    label_residuals,
)

OBJECTIVES = {"dsm": DSM, "edm": EDMLoss, "tsm": TSM, "mixed": MixedScoreMatching}

__all__ = [
    "Objective",
    "DSM",
    "EDMLoss",
    "TSM",
    "MixedScoreMatching",
    "SmoothedScoreMatching",
    "NoisyCrossEntropy",
    "DLSM",
    "SURE",
    "denoiser_sure",
    "sure_risk",
    "TIWLoss",
    "CascadeLoss",
    "cascade_denoisers",
    "SourcePair",
    "ExactLogRatio",
    "ClassifierLogRatio",
    "QuasiConservative",
    "quasi_conservative",
    "KAPPAS",
    "kappa_schedule",
    "label_residuals",
    "OBJECTIVES",
    "reduce_per_example",
    "example_draws",
    "weights",
]
