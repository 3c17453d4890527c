"""Score sources: one interface for ``score(x, t)`` and ``denoiser(x, t)``."""

from scorelib.scores.base import ScoreSource, denoiser_from_score, score_from_denoiser
from scorelib.scores.empirical import EmpiricalScore
from scorelib.scores.gaussian import GaussianScore
from scorelib.scores.gaussian_fit import (
    fit_gaussian,
    fit_kmeans_mixture,
    gaussian_flow,
    gaussian_marginal_sample,
)
from scorelib.scores.mixture import MixtureScore
from scorelib.scores.network import NetworkScore, preconditioned_denoiser

__all__ = [
    "ScoreSource",
    "GaussianScore",
    "MixtureScore",
    "EmpiricalScore",
    "fit_gaussian",
    "fit_kmeans_mixture",
    "gaussian_flow",
    "gaussian_marginal_sample",
    "NetworkScore",
    "preconditioned_denoiser",
    "score_from_denoiser",
    "denoiser_from_score",
]
