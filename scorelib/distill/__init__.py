"""One-step distillation of a teacher score source with f-divergence weighting (f-distill).

Xu, Nie and Vahdat, "One-step diffusion models with f-divergence distribution matching",
arXiv 2502.15681 (2025). Modules: ``divergences`` (``f`` and ``h(r) = f''(r) r^2``),
``ratio`` (density ratio from logits, clipping, two-stage normalisation), ``losses``
(student, GAN, discriminator and fake-score losses), ``networks`` (one-step generator,
discriminator heads), ``step`` (the state and the alternating jitted step). A
class-conditional teacher (``scorelib.scores.ConditionalScore``) gives a class-conditional
student ``G(z, c)`` (``step``'s module docstring).
"""

from scorelib.distill.divergences import DIVERGENCES, check_divergence, describe, f_fn, h_weight
from scorelib.distill.losses import (
    discriminator_losses,
    dmd_weight,
    fake_score_example_losses,
    gan_generator_losses,
    r1_example_losses,
    student_example_losses,
)
from scorelib.distill.networks import (
    Discriminator,
    generate,
    generator_nfe,
    network_features,
    network_inputs,
    one_step_sampler,
)
from scorelib.distill.ratio import (
    bin_index,
    bin_means,
    normalise_ratio,
    normalise_weights,
    ratio_from_logits,
)
from scorelib.distill.step import (
    PARTS,
    DistillConfig,
    DistillState,
    DistillStep,
    Networks,
    init_distill_state,
    make_distill_step,
    make_optimizer,
)

__all__ = [
    "DIVERGENCES",
    "check_divergence",
    "describe",
    "f_fn",
    "h_weight",
    "discriminator_losses",
    "dmd_weight",
    "fake_score_example_losses",
    "gan_generator_losses",
    "r1_example_losses",
    "student_example_losses",
    "Discriminator",
    "generate",
    "generator_nfe",
    "network_features",
    "network_inputs",
    "one_step_sampler",
    "bin_index",
    "bin_means",
    "normalise_ratio",
    "normalise_weights",
    "ratio_from_logits",
    "PARTS",
    "DistillConfig",
    "DistillState",
    "DistillStep",
    "Networks",
    "init_distill_state",
    "make_distill_step",
    "make_optimizer",
]
