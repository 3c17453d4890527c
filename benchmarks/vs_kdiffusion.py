"""scorelib against k-diffusion (torch, CPU) on the same job, in one run (issue 24).

The job: an EDM-preconditioned MLP 4 x 256 on ``d = 64`` (``MLP(data_shape=(64,),
width=256, depth=4)`` behind ``NetworkScore``, ``sigma_data = 0.5``), sampled on the EDM
grid of 18 steps (``edm_grid(18)``: Heun 35 NFE, DPM-Solver++(2M) 18 NFE) at batch 256 and
16,384. The other side is k-diffusion's ``sample_heun`` and ``sample_dpmpp_2m`` (0.1.1,
loaded from its installed ``sampling.py`` and ``utils.py`` without its package
``__init__``) on a torch module of identical architecture and FLOPs (:class:`TorchEDMMLP`:
the same Fourier embedding, layers, SiLU and ``c_skip, c_out, c_in, c_noise``) holding
scorelib's weights; before timing, both denoisers are checked to agree (max |D_jax -
D_torch| <= 1e-4 on the same inputs; typically 1e-6) and so are the two samplers' outputs
from the same start. Both sides draw their own start noise inside the timed call.

Reported, each side interleaved with the other (the minimum over ``--repeats``):

* time per sample of each sampler, scorelib and k-diffusion, and their ratio;
* one denoiser forward (scorelib: the jitted ``source.denoiser(x, t)`` with a scalar ``t``,
  what its samplers call; torch: the module under ``torch.no_grad``, ``sigma: [batch]``,
  what k-diffusion calls) and the ratio;
* the sampler's time per NFE over one forward, and its GFLOP/s: the network's matmul
  FLOPs (``2 m n k`` per matmul, the embedding's included, elementwise work not counted)
  times the NFE, over the time; as a fraction of the float32 matmul peak measured in the
  same run (a ``2048^3`` ``jnp`` matmul, and torch's).

``--parts train`` (default: both) times the training step beside a torch step of the
same network and loss: the library's step (``scorelib.training.make_train_step`` with
``EDMLoss``, ``make_optimizer``: Adam after global-norm clipping, and the EMA;
``benchmarks/train_timing.edm_train_step``) against ``torch.optim.Adam`` with
``clip_grad_norm_`` and an EMA (``torch._foreach_lerp_``), for the MLP above at batch 256
and for the main job's network (``configs/model/local_digits.yaml``: ``LocalMLP`` on the
8x8 digits, both parts evaluated for every example), batch 256. FLOPs of a step: each
matmul's forward ``2 m n k``, its weight gradient ``2 m n k`` and its input gradient
``2 m n k`` except where the input is not differentiated (the network's first layers), so
a bit under 3x the forward; XLA's own count (``cost_analysis``) is printed beside it.

References beside each fraction of the peak, each framework's against its own peak:
"forward alone" is the FLOP rate of the denoiser forward timed above (one call per
dispatch, the whole batch, XLA's default options), and "forward and backward alone" the
loss's value and gradients on fixed inputs (:func:`bare_grads`: no draws, clipping, Adam
or EMA). They are separate programs, not strict bounds: a sampler dispatches once for all
its steps and runs its network in CPU blocks under its own compiler option, so at small
batches it beats the forward alone.

Threads: torch runs ``torch.set_num_threads`` of the CPUs the process may use; XLA:CPU sizes
its pool the same way. Both are printed with the load (``os.getloadavg``) before and after
each part. On a machine other work shares, ``taskset -c 1 ... --cpu-time`` compares the two
on one core by process CPU time (what each side's work costs, whatever the load).

    make bench-install    # torch 2.13 CPU, torchdiffeq, torchsde; k-diffusion --no-deps
    .venv/bin/python benchmarks/vs_kdiffusion.py [--batches 256 16384] [--repeats 3]
        [--parts sample train] [--json out.json]
    taskset -c 1 .venv/bin/python benchmarks/vs_kdiffusion.py --cpu-time   # one core
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from omegaconf import OmegaConf
from train_timing import edm_train_step

from scorelib.data import get_batch, load_digits
from scorelib.nets import MLP, LocalMLP
from scorelib.processes import EDM
from scorelib.samplers import dpmpp_2m, edm_grid, heun
from scorelib.samplers.driver import CPU_CHUNK, cpu_compiler_options
from scorelib.scores import NetworkScore
from scorelib.training import init_state, make_optimizer

D, WIDTH, DEPTH, EMB, SIGMA_DATA, STEPS = 64, 256, 4, 64, 0.5, 18
MAIN_JOB_MODEL = Path(__file__).parents[1] / "configs" / "model" / "local_digits.yaml"
TOL = 1e-4  # max |D_jax - D_torch| on the same inputs (float32 sums in another order)


# ------------------------------------------------------------------------------ k-diffusion
def load_kdiffusion_sampling() -> types.ModuleType:
    """``k_diffusion.sampling`` from the installed package, without its ``__init__``.

    k-diffusion's ``__init__`` imports every submodule (models, augmentation, evaluation,
    wandb, accelerate, ...), which ``make bench-install`` leaves out. The package is
    registered as an empty module with the installed path, so that ``sampling.py`` and
    the ``utils.py`` it imports load alone. ``utils.py`` imports torchvision's
    ``transforms.functional`` (for image helpers the samplers do not use): where
    torchvision is not installed, an empty stand-in is registered while it loads.

    Raises:
      SystemExit: when k-diffusion is not installed (run ``make bench-install``).
    """
    spec = importlib.util.find_spec("k_diffusion")
    if spec is None:
        raise SystemExit("k-diffusion is not installed: run `make bench-install`")
    if "k_diffusion" not in sys.modules:
        sys.modules["k_diffusion"] = importlib.util.module_from_spec(spec)  # not executed
    stubs = []
    if importlib.util.find_spec("torchvision") is None:
        names = ["torchvision", "torchvision.transforms", "torchvision.transforms.functional"]
        for parent, name in zip([None, *names], names, strict=False):
            sys.modules[name] = types.ModuleType(name)
            if parent:
                setattr(sys.modules[parent], name.rsplit(".", 1)[1], sys.modules[name])
            stubs.append(name)
    try:
        return importlib.import_module("k_diffusion.sampling")
    finally:
        for name in stubs:
            del sys.modules[name]


class TorchEDMMLP(torch.nn.Module):
    """scorelib's ``MLP`` behind EDM preconditioning, in torch, as k-diffusion calls a model.

    ``forward(x, sigma) = c_skip x + c_out F(c_in x; ln(sigma) / 4)`` with ``x: [batch, d]``,
    ``sigma: [batch]`` (Karras et al. 2022, Table 1) and ``F`` the network of
    ``scorelib.nets.MLP`` (``norm='none'``, ``skip='none'``): Fourier embedding
    ``[cos(2 pi w c), sin(2 pi w c)]``, ``h = x_in(x) + emb_in(emb)``, ``depth`` layers
    ``h <- W SiLU(h)``, output ``out(SiLU(h))``. Same matmuls, same FLOPs.
    """

    def __init__(self, model: MLP, sigma_data: float):
        super().__init__()
        if getattr(model, "norms", None) is not None or getattr(model, "skip_scale", None):
            raise ValueError("TorchEDMMLP copies an MLP with norm='none' and skip='none'")
        if not hasattr(model.embed, "freqs"):
            raise ValueError("TorchEDMMLP copies an MLP with the Fourier embedding")
        self.sigma_data = sigma_data

        def linear(layer):
            k = np.asarray(layer.kernel[...])
            lin = torch.nn.Linear(*k.shape)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(k.T.copy()))
                lin.bias.copy_(torch.from_numpy(np.asarray(layer.bias[...]).copy()))
            return lin

        self.register_buffer("freqs", torch.from_numpy(np.asarray(model.embed.freqs[...]).copy()))
        self.emb_in, self.x_in = linear(model.emb_in), linear(model.x_in)
        self.hidden = torch.nn.ModuleList([linear(layer) for layer in model.hidden])
        self.out = linear(model.out)

    def net(self, x, c_noise):
        arg = (2 * math.pi) * c_noise[:, None] * self.freqs[None, :]
        h = self.x_in(x) + self.emb_in(torch.cat([torch.cos(arg), torch.sin(arg)], dim=-1))
        for layer in self.hidden:
            h = layer(torch.nn.functional.silu(h))
        return self.out(torch.nn.functional.silu(h))

    def forward(self, x, sigma):
        s = sigma[:, None]
        denom = s**2 + self.sigma_data**2
        c_skip = self.sigma_data**2 / denom
        c_out = s * self.sigma_data / denom.sqrt()
        c_in = 1 / denom.sqrt()
        return c_skip * x + c_out * self.net(c_in * x, 0.25 * torch.log(sigma))


def mlp_flops(d: int, width: int, depth: int, emb: int) -> int:
    """Forward matmul FLOPs of one example of ``MLP`` (``2 m n k`` per matmul)."""
    return 2 * (d * width + emb * width + depth * width * width + width * d)


# ---------------------------------------------------------------------------------- timing
def load() -> float:
    return os.getloadavg()[0]


CLOCK = time.perf_counter  # time.process_time with --cpu-time


def once(fn) -> float:
    t0 = CLOCK()
    fn()
    return CLOCK() - t0


def interleaved(fns: dict, repeats: int, inner: int = 1) -> dict:
    """``{name: min seconds of one call}``: every function once per round (warm-up round
    first, not timed), ``repeats`` rounds, each a block of ``inner`` calls."""
    for f in fns.values():
        f()
    best = {k: math.inf for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            best[k] = min(best[k], once(lambda f=f: [f() for _ in range(inner)]) / inner)
    return best


def matmul_peaks(repeats: int) -> tuple[float, float]:
    """GFLOP/s of a float32 ``2048 x 2048`` matmul in JAX and in torch (interleaved).

    JAX's is the better of XLA:CPU's default (YNNPACK) and of the option the library's
    sampler compiles with (``scorelib.samplers.driver.CPU_COMPILER_OPTIONS``: Eigen), so
    that a fraction of it is not flattered by the slower of the two."""
    n = 2048
    a = np.random.default_rng(0).normal(size=(n, n)).astype(np.float32)
    aj, at = jnp.asarray(a), torch.from_numpy(a)
    mm = jax.jit(lambda a: a @ a)
    mm_lib = jax.jit(lambda a: a @ a, compiler_options=cpu_compiler_options() or None)
    t = interleaved(
        {
            "jax": lambda: mm(aj).block_until_ready(),
            "jax-lib": lambda: mm_lib(aj).block_until_ready(),
            "torch": lambda: torch.mm(at, at),
        },
        repeats + 3,
    )
    return 2 * n**3 / min(t["jax"], t["jax-lib"]) / 1e9, 2 * n**3 / t["torch"] / 1e9


# -------------------------------------------------------------------------------- sampling
def bench_sample(model, batches, repeats, kd) -> list[dict]:
    g, params = nnx.split(model, nnx.Param)
    src = NetworkScore(process=EDM(), graphdef=g, params=params, sigma_data=SIGMA_DATA)
    tmodel = TorchEDMMLP(model, SIGMA_DATA).eval()
    grid = edm_grid(STEPS)
    fwd = jax.jit(lambda s, x, t: s.denoiser(x, t))
    rows = []
    for batch in batches:
        rows += sample_batch(src, tmodel, fwd, grid, batch, repeats, kd)
    return rows


def sample_batch(src, tmodel, fwd, grid, batch, repeats, kd) -> list[dict]:
    """The rows of one batch size (see :func:`bench_sample`)."""
    shape = (batch, D)
    sig_t = torch.tensor(grid, dtype=torch.float32)
    flops = mlp_flops(D, WIDTH, DEPTH, EMB)
    rows = []
    # the same function: the two denoisers, then the two samplers from one start
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    for sigma in (0.01, 1.0, 80.0):
        dj = np.asarray(fwd(src, jnp.asarray(x * sigma), jnp.float32(sigma)))
        with torch.no_grad():
            dt = tmodel(torch.from_numpy(x * sigma), torch.full((batch,), sigma)).numpy()
        err = float(np.abs(dj - dt).max())
        if not err <= TOL:
            raise SystemExit(f"denoisers differ at sigma {sigma}: max |dD| {err:.2e}")
    x_t = jnp.asarray(x * grid[0])
    agree = {}
    for name, jf, kf in [
        ("heun", heun, kd.sample_heun),
        ("dpmpp_2m", dpmpp_2m, kd.sample_dpmpp_2m),
    ]:
        xj = np.asarray(jf(src, jax.random.key(0), shape, grid=grid, x_T=x_t)[0])
        with torch.no_grad():
            xk = kf(tmodel, torch.from_numpy(np.array(x_t)), sig_t, disable=True).numpy()
        agree[name] = float(np.abs(xj - xk).max())
    # timing: scorelib draws x_T inside its call; k-diffusion's start is drawn in the call
    key = jax.random.key(0)

    def kdiff(f):
        def run():
            with torch.no_grad():
                return f(tmodel, torch.randn(shape) * sig_t[0], sig_t, disable=True)

        return run

    xj, cj = jnp.asarray(x), jnp.float32(1.0)
    xt_, ct = torch.from_numpy(x), torch.full((batch,), 1.0)

    def torch_fwd():
        with torch.no_grad():
            return tmodel(xt_, ct)

    small = batch <= 4096
    l0 = load()
    t_fwd = interleaved(
        {
            "jax": lambda: fwd(src, xj, cj).block_until_ready(),
            "torch": torch_fwd,
        },
        repeats + 2,
        inner=20 if small else 1,
    )
    t_s = interleaved(
        {
            "heun": lambda: heun(src, key, shape, grid=grid)[0].block_until_ready(),
            "k-heun": kdiff(kd.sample_heun),
            "dpmpp_2m": lambda: dpmpp_2m(src, key, shape, grid=grid)[0].block_until_ready(),
            "k-dpmpp_2m": kdiff(kd.sample_dpmpp_2m),
        },
        repeats,
        inner=3 if small else 1,
    )
    l1 = load()
    for name, nfe in [("heun", 2 * STEPS - 1), ("dpmpp_2m", STEPS)]:
        ts, tk = t_s[name], t_s["k-" + name]
        rows.append(
            dict(
                batch=batch,
                sampler=name,
                nfe=nfe,
                us_per_sample=ts / batch * 1e6,
                k_us_per_sample=tk / batch * 1e6,
                ratio=ts / tk,
                fwd_ms=t_fwd["jax"] * 1e3,
                k_fwd_ms=t_fwd["torch"] * 1e3,
                fwd_ratio=t_fwd["jax"] / t_fwd["torch"],
                per_nfe_over_fwd=ts / nfe / t_fwd["jax"],
                fwd_gflops=flops * batch / t_fwd["jax"] / 1e9,
                k_fwd_gflops=flops * batch / t_fwd["torch"] / 1e9,
                k_per_nfe_over_fwd=tk / nfe / t_fwd["torch"],
                gflops=flops * batch * nfe / ts / 1e9,
                k_gflops=flops * batch * nfe / tk / 1e9,
                max_abs_diff_samples=agree[name],
                load=(l0, l1),
            )
        )
        print(
            f"  batch {batch} {name}: scorelib {ts:.3f} s, k-diffusion {tk:.3f} s "
            f"(ratio {ts / tk:.3f}); forward {t_fwd['jax'] * 1e3:.3f} vs "
            f"{t_fwd['torch'] * 1e3:.3f} ms; samples agree to {agree[name]:.1e}; "
            f"load {l0:.1f}-{l1:.1f}",
            flush=True,
        )
    return rows


# -------------------------------------------------------------------------------- training
class TorchLocalMLP(torch.nn.Module):
    """scorelib's ``LocalMLP`` (``norm='none'``, ``skip='none'``, one channel) behind EDM
    preconditioning, in torch: the global MLP where ``c_noise >= c_local``, the per-pixel
    MLP of the ``(2 radius + 1)^2`` neighbourhood (zero-padded, ``di`` then ``dj``: the
    order of ``scorelib.nets.local.patches``) with its position table elsewhere; both parts
    evaluated for every example, as scorelib does."""

    def __init__(self, model: LocalMLP, sigma_data: float):
        super().__init__()
        self.sigma_data = sigma_data
        self.c_local, self.radius = model.c_local, model.local.radius
        self.glob = TorchEDMMLP(model.glob, sigma_data)
        self.loc = TorchEDMMLP(model.local, sigma_data)  # PatchMLP: the same layer names
        self.pos = torch.nn.Parameter(torch.from_numpy(np.asarray(model.local.pos[...]).copy()))

    def local(self, x, c_noise):
        """``x: [batch, H, W, 1]`` -> ``[batch, H, W, 1]``."""
        m, k = self.loc, 2 * self.radius + 1
        patches = torch.nn.functional.unfold(x.permute(0, 3, 1, 2), k, padding=self.radius)
        arg = (2 * math.pi) * c_noise[:, None] * m.freqs[None, :]
        emb = m.emb_in(torch.cat([torch.cos(arg), torch.sin(arg)], dim=-1))
        h = m.x_in(patches.transpose(1, 2)) + self.pos[None] + emb[:, None, :]
        for layer in m.hidden:
            h = layer(torch.nn.functional.silu(h))
        return m.out(torch.nn.functional.silu(h)).reshape(x.shape)

    def forward(self, x, sigma):
        sd, s = self.sigma_data, sigma.reshape(-1, 1, 1, 1)
        denom = s**2 + sd**2
        c_noise = 0.25 * torch.log(sigma)
        x_in = x / denom.sqrt()
        f_glob = self.glob.net(x_in.reshape(x.shape[0], -1), c_noise).reshape(x.shape)
        use_glob = (c_noise >= self.c_local).reshape(-1, 1, 1, 1)
        f = torch.where(use_glob, f_glob, self.local(x_in, c_noise))
        return sd**2 / denom * x + s * sd / denom.sqrt() * f


def step_flops(matmuls) -> int:
    """FLOPs of one train step: per matmul ``(m, k, n, input_differentiated)``, forward
    ``2 m k n``, weight gradient ``2 m k n``, input gradient ``2 m k n`` if differentiated."""
    return sum(2 * m * k * n * (3 if dx else 2) for m, k, n, dx in matmuls)


def mlp_matmuls(b, d, width, depth, emb):
    return (
        [(b, d, width, False), (b, emb, width, False)]
        + [(b, width, width, True)] * depth
        + [(b, width, d, True)]
    )


def local_mlp_matmuls(b, model: LocalMLP, hw: int, emb: int):
    loc = model.local
    lw = loc.x_in.kernel.shape[1]
    glob = mlp_matmuls(b, hw, model.glob.x_in.kernel.shape[1], len(model.glob.hidden), emb)
    return glob + (
        [(b, emb, lw, False), (b * hw, loc.x_in.kernel.shape[0], lw, False)]
        + [(b * hw, lw, lw, True)] * len(loc.hidden)
        + [(b * hw, lw, 1, True)]
    )


def xla_flops(jitted, *args) -> float:
    """XLA's FLOP count of the compiled function (``cost_analysis``), NaN if unavailable."""
    try:
        cost = jitted.lower(*args).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return float(cost.get("flops", math.nan))
    except Exception:  # noqa: BLE001 - only a cross-check
        return math.nan


