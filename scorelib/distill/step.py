"""The distillation state and its jitted step: alternating student and critic updates.

One step, for state ``s`` with ``i = s.step`` (Xu, Nie and Vahdat 2025, Alg. 1; DMD2,
Yin et al. 2024, Sec. 4)::

    per example b (keys k_b = fold_in(fold_in(s.key, i), b)):
      z ~ N(0, I); g = G(z)                               # student sample (generate)
      ve_sigma ~ rho-spaced on [sigma_min, sigma_max]; t = t_of_ve_sigma(ve_sigma)
      x_t = alpha(t) g + sigma(t) eps                      # noised student sample
      x_r = alpha(t') x_real + sigma(t') eps'              # data, independent t'
    r   = ratio_from_logits(D(x_t)) / bin_mean             # stage 1 (per noise-level bin)
    h   = h_f(r) / mean(h)                                 # stage 2 (batch)
    if i % student_every == 0:   update the student on
        mean[0.5 |g - sg(g - w h (x_fake - x_teacher))|^2] + gan_weight mean softplus(-D(x_t))
    else:                        update the fake score and the discriminator on
        mean |x_fake(sg x_t) - sg g|^2 + mean[softplus(D(x_t)) + softplus(-D(x_r))]
                                 + r1_weight mean |D(x_r) - D(x_r + r1_noise n)|^2

D has one logit per head; the GAN, discriminator and R1 terms are means of per-head terms.

The per-bin ratio means are updated on student steps only (where they are used). All
losses are evaluated every step and logged; only the branch's own parameters move. The
state is a multi-part ``scorelib.training.TrainState`` (one optimizer per part) and the
update is the training package's (``scorelib.training.apply_update`` and ``advance``): a
step whose loss or gradient norm is non-finite applies no update and is recorded in
``first_nonfinite`` / ``n_skipped``, so the loop (``scorelib.training.train``) stops with
the step number or skips it.

**Class-conditional teacher** (a :class:`~scorelib.scores.conditional.ConditionalScore` with
``num_classes = K > 0``): example ``b`` also draws a class ``c_b`` uniform in ``[0, K)``
from its own key, ``randint(fold_in(k_b, LABEL_SALT))``
(:meth:`scorelib.scores.Labels.uniform`, :data:`scorelib.keys.LABEL_SALT`; independent of
the batch size and of the devices), and every term above is conditioned on it: the student
``G(z, c)`` and the fake score ``D_fake(x_t, t | c)`` are conditional networks, the teacher
gives ``D(x_t, t | c)`` (``denoiser_given``; with ``teacher_guidance = w != 1`` the
classifier-free guided ``D(. | null) + w (D(. | c) - D(. | null))``,
:class:`scorelib.scores.guidance.ClassifierFreeGuidance`, in the DMD term only), and the
discriminator reads the conditional teacher network's features at ``(x_t, t, c)`` and, for
the data, at ``(x_r, t', y)`` with each real example's own label ``y`` (``batch_fn(step)``
returns ``(x_real, y)``). This is DMD2's conditioning (Yin et al. 2024, ``main/edm/
train_edm.py``: generator labels drawn uniformly at random, the real images with their
own); NVIDIA FastGen's ``FdistillModel`` instead gives the student the real batch's labels.
At the optimum the logit is then ``log [p(y) p_t(x | y)] - log [q(c) q_t(x | c)]``, which
carries the factor ``K p(c)`` of the data's class frequencies ``p(c)`` against the uniform
draw: 1 for balanced classes (CIFAR-10 exactly, the digits within 4 %).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib._checks import check_array, check_int, check_real, note_text, require
from scorelib._pytree import static_pytree
from scorelib.distill import losses, ratio
from scorelib.distill.divergences import check_divergence, h_weight
from scorelib.distill.networks import generate, network_features, network_inputs
from scorelib.keys import example_keys
from scorelib.processes.noise_levels import rho_spaced
from scorelib.scores.base import ScoreSource
from scorelib.scores.conditional import Labels, is_conditional
from scorelib.scores.guidance import ClassifierFreeGuidance
from scorelib.scores.network import NetworkScore, network_num_classes
from scorelib.training.ema import EMA
from scorelib.training.optim import make_optimizer as _training_optimizer
from scorelib.training.state import TrainState
from scorelib.training.step import advance, apply_update

Array = Any
sg = jax.lax.stop_gradient


#: The approximate R1 penalty's input noise when ``DistillConfig.r1_noise`` is not given.
R1_NOISE = 0.1

#: What the student's EMA may count (:class:`DistillConfig` ``ema_clock``).
EMA_CLOCKS = ("steps", "student_updates")


@static_pytree
@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """The options of f-distill; validated when built (errors name ``distill.<field>``).

    Attributes:
      divergence: one of ``scorelib.distill.DIVERGENCES`` (``'kl'`` forward-KL, ...).
      student_every: the student is updated when ``step % student_every == 0``, the fake
        score and discriminator on the other steps (>= 1; the paper: 5). With 1 the
        critics never move.
      gan_weight: weight of the non-saturating GAN term in the student loss (>= 0;
        the paper: 1e-3 on CIFAR-10).
      r1_weight, r1_noise: approximate R1 penalty ``r1_weight |D(x_r) - D(x_r + r1_noise
        n)|^2`` on the discriminator (``r1_weight >= 0``, off when 0; ``r1_noise > 0``,
        default :data:`R1_NOISE` when ``None``; refused while the penalty is off).
      logit_clip, ratio_min, ratio_max: clipping of the logits and ratios (10, 0.1, 20).
      ratio_bins, ratio_ema: number of equal-width noise-level bins of the stage-1
        normalisation (>= 1) and the EMA rate of their means in [0, 1) (0: this batch).
      sigma_min, sigma_max, rho: the noise levels (VE frame, data units) of the losses,
        drawn as ``(sigma_max^(1/rho) + u (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho``,
        ``u ~ U(0, 1)`` (the continuous form of the authors' draw from a rho = 7 grid).
      sigma_g: the generator's input noise level (data units, > 0; EDM: 80).
      sigma_refine: the generator's refining stage ``G(z) = D(D(sigma_g z; sigma_g);
        sigma_refine)`` (:func:`scorelib.distill.generate`; data units, in ``(0, sigma_g)``),
        or ``None`` for the one evaluation of the paper.
      teacher_guidance: ``w``, the classifier-free guidance of a class-conditional teacher's
        denoiser in the student's DMD term, as the lerp weight of
        :class:`scorelib.scores.guidance.ClassifierFreeGuidance` (finite; 1: the conditional
        teacher, no guidance, the default; Ho and Salimans' ``w_HS = w - 1``). FastGen's
        ``guidance_scale`` is the same weight (``x_c + (s - 1) (x_c - x_null)``), applied
        to the teacher's x0-prediction after the discriminator has read the unguided
        features, as here; the paper uses 1 on CIFAR-10 and ImageNet-64 and 1.75 for SD
        v1.5 (Xu et al. 2025, Table 5). Anything but 1 needs a conditional teacher with a
        null label (:func:`make_distill_step` refuses the rest).
      ema_clock: what the student's EMA counts (its warm-up ramp ``(1 + t) / (10 + t)`` and
        an EDM half-life's ramp-up, :class:`scorelib.training.EMA`): ``'steps'``, ``t`` the
        global step (the student moves on one step in ``student_every``, so at the end
        of a run the ramp has reached ``1 - 9 / T`` for ``T`` steps, not ``1 - 9 / n`` for
        the ``n = T / student_every`` updates it averages: ``student_every`` times the
        window the ramp intends, e.g. half the EMA's weight on the last 256 of 800 updates
        instead of the last 60); or ``'student_updates'``, ``t`` the number of student
        updates before this one (``step // student_every``). The EMA moves on student
        steps only, either way. FastGen moves its EMA every iteration (a constant 0.9999 on
        CIFAR-10), which is ``beta ** student_every`` per update.
    """

    divergence: str = "kl"
    student_every: int = 5
    gan_weight: float = 1e-3
    r1_weight: float = 0.0
    r1_noise: float | None = None
    logit_clip: float = 10.0
    ratio_min: float = 0.1
    ratio_max: float = 20.0
    ratio_bins: int = 10
    ratio_ema: float = 0.0
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    rho: float = 7.0
    sigma_g: float = 80.0
    sigma_refine: float | None = None
    teacher_guidance: float = 1.0
    ema_clock: str = "steps"

    def __post_init__(self):
        check_divergence(self.divergence)
        check_int(self.student_every, "distill.student_every", low=1)
        check_real(self.gan_weight, "distill.gan_weight", low=0.0)
        check_real(self.r1_weight, "distill.r1_weight", low=0.0)
        if self.r1_noise is not None:
            require(
                self.r1_weight > 0,
                "distill.r1_noise",
                "left unset while distill.r1_weight = 0 (the R1 penalty is off)",
                self.r1_noise,
            )
            check_real(self.r1_noise, "distill.r1_noise", low=0.0, low_open=True)
        check_real(self.logit_clip, "distill.logit_clip", low=0.0, low_open=True)
        check_real(self.ratio_min, "distill.ratio_min", low=0.0, low_open=True)
        check_real(self.ratio_max, "distill.ratio_max", low=self.ratio_min, low_open=True)
        check_int(self.ratio_bins, "distill.ratio_bins", low=1)
        check_real(self.ratio_ema, "distill.ratio_ema", low=0.0, high=1.0, high_open=True)
        check_real(self.sigma_min, "distill.sigma_min", low=0.0, low_open=True)
        check_real(self.sigma_max, "distill.sigma_max", low=self.sigma_min, low_open=True)
        check_real(self.rho, "distill.rho", low=0.0, low_open=True)
        check_real(self.sigma_g, "distill.sigma_g", low=0.0, low_open=True)
        if self.sigma_refine is not None:
            check_real(
                self.sigma_refine,
                "distill.sigma_refine",
                low=0.0,
                high=self.sigma_g,
                low_open=True,
                high_open=True,
            )
        check_real(self.teacher_guidance, "distill.teacher_guidance")
        require(
            self.ema_clock in EMA_CLOCKS,
            "distill.ema_clock",
            f"one of {list(EMA_CLOCKS)}",
            repr(self.ema_clock),
        )

    def ema_count(self, step: Array) -> Array:
        """The EMA's step index at global step ``step`` (``ema_clock``)."""
        return step if self.ema_clock == "steps" else step // self.student_every

    def draw_ve_sigma(self, u: Array) -> Array:
        """Noise levels from ``u`` in [0, 1] (same shape): rho-spaced, ``u = 0`` is sigma_max
        (:func:`scorelib.processes.noise_levels.rho_spaced`)."""
        return rho_spaced(u, self.sigma_min, self.sigma_max, self.rho)


class DistillState(TrainState):
    """Everything a resumed distillation needs, as one pytree (checkpointed whole): a
    :class:`scorelib.training.TrainState` of three parts, one optimizer each, with the
    ratio means.

    Attributes:
      params: ``{'student', 'fake', 'disc'}`` parameter states.
      ema_params: EMA of ``params['student']`` (the sampled generator).
      opt_state: ``{'student', 'fake', 'disc'}`` optax states.
      step, key, n_skipped, first_nonfinite: as ``scorelib.training.TrainState``.
      ratio_means: ``[ratio_bins]`` float32 per-bin mean ratios of the stage-1
        normalisation (1 before the first student step).
    """

    ratio_means: jax.Array


PARTS = ("student", "fake", "disc")


def make_optimizer(
    lr: float,
    weight_decay: float,
    b1: float = 0.9,
    b2: float = 0.999,
    grad_clip: float | None = None,
):
    """The paper's optimiser of each part (Xu et al. 2025, Table 5: AdamW, lr 1e-4, weight
    decay 0.01, no warm-up): :func:`scorelib.training.make_optimizer` with ``weight_decay``,
    and with ``grad_clip`` (> 0) the part's gradient clipped to that global norm first.
    FastGen clips the student's at 10 (``configs/callbacks.py``), DMD2 the generator's and
    the critic's at 10 (``main/edm/train_edm.py``); ``None``: no clipping.

    Raises:
      ValueError: naming ``optim.lr``, ``optim.weight_decay``, ``optim.b1``, ``optim.b2``,
        ``optim.grad_clip``.
    """
    return _training_optimizer(lr, grad_clip=grad_clip, b1=b1, b2=b2, weight_decay=weight_decay)


def init_distill_state(params: dict, optimizers: dict, cfg: DistillConfig, seed: int):
    """A fresh :class:`DistillState` at step 0 (``scorelib.training.TrainState.create``
    with the student's EMA and ratio means 1).

    Args:
      params: ``{'student', 'fake', 'disc'}`` parameter states (copied).
      optimizers: ``{'student', 'fake', 'disc'}`` optax transformations.
      cfg: the :class:`DistillConfig` (for ``ratio_bins``).
      seed: the base key's seed.

    Raises:
      ValueError: naming ``params`` unless its keys (and the optimizers') are :data:`PARTS`.
    """
    require(set(params) == set(PARTS), "params", f"a dict with keys {PARTS}", sorted(params))
    return DistillState.create(
        params,
        optimizers,
        seed,
        ema_part="student",
        ratio_means=jnp.ones((cfg.ratio_bins,), jnp.float32),
    )


def teacher_classes(teacher) -> int:
    """``K``: the teacher's classes when it is class-conditional
    (:func:`scorelib.scores.conditional.is_conditional`), else 0."""
    return int(teacher.num_classes) if is_conditional(teacher) else 0


def check_distill_shapes(
    teacher, batch_fn, batch_size: int, data_shape, num_classes: int = 0
) -> tuple[int, ...]:
    """The entry checks of :func:`make_distill_step` on static shapes; returns ``data_shape``.

    The teacher must take ``[batch, *data_shape]`` (its own ``data_shape`` when it has one)
    and ``batch_fn(step)`` must give real ``[batch_size, *data_shape]`` data, with
    ``num_classes > 0`` (a class-conditional teacher) as ``(x, labels)`` with integer
    ``labels: [batch_size]`` (read by ``jax.eval_shape``: nothing is computed).

    Raises:
      ValueError: naming ``teacher`` (not a score source), ``data_shape`` (not a tuple of
        sizes >= 1, or not the teacher's) or ``batch_fn(step)`` (another shape or dtype;
        unlabelled data for a conditional teacher, labelled data for an unconditional one).
    """
    require(isinstance(teacher, ScoreSource), "teacher", "a scorelib ScoreSource", type(teacher))
    try:
        shape = tuple(int(s) for s in data_shape)
    except (TypeError, ValueError):
        shape = ()
    require(bool(shape) and min(shape) >= 1, "data_shape", "a tuple of sizes >= 1", data_shape)
    expected, note = teacher.expected_data_shape()
    if expected is not None and shape != expected:
        require(False, "data_shape", f"the teacher's {expected}{note_text(note)}", shape)
    out = jax.eval_shape(batch_fn, jax.ShapeDtypeStruct((), jnp.int32))
    labelled = isinstance(out, (tuple, list))
    if num_classes:
        require(
            labelled and len(out) == 2,
            "batch_fn(step)",
            f"labelled real data (x [{batch_size}, *data_shape], labels [{batch_size}]) for a "
            f"class-conditional teacher ({num_classes} classes): the discriminator sees each "
            "real example with its class (data.labels=true)",
            "unlabelled data" if not labelled else f"a tuple of {len(out)}",
        )
        out, labels = out
        require(
            jnp.issubdtype(labels.dtype, jnp.integer) and tuple(labels.shape) == (batch_size,),
            "batch_fn(step) labels",
            f"integer class labels of shape ({batch_size},)",
            f"{labels.dtype} of shape {tuple(labels.shape)}",
        )
    else:
        require(
            not labelled,
            "batch_fn(step)",
            f"unlabelled real data [{batch_size}, *data_shape] for an unconditional teacher "
            "(class labels need a class-conditional teacher: data.labels=false)",
            "labelled data (x, labels)",
        )
    check_array(
        out, "batch_fn(step)", (batch_size, *shape), note=" ([trainer.batch_size, *data_shape])"
    )
    return shape


def check_conditioning(teacher, nets: Networks, cfg: DistillConfig) -> int:
    """The conditioning checks of :func:`make_distill_step`; returns the teacher's classes
    ``K`` (0: unconditional).

    A class-conditional teacher (``K > 0``) needs conditional student and fake-score
    networks of ``K`` classes (``nets.num_classes``) and, when the discriminator reads the
    teacher network's features, a teacher network of ``K`` classes; an unconditional one
    needs unconditional networks. ``cfg.teacher_guidance != 1`` needs a conditional teacher
    with a null label (its unconditional score).

    Raises:
      ValueError: naming ``nets.num_classes``, ``nets.teacher_net`` or
        ``distill.teacher_guidance``.
    """
    k = teacher_classes(teacher)
    require(
        nets.num_classes == k,
        "nets.num_classes",
        f"{k}, the teacher's classes (the student and the fake score are conditioned as the "
        "teacher is)"
        if k
        else "0 for an unconditional teacher (class labels need a class-conditional teacher)",
        nets.num_classes,
    )
    if nets.teacher_net is not None:
        kt = network_num_classes(*nets.teacher_net)
        require(
            kt == k,
            "nets.teacher_net",
            f"a network of the teacher's {k} classes (its features feed the discriminator)",
            f"a network of {kt} classes",
        )
    if cfg.teacher_guidance != 1:
        require(
            k > 0,
            "distill.teacher_guidance",
            "1 for an unconditional teacher (classifier-free guidance needs a class-"
            "conditional teacher)",
            cfg.teacher_guidance,
        )
        require(
            teacher.allows_null,
            "distill.teacher_guidance",
            "1: the teacher has no unconditional (null-label) score to guide with",
            cfg.teacher_guidance,
        )
    return k


@dataclasses.dataclass(frozen=True)
class Networks:
    """The graph definitions of the distillation's networks.

    Attributes:
      model: graphdef of the student and the fake score (same architecture).
      disc: graphdef of the :class:`~scorelib.distill.Discriminator`.
      teacher_net: ``(graphdef, params)`` of the teacher network whose features feed the
        discriminator, or ``None`` when the discriminator has its own backbone.
      sigma_data: the preconditioning's data standard deviation.
      num_classes: the classes of the student and fake-score networks (``model``'s
        ``num_classes``, and the discriminator backbone's when it has one): 0 for an
        unconditional teacher, the teacher's ``K`` for a class-conditional one.
    """

    model: Any
    disc: Any
    teacher_net: tuple | None
    sigma_data: float
    num_classes: int = 0


def make_distill_step(
    teacher,
    nets: Networks,
    cfg: DistillConfig,
    optimizers: dict,
    ema: EMA,
    batch_fn: Callable[[jax.Array], jax.Array],
    batch_size: int,
    data_shape: tuple[int, ...],
    *,
    jit: bool = True,
    batch_sharding: jax.sharding.Sharding | None = None,
) -> Callable[[DistillState], tuple[DistillState, dict]]:
    """Build ``step(state) -> (state, metrics)`` (see the module docstring): with ``jit``
    a :class:`DistillStep`, which also takes the host's step number to skip the
    ``lax.cond``.

    Args:
      teacher: a ``ScoreSource`` (network, Gaussian, mixture, empirical); its
        ``process`` is the distillation's. A class-conditional one
        (``ConditionalScore`` with ``num_classes = K > 0``: a conditional
        ``NetworkScore``, a ``PerClassScore``) makes the student conditional (module
        docstring). A random one (``SmoothedScore``) is bound to each step's examples.
      nets: the networks' graph definitions (:class:`Networks`; ``nets.num_classes`` the
        teacher's ``K``, or 0).
      cfg: :class:`DistillConfig`.
      optimizers: ``{'student', 'fake', 'disc'}`` optax transformations.
      ema: EMA of the student.
      batch_fn: ``step -> [batch_size, *data_shape]`` real data (traceable); for a
        conditional teacher ``step -> (x, labels)`` with ``labels: [batch_size]`` int in
        ``[0, K)``, each real example's class.
      batch_size: examples per step (>= 1).
      data_shape: shape of one example.
      jit: compile with the state donated.
      batch_sharding: data parallelism, as in :func:`scorelib.training.make_train_step`:
        the sharding of every per-example array (the draws and the real batch; e.g.
        ``scorelib.parallel.batch_sharding(mesh)``), so each device works on its share of
        the global batch and every batch mean (the losses, the per-bin ratio means, the
        stage-2 normalisation of ``h``) is the global one, all-reduced by XLA. Place the
        state, the teacher and the real data replicated (``scorelib.parallel.shard``).
        Every example draws from its own key, so the step is the one-device step up to
        the order of the floating-point reductions.

    Returns:
      ``step``. Its metrics (float32 scalars): ``loss`` (the updated part's),
      ``loss_student``, ``loss_fake``, ``loss_disc`` (R1 included), ``loss_r1`` (the R1
      penalty before its weight; 0 while it is off), ``student_step`` (1 or 0),
      ``grad_norm``, ``finite``, ``ema_beta``, ``r_mean``, ``r_min``, ``r_max`` (ratios
      after clipping, before normalisation), ``h_max`` (largest normalised weight) and
      ``ratio_bin<k>`` (the per-bin means after the step).

    Raises:
      ValueError: before anything is computed, naming ``trainer.batch_size``, ``teacher``,
        ``data_shape``, ``batch_fn(step)`` (:func:`check_distill_shapes`: unlabelled data
        for a conditional teacher, labelled data for an unconditional one),
        ``nets.num_classes``, ``nets.teacher_net`` or ``distill.teacher_guidance``
        (:func:`check_conditioning`: guidance of an unconditional teacher or of one
        without a null label).
    """
    check_int(batch_size, "trainer.batch_size", low=1)
    require(isinstance(teacher, ScoreSource), "teacher", "a scorelib ScoreSource", type(teacher))
    K = check_conditioning(teacher, nets, cfg)
    B, shape = batch_size, check_distill_shapes(teacher, batch_fn, batch_size, data_shape, K)
    process = teacher.process
    sd = nets.sigma_data
    guided = teacher
    if cfg.teacher_guidance != 1:
        guided = ClassifierFreeGuidance.create(teacher, scale=cfg.teacher_guidance)
    draw_labels = Labels.uniform(K) if K else None

    def per_example(x):
        """``x: [B, ...]`` laid out along the batch sharding (a no-op on one device)."""
        return x if batch_sharding is None else jax.lax.with_sharding_constraint(x, batch_sharding)

    def draws(key, i):
        """Per-example draws of step ``i``, and with a conditional teacher each example's
        class (module docstring)."""
        step_key = jax.random.fold_in(key, i)
        keys = per_example(example_keys(step_key, B))

        def one(k):
            kz, ku, ke, kur, ker, k1 = jax.random.split(k, 6)
            n = lambda kk: jax.random.normal(kk, shape)  # noqa: E731
            return n(kz), jax.random.uniform(ku), n(ke), jax.random.uniform(kur), n(ker), n(k1)

        out = jax.tree.map(per_example, jax.vmap(one)(keys))
        if draw_labels is None:
            return out
        return (*out, per_example(draw_labels.take(step_key, 0, B)))

    def noised(x0, u, eps):
        ve_sigma = cfg.draw_ve_sigma(u)
        t = process.t_of_ve_sigma(ve_sigma)
        x_t = process.marginal_sample(x0, t, eps)
        return x_t, t, ve_sigma

    def logits_at(disc_params, x, t, labels):
        x_in, c_noise = network_inputs(process, x, t, sd)
        feats = None
        if nets.teacher_net is not None:
            feats = network_features(*nets.teacher_net, x_in, c_noise, labels)
        return nnx.merge(nets.disc, disc_params)(x_in, c_noise, feats, labels)

    def teacher_denoiser(state, x_t, t, c):
        """``D(x_t, t)`` of the teacher bound to this step's examples (a random teacher's
        per-example draws: ``for_examples``, a no-op for a deterministic one), given ``c``
        for a conditional teacher (guided with ``teacher_guidance``)."""
        src = guided.for_examples(jax.random.fold_in(state.rng, state.step), B, 0)
        if c is None:
            return src.denoiser(x_t, t)
        return src.denoiser_given(x_t, t, c)

    def real_batch(i):
        """``(x_real, y)`` of step ``i``; ``y`` is ``None`` for an unconditional teacher."""
        out = batch_fn(i)
        if not K:
            return per_example(out), None
        return per_example(out[0]), per_example(jnp.asarray(out[1], jnp.int32))

    def forward(params, state, d):
        """Every quantity of the step; the gradient paths are those of the losses."""
        z, u, eps, u_r, eps_r, n_r1, *rest = d
        c = rest[0] if rest else None  # [B] classes of a conditional teacher
        g = generate(nets.model, params["student"], z, cfg.sigma_g, sd, cfg.sigma_refine, labels=c)
        x_t, t, ve_sigma = noised(g, u, eps)
        x_teacher = sg(teacher_denoiser(state, sg(x_t), t, c))
        fake = NetworkScore(
            process=process, graphdef=nets.model, params=params["fake"], sigma_data=sd
        )
        x_fake = fake.denoiser_given(sg(x_t), t, c)
        logits_fake = logits_at(params["disc"], x_t, t, c)
        # density ratio and weights
        r = ratio.ratio_from_logits(
            logits_fake, logit_clip=cfg.logit_clip, ratio_min=cfg.ratio_min, ratio_max=cfg.ratio_max
        )
        index = ratio.bin_index(ve_sigma, cfg.sigma_min, cfg.sigma_max, cfg.ratio_bins)
        means = ratio.bin_means(r, index, cfg.ratio_bins, state.ratio_means, cfg.ratio_ema)
        h = ratio.normalise_weights(
            h_weight(cfg.divergence, ratio.normalise_ratio(r, index, means))
        )
        w = losses.dmd_weight(g, x_teacher)
        l_student = jnp.mean(losses.student_example_losses(g, x_teacher, x_fake, h, w))
        l_gan = jnp.mean(losses.gan_generator_losses(logits_fake))
        x_real, y_real = real_batch(state.step)
        x_r, t_r, _ = noised(x_real, u_r, eps_r)
        logits_real = logits_at(params["disc"], x_r, t_r, y_real)
        l_disc = jnp.mean(
            losses.discriminator_losses(logits_at(params["disc"], sg(x_t), t, c), logits_real)
        )
        l_r1 = jnp.zeros((), jnp.float32)
        if cfg.r1_weight > 0:
            x_r1 = x_r + (R1_NOISE if cfg.r1_noise is None else cfg.r1_noise) * n_r1
            l_r1 = jnp.mean(
                losses.r1_example_losses(logits_real, logits_at(params["disc"], x_r1, t_r, y_real))
            )
            l_disc = l_disc + cfg.r1_weight * l_r1
        l_fake = jnp.mean(losses.fake_score_example_losses(x_fake, g))
        terms = {
            "loss_student": l_student + cfg.gan_weight * l_gan,
            "loss_fake": l_fake,
            "loss_disc": l_disc,
        }
        diag = {
            "r_mean": jnp.mean(r),
            "r_min": jnp.min(r),
            "r_max": jnp.max(r),
            "h_max": jnp.max(h),
            "loss_r1": l_r1,
        }
        return terms, diag, means

    def update(state, parts, d):
        def loss_fn(sub):
            params = {**state.params, **sub}
            terms, diag, means = forward(params, state, d)
            if parts == ("student",):
                loss = terms["loss_student"]
            else:
                loss = terms["loss_fake"] + terms["loss_disc"]
            return loss, (terms, diag, means)

        sub = {k: state.params[k] for k in parts}
        (loss, (terms, diag, means)), grads = jax.value_and_grad(loss_fn, has_aux=True)(sub)
        beta = ema.beta(cfg.ema_count(state.step))
        new, grad_norm, finite = apply_update(
            state, loss, grads, optimizers, ema_beta=beta, ema_part="student"
        )
        if parts == ("student",):
            new = new.replace(ratio_means=jnp.where(finite, means, state.ratio_means))
        out = dict(
            terms,
            **diag,
            loss=loss,
            grad_norm=grad_norm,
            finite=finite,
            ema_beta=beta,
            student_step=jnp.asarray(parts == ("student",)),
        )
        return new, out

    def finish(state: DistillState, new: DistillState, out: dict):
        """Advance the step counter, record a non-finite step, collect the metrics."""
        new = advance(state, new, out["finite"])
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}
        for k in range(cfg.ratio_bins):
            metrics[f"ratio_bin{k}"] = new.ratio_means[k]
        return new, metrics

    def branch(parts):
        def step_parts(state: DistillState):
            return finish(state, *update(state, parts, draws(state.rng, state.step)))

        return step_parts

    student, critic = branch(("student",)), branch(("fake", "disc"))

    def step(state: DistillState):
        return jax.lax.cond(state.step % cfg.student_every == 0, student, critic, state)

    if not jit:
        return step
    jitted = (jax.jit(f, donate_argnums=0) for f in (step, student, critic))
    return DistillStep(*jitted, cfg.student_every)


@dataclasses.dataclass(frozen=True)
class DistillStep:
    """The jitted distillation step: ``step(state) -> (state, metrics)``, or
    ``step(state, i)`` with the host's copy ``i == state.step`` of the step number.

    Given ``i`` (:func:`scorelib.training.train` passes it: ``takes_step``), the step runs
    the compiled branch that ``i`` selects (the student on ``i % student_every == 0``, else
    the fake score and the discriminator) instead of one ``lax.cond`` over both: XLA:CPU
    runs convolutions inside a conditional about 10x slower (measured: a discriminator
    conv head's forward and backward, batch 128, 8x8x32 -> 128 channels, 9.5 ms outside
    and 108 ms inside a ``lax.cond``; the digits distillation from the ``local_digits``
    teacher, 507 ms against 72 ms per step, from the MLP teacher 26 ms either way:
    ``benchmarks/distill_step.py``). Without ``i`` it runs the ``lax.cond``
    version, which needs no host knowledge of the step. Both are the same computation.
    """

    cond: Callable
    student: Callable
    critic: Callable
    student_every: int
    takes_step: bool = True

    def __call__(self, state: DistillState, i: int | None = None):
        if i is None:
            return self.cond(state)
        return (self.student if i % self.student_every == 0 else self.critic)(state)
