"""The three losses of f-distill (Xu, Nie and Vahdat 2025, Sec. 4, Alg. 1; DMD2, Yin et al.
2024, eq. 2 and Sec. 4.2 for the student target and the GAN terms).

Notation: ``g = G(z)`` a student sample ``[batch, *data_shape]``; ``x_teacher`` and
``x_fake`` the teacher's and the fake score's denoiser outputs ``D(x_t, t)`` at a noised
student sample ``x_t = alpha(t) g + sigma(t) eps``; ``h`` the normalised weights
(:mod:`scorelib.distill.ratio`). Since ``D_fake - D_teacher = sigma^2 / alpha
(score_fake - score_teacher)`` (Tweedie), the gradient of :func:`student_example_losses`
with respect to the student's parameters is, per example,

    w h (x_fake - x_teacher)^T dg/dtheta = w (sigma / alpha)^2 h (score_q - score_p)^T dx_t/dtheta,

the f-divergence gradient (``scorelib.distill.divergences``) scaled by the positive
weight ``w sigma^2 / alpha^2``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_array, check_arrays
from scorelib.scores.base import flatten

Array = Any
sg = jax.lax.stop_gradient

#: The shape patterns of the losses' arguments (checked on static shapes: free under ``jit``).
EXAMPLES = ("batch", "*data_shape")
LOGITS = ("batch", "heads")


def dmd_weight(g: Array, x_teacher: Array) -> Array:
    """DMD's per-example normaliser ``w = 1 / (mean_dims |g - x_teacher| + 1e-6)``, no gradient.

    ``g, x_teacher: [batch, *data_shape]`` -> ``[batch]`` (Yin et al. 2024a, eq. 8).

    Raises:
      ValueError: naming ``g`` or ``x_teacher`` (not real, or not of ``g``'s shape).
    """
    check_arrays(EXAMPLES, g=g, x_teacher=x_teacher)
    return 1.0 / (jnp.mean(jnp.abs(flatten(sg(g) - sg(x_teacher))), axis=-1) + 1e-6)


def student_example_losses(g: Array, x_teacher: Array, x_fake: Array, h: Array, w: Array) -> Array:
    """Per-example ``0.5 mean_dims (g - sg[g - w h (x_fake - x_teacher)])^2``.

    Its gradient is ``w h (x_fake - x_teacher) / d`` times ``dg/dtheta`` (``d`` the data
    dimension); its value is ``0.5 (w h)^2 mean_dims (x_fake - x_teacher)^2``.

    Args:
      g: ``[batch, *data_shape]`` student samples (differentiated).
      x_teacher, x_fake: ``[batch, *data_shape]`` denoiser outputs (not differentiated).
      h, w: ``[batch]`` weights (not differentiated).

    Returns:
      ``[batch]``.

    Raises:
      ValueError: naming the argument whose shape does not fit (a ``[batch, 1]`` weight
        would broadcast against ``[batch]`` losses into ``[batch, batch]``).
    """
    b = check_arrays(EXAMPLES, g=g, x_teacher=x_teacher, x_fake=x_fake)["batch"]
    sizes = {"batch": b}
    for name, v in (("h", h), ("w", w)):
        check_array(v, name, ("batch",), sizes=sizes, note=" (one weight per example of g)")
    wh = sg(w * h).reshape((b,) + (1,) * (g.ndim - 1))
    target = sg(g - wh * (sg(x_fake) - sg(x_teacher)))
    return 0.5 * jnp.mean(flatten(g - target) ** 2, axis=-1)


def gan_generator_losses(logits: Array) -> Array:
    """Non-saturating generator loss ``mean_heads softplus(-logits)`` per example.

    ``logits: [batch, heads]`` (the discriminator at noised student samples) -> ``[batch]``.
    Each head is a discriminator of its own, trained by :func:`discriminator_losses` (also
    a mean over heads of per-head terms), so the generator's term is each head's
    non-saturating loss (Goodfellow et al. 2014, Sec. 3), averaged the same way; as in
    NVIDIA FastGen's ``gan_loss_generator`` (``fastgen/methods/common_loss.py``:
    ``softplus(-fake_logits).mean()`` over the batch and the heads).

    Raises:
      ValueError: naming ``logits`` unless it is real ``[batch, heads]``.
    """
    check_arrays(LOGITS, logits=logits)
    return jnp.mean(jax.nn.softplus(-logits), axis=-1)


def discriminator_losses(logits_fake: Array, logits_real: Array) -> Array:
    """Logistic loss ``softplus(D(fake)) + softplus(-D(real))`` per example, mean over heads.

    ``logits_fake, logits_real: [batch, heads]`` -> ``[batch]``. Its minimiser over all
    functions is ``D = log(p_real / p_fake)`` (Goodfellow et al. 2014, Prop. 1 in logit form).

    Raises:
      ValueError: naming ``logits_fake`` or ``logits_real`` (not real ``[batch, heads]``, or
        not of one shape).
    """
    check_arrays(LOGITS, logits_fake=logits_fake, logits_real=logits_real)
    return jnp.mean(jax.nn.softplus(logits_fake) + jax.nn.softplus(-logits_real), axis=-1)


def r1_example_losses(logits_real: Array, logits_noised: Array) -> Array:
    """Approximate R1 penalty ``mean_heads (D(x_r) - D(x_r + r1_noise n))^2`` per example.

    ``logits_real, logits_noised: [batch, heads]``: the discriminator at noised data and at
    the same inputs perturbed by ``r1_noise`` Gaussian noise -> ``[batch]``. A finite-
    difference stand-in for R1's ``|grad_x D|^2`` (Mescheder et al. 2018, eq. 9) with no
    double backpropagation: the approximate R1 of APT (Lin et al. 2025) that f-distill uses
    (Xu et al. 2025, Table 5: gamma = 1 on CIFAR-10).

    Raises:
      ValueError: as :func:`discriminator_losses`, naming these two arguments.
    """
    check_arrays(LOGITS, logits_real=logits_real, logits_noised=logits_noised)
    return jnp.mean((logits_real - logits_noised) ** 2, axis=-1)


def fake_score_example_losses(x_fake: Array, g: Array) -> Array:
    """The fake score's plain x0-regression ``mean_dims (x_fake - sg(g))^2``: ``[batch]``.

    ``x_fake``: the fake network's denoiser at the noised student sample (differentiated);
    ``g``: the clean student sample (not differentiated).

    Raises:
      ValueError: naming ``x_fake`` or ``g`` (not real, or not of one shape).
    """
    check_arrays(EXAMPLES, x_fake=x_fake, g=g)
    return jnp.mean(flatten(x_fake - sg(g)) ** 2, axis=-1)