def torch_train_step(tmodel, data, batch, p_mean=-1.2, p_std=1.2, ema_decay=0.999):
    """``step()``: one EDM step (Karras et al. 2022, eq. 8, the weight ``lambda(sigma)``
    and loss of ``scorelib.objectives.EDMLoss``, ``reduce='mean'``), global-norm clipping
    at 1, ``torch.optim.Adam`` (lr 1e-3) and an EMA of the parameters."""
    params = [p for p in tmodel.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    ema = [p.detach().clone() for p in params]
    sd = tmodel.sigma_data
    data = torch.from_numpy(np.asarray(data))
    view = (-1,) + (1,) * (data.ndim - 1)

    def step():
        x0 = data[torch.randint(len(data), (batch,))]
        sigma = torch.exp(p_mean + p_std * torch.randn(batch))
        s = sigma.reshape(view)
        d = tmodel(x0 + s * torch.randn_like(x0), sigma)
        weight = (sigma**2 + sd**2) / (sigma * sd) ** 2
        loss = (weight * ((d - x0) ** 2).flatten(1).mean(1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema, params, 1 - ema_decay)
        return loss

    return step


def check_same_denoiser(model, tmodel, x0) -> None:
    """Stop unless scorelib's and the torch module's EDM denoisers agree to ``TOL`` on
    ``x0`` noised at noise levels spread over 0.02 to 20 (both parts of a ``LocalMLP``)."""
    g, params = nnx.split(model, nnx.Param)
    src = NetworkScore(process=EDM(), graphdef=g, params=params, sigma_data=SIGMA_DATA)
    rng = np.random.default_rng(2)
    sigma = np.exp(rng.uniform(np.log(0.02), np.log(20.0), len(x0))).astype(np.float32)
    x = x0 + sigma.reshape((-1,) + (1,) * (x0.ndim - 1)) * rng.normal(size=x0.shape)
    x = x.astype(np.float32)
    dj = np.asarray(jax.jit(lambda s, x, t: s.denoiser(x, t))(src, x, sigma))
    with torch.no_grad():
        dt = tmodel(torch.from_numpy(x), torch.from_numpy(sigma)).numpy()
    err = float(np.abs(dj - dt).max())
    if not err <= TOL:
        raise SystemExit(f"denoisers differ: max |dD| {err:.2e} ({type(model).__name__})")


def bare_grads(model, tmodel, x0):
    """``(jax_fn, torch_fn)``: the EDM loss's value and parameter gradients on fixed inputs
    (``x0``, one draw of sigma and noise), without the batch draw, clipping, Adam or the
    EMA: the network's own forward and backward, the reference for a training step's
    FLOP rate (a separately compiled program, which returns the gradients)."""
    rng = np.random.default_rng(3)
    view = (-1,) + (1,) * (x0.ndim - 1)
    sigma = np.exp(-1.2 + 1.2 * rng.normal(size=len(x0))).astype(np.float32)
    x = (x0 + sigma.reshape(view) * rng.normal(size=x0.shape)).astype(np.float32)
    g, params = nnx.split(model, nnx.Param)
    sd = SIGMA_DATA

    def loss(params, x, sigma, x0):
        src = NetworkScore(process=EDM(), graphdef=g, params=params, sigma_data=sd)
        d = src.denoiser(x, sigma)
        weight = (sigma**2 + sd**2) / (sigma * sd) ** 2
        return jnp.mean(weight * jnp.mean(((d - x0) ** 2).reshape(len(x0), -1), axis=1))

    grad = jax.jit(jax.value_and_grad(loss))
    xj, sj, x0j = jnp.asarray(x), jnp.asarray(sigma), jnp.asarray(x0)
    xt, st, x0t = torch.from_numpy(x), torch.from_numpy(sigma), torch.from_numpy(x0)
    tparams = [q for q in tmodel.parameters() if q.requires_grad]

    def torch_grad():
        for q in tparams:
            q.grad = None
        d = tmodel(xt, st)
        weight = (st**2 + sd**2) / (st * sd) ** 2
        (weight * ((d - x0t) ** 2).flatten(1).mean(1)).mean().backward()

    return (lambda: jax.block_until_ready(grad(params, xj, sj, x0j))), torch_grad


def bench_train(name, model, data, batch, matmuls, steps, repeats, tmodel) -> dict:
    opt = make_optimizer(lr=1e-3, warmup_steps=200, grad_clip=1.0)
    graphdef, state = init_state(model, opt, seed=0)
    data_j = jnp.asarray(data)
    batch_fn = lambda i: get_batch(data_j, batch, seed=0, step=i)
    step = edm_train_step(graphdef, opt, batch_fn, batch, 0.999)
    xla = xla_flops(step, state)
    check_same_denoiser(model, tmodel, np.asarray(data[:batch]))
    tstep = torch_train_step(tmodel, data, batch)
    box = {"state": state}

    def jax_block():
        s = box["state"]
        for _ in range(steps):
            s, m = step(s)
        jax.block_until_ready(m["loss"])
        box["state"] = s

    def torch_block():
        for _ in range(steps):
            tstep()

    jax_bare, torch_bare = bare_grads(model, tmodel, np.asarray(data[:batch]))

    def bare(f):
        def block():
            for _ in range(steps):
                f()

        return block

    l0 = load()
    t = interleaved(
        {
            "jax": jax_block,
            "torch": torch_block,
            "jax-bare": bare(jax_bare),
            "torch-bare": bare(torch_bare),
        },
        repeats,
    )
    l1 = load()
    flops = step_flops(matmuls)
    row = dict(
        network=name,
        batch=batch,
        steps_per_s=steps / t["jax"],
        torch_steps_per_s=steps / t["torch"],
        ratio=t["jax"] / t["torch"],
        gflop_per_step=flops / 1e9,
        xla_gflop_per_step=xla / 1e9,
        gflops=flops * steps / t["jax"] / 1e9,
        torch_gflops=flops * steps / t["torch"] / 1e9,
        bare_gflops=flops * steps / t["jax-bare"] / 1e9,
        torch_bare_gflops=flops * steps / t["torch-bare"] / 1e9,
        load=(l0, l1),
    )
    print(
        f"  {name}: scorelib {row['steps_per_s']:.1f} steps/s, torch "
        f"{row['torch_steps_per_s']:.1f}; {flops / 1e9:.3f} GFLOP/step (XLA counts "
        f"{xla / 1e9:.3f}); forward and backward alone {row['bare_gflops']:.0f} and "
        f"{row['torch_bare_gflops']:.0f} GFLOP/s; load {l0:.1f}-{l1:.1f}",
        flush=True,
    )
    return row


def train_jobs(batch):
    """(name, scorelib model, data, matmul list, torch model) for the two networks."""
    mlp = MLP((D,), width=WIDTH, depth=DEPTH, rngs=nnx.Rngs(0))
    data = np.random.default_rng(0).normal(0, SIGMA_DATA, (10_000, D)).astype(np.float32)
    digits = load_digits().train
    shape = digits.shape[1:]
    cfg = OmegaConf.to_container(OmegaConf.load(MAIN_JOB_MODEL))
    cfg = {k: v for k, v in cfg.items() if k != "defaults"}
    local = LocalMLP(shape, **cfg, rngs=nnx.Rngs(0))
    hw = shape[0] * shape[1]
    # non-zero output layers (the same cost), so that the torch copies are checked on the
    # network's output too (check_same_denoiser), not only on the preconditioning
    for out in (mlp.out, local.glob.out, local.local.out):
        out.kernel.value = 0.01 * jax.random.normal(jax.random.key(1), out.kernel.shape)
    return [
        (
            f"MLP {DEPTH}x{WIDTH}, d={D}",
            mlp,
            data,
            mlp_matmuls(batch, D, WIDTH, DEPTH, EMB),
            TorchEDMMLP(mlp, SIGMA_DATA),
        ),
        (
            "main job LocalMLP (digits_edm), 8x8x1",
            local,
            digits,
            local_mlp_matmuls(batch, local, hw, EMB),
            TorchLocalMLP(local, SIGMA_DATA),
        ),
    ]


# ------------------------------------------------------------------------------------ main
def header() -> dict:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        rev = "?"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return dict(
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        clock="process CPU time" if CLOCK is time.process_time else "wall",
        revision=rev,
        cpu=f"{cpu}, {os.cpu_count()} CPUs, affinity {sorted(os.sched_getaffinity(0))}",
        jax=f"jax {jax.__version__} ({jax.default_backend()}, {jax.device_count()} device)",
        torch=f"torch {torch.__version__}, {torch.get_num_threads()} threads "
        f"(interop {torch.get_num_interop_threads()})",
        env={k: os.environ.get(k) for k in ("XLA_FLAGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        sampler=f"CPU blocks of {CPU_CHUNK}, compiler options {cpu_compiler_options()}",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 16384])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", nargs="+", default=["sample", "train"], choices=["sample", "train"])
    ap.add_argument("--train-batch", type=int, default=256)
    ap.add_argument("--train-steps", type=int, default=20, help="steps per timed block")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by process CPU time (with `taskset -c 1`: one core, robust to other load)",
    )
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    info = header()
    print("# " + "; ".join(f"{k}: {v}" for k, v in info.items()), flush=True)
    peaks = [matmul_peaks(args.repeats)]
    print(
        f"  matmul peak: jax {peaks[0][0]:.0f}, torch {peaks[0][1]:.0f} GFLOP/s, load {load():.1f}"
    )
    out = dict(info=info)
    if "sample" in args.parts:
        model = MLP((D,), width=WIDTH, depth=DEPTH, rngs=nnx.Rngs(0))
        # a non-zero last layer, so that the network's output is not trivially zero
        model.out.kernel.value = 0.01 * jax.random.normal(jax.random.key(1), model.out.kernel.shape)
        out["sample"] = bench_sample(model, args.batches, args.repeats, load_kdiffusion_sampling())
    if "train" in args.parts:
        out["train"] = [
            bench_train(name, m, data, args.train_batch, mm, args.train_steps, args.repeats, tm)
            for name, m, data, mm, tm in train_jobs(args.train_batch)
        ]
    peaks.append(matmul_peaks(args.repeats))
    pj, pt = max(p[0] for p in peaks), max(p[1] for p in peaks)
    out["peaks"] = peaks
    print(
        f"\nfloat32 matmul peak (2048^3, best of the run's start and end): jax {pj:.0f}, "
        f"torch {pt:.0f} GFLOP/s (start {peaks[0][0]:.0f}/{peaks[0][1]:.0f}, end "
        f"{peaks[1][0]:.0f}/{peaks[1][1]:.0f}); load now {load():.1f}\n"
    )
    if "sample" in out:
        print(
            "| batch | sampler | NFE | us/sample scorelib | us/sample k-diffusion | ratio | "
            "forward ms scorelib / torch (ratio) | per NFE / forward: scorelib, k-diffusion | "
            "GFLOP/s scorelib, k-diffusion | of peak: jax, torch | "
            "forward alone, of peak: jax, torch | load |"
        )
        print("|---:|---|---:|---:|---:|---:|---|---|---|---|---|---|")
        for r in out["sample"]:
            print(
                f"| {r['batch']} | {r['sampler']} | {r['nfe']} | {r['us_per_sample']:.2f} | "
                f"{r['k_us_per_sample']:.2f} | **{r['ratio']:.3f}** | {r['fwd_ms']:.3f} / "
                f"{r['k_fwd_ms']:.3f} ({r['fwd_ratio']:.3f}) | {r['per_nfe_over_fwd']:.3f}, "
                f"{r['k_per_nfe_over_fwd']:.3f} | {r['gflops']:.0f}, {r['k_gflops']:.0f} | "
                f"{r['gflops'] / pj:.2f}, {r['gflops'] / pt:.2f} | "
                f"{r['fwd_gflops'] / pj:.2f}, {r['k_fwd_gflops'] / pt:.2f} | "
                f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |"
            )
    if "train" in out:
        print(
            "\n| network | batch | steps/s scorelib | steps/s torch | time ratio | "
            "GFLOP/step (XLA's count) | GFLOP/s scorelib, torch | of peak: jax, torch | "
            "forward and backward alone, of peak: jax, torch | load |"
        )
        print("|---|---:|---:|---:|---:|---|---|---|---|---|")
        for r in out["train"]:
            print(
                f"| {r['network']} | {r['batch']} | {r['steps_per_s']:.1f} | "
                f"{r['torch_steps_per_s']:.1f} | **{r['ratio']:.3f}** | "
                f"{r['gflop_per_step']:.3f} ({r['xla_gflop_per_step']:.3f}) | "
                f"{r['gflops']:.0f}, {r['torch_gflops']:.0f} | {r['gflops'] / pj:.2f}, "
                f"{r['gflops'] / pt:.2f} | "
                f"{r['bare_gflops'] / pj:.2f}, {r['torch_bare_gflops'] / pt:.2f} | "
                f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
