"""Score sources: one interface for ``score(x, t)`` and ``denoiser(x, t)``.

Every source of a score lives here: analytic ones (Gaussian, Gaussian mixture, the
training set's empirical score, its smoothed version and nearest-neighbour estimator
(sigma-CFDM), the many-well quadrature, the reverse-diffusion Monte Carlo estimate of an
unnormalised density's score), a trained network, and the closed-form Gaussian
probability-flow ODE beside the Gaussian source, and the asymmetry of a source's Jacobian
(``jacobian.py``: how far a score field is from a gradient field). Class-conditional
sources (``conditional.py``: labels bound per example like a random source's keys, the
exact per-class source) and guidance (``guidance.py``) are sources too; the noise-conditional
classifier that classifier guidance adds (``classifier.py``) lives beside them. Measurement-
conditioned sources (``measured.py``: replacement/projection, DPS, PiGDM; a linear measurement
bound per example) sample inverse problems' posteriors, and ``posterior.py`` gives the exact
posterior of a Gaussian prior they are checked against. ``line_smoothing.py`` is the analytic
model of score smoothing's interpolation (the smoothed piecewise-linear empirical score of
points on a line, with its closed-form flow map).
"""

from scorelib.scores.base import ScoreSource, denoiser_from_score, score_from_denoiser
from scorelib.scores.classifier import NoisyClassifier
from scorelib.scores.conditional import ConditionalScore, Labels, PerClassScore
from scorelib.scores.empirical import EmpiricalScore
from scorelib.scores.gaussian import GaussianScore, gaussian_flow, gaussian_marginal_sample
from scorelib.scores.gaussian_fit import fit_gaussian, fit_kmeans_mixture
from scorelib.scores.jacobian import jacobian_asymmetry
from scorelib.scores.line_smoothing import SmoothedLineScore
from scorelib.scores.manywell import ManyWellNoisyScore
from scorelib.scores.measured import DPS, MeasuredScore, Observations, PiGDM, Projection
from scorelib.scores.mixture import MixtureScore
from scorelib.scores.neighbours import NeighbourScore
from scorelib.scores.network import NetworkScore, preconditioned_denoiser
from scorelib.scores.rdmc import ReverseDiffusionScore
from scorelib.scores.smoothed import SmoothedScore

__all__ = [
    "ScoreSource",
    "ConditionalScore",
    "Labels",
    "PerClassScore",
    "NoisyClassifier",
    "MeasuredScore",
    "Observations",
    "Projection",
    "DPS",
    "PiGDM",
    "GaussianScore",
    "MixtureScore",
    "EmpiricalScore",
    "SmoothedScore",
    "SmoothedLineScore",
    "NeighbourScore",
    "ManyWellNoisyScore",
    "ReverseDiffusionScore",
    "fit_gaussian",
    "fit_kmeans_mixture",
    "gaussian_flow",
    "gaussian_marginal_sample",
    "jacobian_asymmetry",
    "NetworkScore",
    "preconditioned_denoiser",
    "score_from_denoiser",
    "denoiser_from_score",
]
