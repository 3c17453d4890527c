"""Score sources: one interface for ``score(x, t)`` and ``denoiser(x, t)``."""

from scorelib.scores.base import ScoreSource, denoiser_from_score, score_from_denoiser
from scorelib.scores.gaussian import GaussianScore
from scorelib.scores.mixture import MixtureScore
from scorelib.scores.network import NetworkScore, preconditioned_denoiser

__all__ = [
    "ScoreSource",
    "GaussianScore",
    "MixtureScore",
    "NetworkScore",
    "preconditioned_denoiser",
    "score_from_denoiser",
    "denoiser_from_score",
]
