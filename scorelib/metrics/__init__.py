"""Metrics: sample distances, Fréchet distances, classifier features, the classifier two-sample
test, precision/recall (and, for class-conditional samples, the classifier accuracy
against their labels and both tests per class), mode coverage of a known mixture, PF-ODE
likelihood and bits/dim, memorisation, the estimators the tables report (relative score
error, explained fraction, label variance), the asymmetry of a score's Jacobian (QCSBM) and
out-of-distribution detection by multiscale score norms (MSMA), and a noise-conditional
classifier's guidance-gradient error and accuracy (``guidance.py``), and the estimators of
inverse-problem reconstructions (``reconstruction.py``: PSNR, SSIM, central-interval coverage
of posterior draws, the posterior std map, data consistency) and of posterior draws against a
known Gaussian posterior (``posterior.py``: W2 of the Gaussian fit, its Monte-Carlo floor, the
per-pixel std calibration), the two modules of a cascaded denoiser (``cascade.py``) and
perceptual distances (``perceptual.py``: LPIPS's form on a feature network's layers), and
the power of the t-test over seeds (``power.py``: how many seeds a comparison needs)."""

from scorelib.metrics.cascade import cascade_errors
from scorelib.metrics.classifier import (
    ClassifierConfig,
    FeatureExtractor,
    default_cache_dir,
    mnist_subset_config,
)
from scorelib.metrics.conditional import (
    class_share_tv,
    class_shares,
    conditional_accuracy,
    per_class_two_sample,
)
from scorelib.metrics.conservative import score_asymmetry
from scorelib.metrics.distances import (
    energy_distance,
    mean_paired_distance,
    median_bandwidth,
    mmd_rbf,
    sample_distances,
    sliced_wasserstein2,
    squared_distances,
    wasserstein2_1d,
)
from scorelib.metrics.frechet import fd_features, fd_floor, frechet_distance, gaussian_stats
from scorelib.metrics.guidance import classifier_gradient_error, noisy_classifier_accuracy
from scorelib.metrics.label_variance import label_variance
from scorelib.metrics.likelihood import bits_per_dim, dequantise, pf_ode_log_likelihood
from scorelib.metrics.memorisation import (
    memorisation_stats,
    nearest_neighbour_distances,
    nearest_neighbours,
)
from scorelib.metrics.modes import (
    mean_displacement,
    mode_statistics,
    well_barrier,
    well_mode_statistics,
)
from scorelib.metrics.ood import (
    NormDensity,
    auroc,
    fit_norm_density,
    msma,
    ood_scores,
    score_norms,
    select_components,
)
from scorelib.metrics.posterior import gaussian_w2, gaussian_w2_floor, std_calibration
from scorelib.metrics.power import pooled_std, seeds_needed, t_test_power
from scorelib.metrics.precision_recall import knn_radii, precision_recall
from scorelib.metrics.reconstruction import (
    calibrated_coverage,
    coverage,
    data_consistency,
    posterior_std,
    psnr,
    ssim,
)
from scorelib.metrics.score_error import explained_fraction, noisy_samples, relative_score_error
from scorelib.metrics.two_sample import c2st, default_classifier, stronger_classifier

__all__ = [
    "cascade_errors",
    "calibrated_coverage",
    "coverage",
    "data_consistency",
    "posterior_std",
    "psnr",
    "ssim",
    "ClassifierConfig",
    "NormDensity",
    "auroc",
    "fit_norm_density",
    "msma",
    "ood_scores",
    "select_components",
    "score_asymmetry",
    "score_norms",
    "FeatureExtractor",
    "bits_per_dim",
    "c2st",
    "noisy_classifier_accuracy",
    "classifier_gradient_error",
    "conditional_accuracy",
    "class_shares",
    "class_share_tv",
    "default_classifier",
    "stronger_classifier",
    "pooled_std",
    "seeds_needed",
    "t_test_power",
    "dequantise",
    "default_cache_dir",
    "energy_distance",
    "explained_fraction",
    "fd_features",
    "fd_floor",
    "gaussian_w2",
    "gaussian_w2_floor",
    "std_calibration",
    "frechet_distance",
    "gaussian_stats",
    "knn_radii",
    "label_variance",
    "median_bandwidth",
    "memorisation_stats",
    "mode_statistics",
    "mean_displacement",
    "mmd_rbf",
    "mnist_subset_config",
    "nearest_neighbour_distances",
    "nearest_neighbours",
    "per_class_two_sample",
    "noisy_samples",
    "pf_ode_log_likelihood",
    "precision_recall",
    "relative_score_error",
    "mean_paired_distance",
    "sample_distances",
    "sliced_wasserstein2",
    "squared_distances",
    "wasserstein2_1d",
    "well_barrier",
    "well_mode_statistics",
]
