"""Table ``tsm_low_noise``: target score matching against DSM at low noise.

De Bortoli, Hutchinson, Wirnsberger, Doucet, "Target score matching", arXiv 2402.08667
(2024). ``python -m experiments.reproduce table=tsm_low_noise [table.scale=smoke]``

For each target with a known score (a 1-D Gaussian mixture, random full-covariance
mixtures in d = 10 and 50, many-well in d = 8; ``scorelib.data.targets``) under the
VE-frame process of ``table.process`` (EDM, ``sigma`` in [1e-3, 10]):

(a) the conditional variance ``E ||u - s_t(x_t)||^2`` of the DSM label ``-eps/sigma``, the
    TSM label ``grad log p_0(x_0)/alpha`` and each mixed label, per sigma of
    ``table.sigmas`` (:func:`scorelib.metrics.label_variance`, exact noisy score);
(b) the relative error ``sum||s_theta - s_true||^2 / sum||s_true||^2`` of the score learned
    by each objective, per sigma (:func:`scorelib.metrics.relative_score_error`), after the
    *same* budget (:func:`scorelib.training.train_seeds`: steps, batch, network,
    optimizer, EMA, data stream), mean and std over ``table.seeds``;
(c) the squared energy distance and sliced W2 (:func:`scorelib.metrics.sample_distances`)
    between samples of each trained model (same sampler, same grid, exact start
    ``x_T ~ p_T``) and fresh exact target samples, with two references: the exact noisy
    score through the same sampler, and a second exact sample.

Expected shape (the paper shows figures, not numbers; from secondary summaries): TSM far
better than DSM at low sigma, worse at high sigma, the mixtures best or tied everywhere.
The last part comes from those summaries, not from the paper. The table reports what it
measures; its verdicts compare a mixture with DSM and TSM behind one network only: behind
EDM's preconditioning with each objective's own weight (DSM sigma^2, TSM and ``switch_edm``
alpha^2), and behind the Fisher-scaled preconditioning with one weight for every objective
(``dsm_fisher``, ``tsm_fisher`` and the mixtures), the setting in which only the label
differs; and across both networks, each objective in its own recipe; controls
(``tsm_sigma2``) are left out. ``table.budgets`` gives a target a larger
network or more steps (the 50-D mixture, underfitted at the common budget).

Seeds vary the network initialisation and the objective's (t, eps) draws; the data stream
(exact target samples) is common to all runs of a target, and every objective of one seed
starts from the same initialisation and sees the same (t, eps) (common random numbers).
Every noise draw is per example (``scorelib.keys``).

Results per target are cached in ``<run dir>/partial/<target>.json`` with the settings
they were computed with: re-running the same command reuses finished targets.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from experiments.runs.layout import pyplot, save_figure
from experiments.tables.common import check_seeds, pm, scaled
from scorelib._checks import check_int, check_real
from scorelib._io import atomic_write_text
from scorelib.data.targets import make_target
from scorelib.metrics import label_variance, noisy_samples, relative_score_error, sample_distances
from scorelib.nets import MLP
from scorelib.objectives import MixedScoreMatching
from scorelib.samplers import edm_grid, get_sampler
from scorelib.training import EMA, init_state, make_optimizer, network_source, train_seeds, unstack

LABELS = {"dsm": "DSM", "tsm": "TSM"}
#: The network behind each objective: ``edm`` (EDM's preconditioning, ``NetworkScore``) or
#: ``fisher`` (``scorelib.nets.precond.fisher_precond``, ``NetworkScore(sigma_fisher=...)``
#: with the target's ``fisher_scale()``).
PRECONDS = ("edm", "fisher")
#: How the verdict columns name the objectives behind each network.
NETWORKS = {
    "edm": "EDM network, each objective's own weight",
    "fisher": "Fisher-scaled network, one weight for all",
    None: "any network, each objective's own recipe",
}
#: The verdict columns: behind each network, then across both.
VERDICTS = (*PRECONDS, None)


# ------------------------------------------------------------------------------ settings
def _settings(cfg: DictConfig) -> DictConfig:
    """The table config, ``smoke`` merged when ``scale == smoke``, validated.

    Raises:
      ValueError: naming the field (``table.scale``, ``table.run_targets``, ``table.sigmas``,
        ``table.seeds``, ...).
    """
    tc = scaled(cfg)
    check_seeds(tc.seeds)
    for name in tc.run_targets:
        if name not in tc.targets:
            raise ValueError(
                f"table.run_targets: {name!r} has no entry under table.targets "
                f"(have {list(tc.targets)})"
            )
    sig = [float(s) for s in tc.sigmas]
    if not sig or any(not (s > 0 and math.isfinite(s)) for s in sig) or sig != sorted(set(sig)):
        raise ValueError(f"table.sigmas must be increasing positive numbers; got {list(tc.sigmas)}")
    for f in ("steps", "batch_size"):
        if int(tc.train[f]) < 1:
            raise ValueError(f"table.train.{f} must be >= 1; got {tc.train[f]}")
    for f in ("variance", "error", "samples"):
        if int(tc[f].n) < 2:
            raise ValueError(f"table.{f}.n must be >= 2; got {tc[f].n}")
    if not 0 < float(tc.train.ema_halflife_frac) <= 1:
        raise ValueError(
            f"table.train.ema_halflife_frac must be in (0, 1]; got {tc.train.ema_halflife_frac}"
        )
    if len(tc.objectives) < 1:
        raise ValueError("table.objectives must name at least one objective")
    for name, spec in tc.objectives.items():
        pre = spec.get("precond", "edm")
        if pre not in PRECONDS:
            raise ValueError(
                f"table.objectives.{name}.precond must be one of {list(PRECONDS)}; got {pre!r}"
            )
    for name, spec in tc.objectives.items():
        v = spec.get("kappa_sigma_d")
        if v is not None and v != "fisher":
            check_real(
                v,
                f"table.objectives.{name}.kappa_sigma_d (> 0, fisher or null)",
                low=0.0,
                low_open=True,
            )
    for name, budget in (tc.get("budgets") or {}).items():
        if name not in tc.targets:
            raise ValueError(
                f"table.budgets: {name!r} has no entry under table.targets "
                f"(have {list(tc.targets)})"
            )
        extra = sorted(set(budget) - {"model", "train"})
        if extra:
            raise ValueError(f"table.budgets.{name} may set model and train only; got {extra}")
        for part, fields in (
            ("train", ("steps", "batch_size")),
            ("model", ("width", "depth", "emb_dim")),
        ):
            for f, v in (budget.get(part) or {}).items():
                if f in fields:
                    check_int(v, f"table.budgets.{name}.{part}.{f}", low=1)
    for name in tc.get("controls") or []:
        if name not in tc.objectives:
            raise ValueError(
                f"table.controls: {name!r} has no entry under table.objectives "
                f"(have {list(tc.objectives)})"
            )
    return tc


def _process(tc):
    p = instantiate(tc.process)
    lo, hi = float(p.ve_sigma(p.t_min)), float(p.ve_sigma(p.t_max))
    for s in tc.sigmas:
        if not lo * (1 - 1e-5) <= float(s) <= hi * (1 + 1e-5):
            raise ValueError(
                f"table.sigmas: {s} is outside the VE-frame range [{lo:.4g}, {hi:.4g}] "
                "of table.process"
            )
    return p


def _precond(tc, name: str) -> str:
    """``'edm'`` or ``'fisher'``: the network behind objective ``name`` (default ``edm``)."""
    return str(tc.objectives[name].get("precond", "edm"))


def _objectives(tc, process, target, sigma_fisher: float) -> dict:
    """``{name: MixedScoreMatching}``; ``sigma_fisher`` (the target's Fisher length scale)
    is passed to the objectives weighted ``fisher`` that do not set their own."""
    out = {}
    for name, spec in tc.objectives.items():
        kw = {"t_sampling": str(tc.train.t_sampling), "weighting": str(tc.train.weighting)}
        kw.update(OmegaConf.to_container(spec, resolve=True))  # an objective may set its own
        kw.pop("precond", None)  # the network's, not the objective's
        if kw["weighting"] == "fisher" and kw.get("sigma_fisher") is None:
            kw["sigma_fisher"] = sigma_fisher
        if kw.get("kappa_sigma_d") == "fisher":  # the modes' scale of this target
            kw["kappa_sigma_d"] = sigma_fisher
        out[name] = MixedScoreMatching(process, target, **kw)
    return out


def _role(tc, name: str) -> str:
    """``'control'`` (listed in ``table.controls``), ``'pure'`` (kappa dsm or tsm) or
    ``'mixture'``: how the error table's verdict column treats objective ``name``."""
    if name in (tc.get("controls") or []):
        return "control"
    return "pure" if str(tc.objectives[name].get("kappa")) in ("dsm", "tsm") else "mixture"


def _sources(tc, process, graphdef, sigma_data: float, sigma_fisher: float) -> dict:
    """``{objective: make_source}``: each objective's network (:data:`PRECONDS`)."""
    by = {
        "edm": network_source(process, graphdef, sigma_data),
        "fisher": network_source(process, graphdef, sigma_data, sigma_fisher=sigma_fisher),
    }
    return {name: by[_precond(tc, name)] for name in tc.objectives}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------ (a) variances
def _sigma_keys(seed: int, j: int):
    """``(data key, noise key)`` of the ``j``-th sigma: a fresh exact sample per sigma."""
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), j))


def label_variances(objectives: dict, target, process, sigmas, n: int, seed: int) -> dict:
    """``{objective | "DSM label" | "TSM label": {"mean": [S], "se": [S]}}`` by
    :func:`scorelib.metrics.label_variance`, ``n`` exact samples per sigma."""
    truth = target.noisy_score(process)
    res: dict[str, dict[str, list]] = {}
    for j, s in enumerate(sigmas):
        kx, ke = _sigma_keys(seed, j)
        x0 = target.sample(kx, n, needed_by="label variance")
        per, pure = label_variance(objectives, truth, x0, process.t_of_ve_sigma(s), ke)
        per.update({"DSM label": pure["u_dsm"], "TSM label": pure["u_tsm"]})
        for k, v in per.items():
            d = res.setdefault(k, {"mean": [], "se": []})
            d["mean"].append(v["mean"])
            d["se"].append(v["se"])
    return res


# ------------------------------------------------------------------------- (b) training
def train_models(
    objectives: dict, target, process, tc, sigma_fisher: float, log=print
) -> tuple[Any, dict, dict]:
    """One network per (objective, seed), same budget, by :func:`scorelib.training.train_seeds`
    (one call per preconditioning of :data:`PRECONDS`; every objective starts from the
    same initial states and reads the same data stream).

    Returns ``(graphdef, {objective: EMA params stacked over seeds}, info)``.
    """
    seeds = [int(s) for s in tc.seeds]
    tr, mc = tc.train, tc.model
    batch, steps = int(tr.batch_size), int(tr.steps)
    opt = make_optimizer(float(tr.lr), int(tr.warmup_steps), float(tr.grad_clip))
    ema = EMA(
        batch_size=batch,
        halflife_nimg=float(tr.ema_halflife_frac) * steps * batch,
        rampup_ratio=float(tr.ema_halflife_frac),
    )
    states = []
    for seed in seeds:
        model = MLP(
            (target.dim,),
            width=int(mc.width),
            depth=int(mc.depth),
            emb_dim=int(mc.emb_dim),
            embedding=str(mc.embedding),
            rngs=nnx.Rngs(seed),
        )
        graphdef, state = init_state(model, opt, seed)
        states.append(state)
    n_params = sum(np.size(x) for x in jax.tree.leaves(states[0].params))

    def on_log(done, losses):
        msg = ", ".join(f"{k} {np.mean(v):.3g}" for k, v in losses.items())
        log(f"  [{target.name}] step {done}/{steps}: loss {msg}")

    sources = _sources(tc, process, graphdef, float(target.sigma_data), sigma_fisher)
    final, info = {}, {"compile_s": 0.0, "train_s": 0.0}
    for pre in PRECONDS:
        group = {k: v for k, v in objectives.items() if _precond(tc, k) == pre}
        if not group:
            continue
        done, part = train_seeds(
            group,
            sources[next(iter(group))],
            opt,
            ema,
            lambda i: target.batch(batch, seed=0, step=i, needed_by="training"),
            states,
            steps,
            log_every=int(tr.log_every),
            on_log=on_log,
        )
        final.update(done)
        info["compile_s"] += part["compile_s"]
        info["train_s"] += part["train_s"]
    final = {k: final[k] for k in objectives}  # the config's order
    info["steps_per_s"] = (steps - 1) / max(info["train_s"], 1e-9)
    info.update(
        n_params=int(n_params),
        sigma_data=float(target.sigma_data),
        skipped_steps={k: [int(v) for v in np.asarray(st.n_skipped)] for k, st in final.items()},
    )
    return graphdef, {k: st.ema_params for k, st in final.items()}, info


def score_errors(sources: dict, params: dict, target, process, sigmas, n: int, seed: int) -> dict:
    """``{objective: [n_seeds, S]}`` relative errors by
    :func:`scorelib.metrics.relative_score_error`, ``n`` exact samples per sigma
    (``sources``: each objective's ``make_source``, :func:`_sources`)."""
    truth = target.noisy_score(process)
    out: dict[str, list] = {k: [] for k in params}
    for j, s in enumerate(sigmas):
        kx, ke = _sigma_keys(seed, j)
        x0 = target.sample(kx, n, needed_by="score error")
        t = process.t_of_ve_sigma(s)
        for k, p in params.items():
            err = relative_score_error(sources[k](p, None), truth, x0, t, ke, stacked=True)
            out[k].append(err.tolist())
    return {k: [list(row) for row in zip(*v, strict=True)] for k, v in out.items()}  # [seeds, S]


# --------------------------------------------------------------------------- (c) samples
def sample_quality(sources: dict, params: dict, target, process, tc, log=print) -> dict:
    """Energy distance (squared) and sliced W2 to fresh exact samples
    (:func:`scorelib.metrics.sample_distances`).

    Returns ``{row: {"energy": [per seed], "sw2": [per seed]}}`` for every objective, the
    exact noisy score through the same sampler, and a second exact sample.
    """
    sc = tc.samples
    n = int(sc.n)
    sampler = get_sampler(str(sc.sampler))
    s_max = float(process.ve_sigma(process.t_max))
    s_min = float(process.ve_sigma(process.t_min))
    grid = edm_grid(int(sc.steps), s_min, s_max, float(sc.rho))
    truth = target.noisy_score(process)
    per_seed = {k: unstack(v) for k, v in params.items()}

    def exact(seed, stream):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(10_000 + seed), stream), 0)
        return target.sample(key, n, needed_by="sample quality (c)")

    rows: dict[str, dict[str, list]] = {}

    def add(row, x, ref, seed):
        for m, v in sample_distances(
            x, ref, n_projections=int(sc.sw_projections), seed=seed
        ).items():
            rows.setdefault(row, {"energy": [], "sw2": []})[m].append(v)

    for i, seed in enumerate(int(s) for s in tc.seeds):
        ref = exact(seed, 0)
        # an exact draw from p_T: x0 exact (stream 2), noised with per-example keys
        x_T = noisy_samples(process, exact(seed, 2), process.t_max, jax.random.key(20_000 + seed))
        key = jax.random.key(30_000 + seed)
        for k in params:
            x, _ = sampler(
                sources[k](per_seed[k][i], None), key, (n, target.dim), grid=grid, x_T=x_T
            )
            add(k, x, ref, seed)
        x, _ = sampler(truth, key, (n, target.dim), grid=grid, x_T=x_T)
        add("exact score", x, ref, seed)
        add("exact samples", exact(seed, 1), ref, seed)
    return rows


# --------------------------------------------------------------------------- per target
def budgeted(tc: DictConfig, name: str) -> DictConfig:
    """The table config with target ``name``'s ``table.budgets`` entry (``model`` and
    ``train`` fields) merged over ``table.model`` and ``table.train``."""
    budget = (tc.get("budgets") or {}).get(name)
    if not budget:
        return tc
    return OmegaConf.merge(tc, {k: budget[k] for k in ("model", "train") if k in budget})


def run_target(name: str, tc: DictConfig, run_dir: Path, log=print) -> dict:
    """Parts (a), (b), (c) for one target, or the cached result computed with the same
    settings (``<run_dir>/partial/<name>.json``)."""
    tc = budgeted(tc, name)
    spec = dict(OmegaConf.to_container(tc.targets[name], resolve=True))
    settings = {
        k: OmegaConf.to_container(tc[k], resolve=True)
        for k in (
            "seeds",
            "sigmas",
            "process",
            "objectives",
            "train",
            "model",
            "variance",
            "error",
            "samples",
        )
    }
    settings["target"] = spec
    settings["controls"] = list(tc.get("controls") or [])
    digest = _digest(settings)
    cache = run_dir / "partial" / f"{name}.json"
    if cache.is_file():
        try:
            old = json.loads(cache.read_text())
            if old.get("digest") == digest:
                log(f"[{name}] reusing {cache}")
                return {**old, "reused": True}
        except (OSError, ValueError):
            pass

    kind = spec.pop("kind")
    target = make_target(kind, **spec)
    target.require_samples(f"table tsm_low_noise (target {name})")
    process = _process(tc)
    cpu0, t0 = time.process_time(), time.perf_counter()
    sigma_fisher = target.fisher_scale()  # Monte Carlo, fixed key
    objectives = _objectives(tc, process, target, sigma_fisher)
    sigmas = [float(s) for s in tc.sigmas]
    timings = {}

    log(
        f"[{name}] d = {target.dim}, sigma_data = {target.sigma_data:.4g}, sigma_fisher = "
        f"{sigma_fisher:.4g}: (a) label variances"
    )
    var = label_variances(objectives, target, process, sigmas, int(tc.variance.n), seed=1)
    timings["variance_s"] = time.perf_counter() - t0

    log(f"[{name}] (b) training {len(objectives)} objectives x {len(tc.seeds)} seeds")
    t1 = time.perf_counter()
    graphdef, params, info = train_models(objectives, target, process, tc, sigma_fisher, log=log)
    timings["train_total_s"] = time.perf_counter() - t1
    timings.update({k: info[k] for k in ("compile_s", "train_s", "steps_per_s")})
    sources = _sources(tc, process, graphdef, info["sigma_data"], sigma_fisher)

    t1 = time.perf_counter()
    err = score_errors(sources, params, target, process, sigmas, int(tc.error.n), seed=2)
    timings["error_s"] = time.perf_counter() - t1

    log(f"[{name}] (c) sampling ({tc.samples.sampler}, {tc.samples.steps} steps)")
    t1 = time.perf_counter()
    samp = sample_quality(sources, params, target, process, tc, log=log)
    timings["samples_s"] = time.perf_counter() - t1
    timings["total_s"] = time.perf_counter() - t0
    timings["cpu_s"] = time.process_time() - cpu0

    out = {
        "digest": digest,
        "target": name,
        "dim": int(target.dim),
        "sigma_data": float(target.sigma_data),
        "sigma_fisher": float(sigma_fisher),
        "sigmas": sigmas,
        "objectives": list(objectives),
        "precond": {k: _precond(tc, k) for k in objectives},
        "roles": {k: _role(tc, k) for k in objectives},
        "variance": var,
        "error": err,
        "samples": samp,
        "model": {"n_params": info["n_params"], "skipped_steps": info["skipped_steps"]},
        "budget": {
            "model": OmegaConf.to_container(tc.model, resolve=True),
            "train": {k: int(tc.train[k]) for k in ("steps", "batch_size")},
        },
        "timings": timings,
    }
    atomic_write_text(cache, json.dumps(out, indent=1))
    log(f"[{name}] done in {timings['total_s']:.0f} s (cpu {timings['cpu_s']:.0f} s)")
    return out


# ---------------------------------------------------------------------------- reporting
def _col(k: str) -> str:
    return LABELS.get(k, k)


def _expected(s: float, low: str, high: str, between: str = "") -> str:
    """The paper's expected shape at noise level ``s``: ``low`` at low noise (``s <= 1e-2``),
    ``high`` at high noise (``s >= 3``), ``between`` otherwise."""
    if s <= 1e-2:
        return low
    if s >= 3.0:
        return high
    return between


def _claim_variance(s: float) -> str:
    return _expected(s, "TSM ≪ DSM; DSM ~ d/σ²", "DSM < TSM")


def _claim_error(s: float) -> str:
    tied = "mixture best or tied"
    return _expected(s, f"TSM ≪ DSM; {tied}", f"DSM < TSM; {tied}", tied)


def variance_table(results: dict) -> tuple[list, list]:
    """Table (a): label variance per target and sigma beside ``d / sigma^2``."""
    objs = results[next(iter(results))]["objectives"]
    cols = ["target", "d", "sigma", "d/sigma^2", "DSM label", "TSM label"]
    mixed = [k for k in objs if k not in ("dsm", "tsm")]
    cols += [f"{k} label" for k in mixed] + ["paper (expected shape)"]
    rows = []
    for name, r in results.items():
        for j, s in enumerate(r["sigmas"]):
            v = r["variance"]
            rows.append(
                [
                    name,
                    r["dim"],
                    s,
                    r["dim"] / s**2,
                    v["DSM label"]["mean"][j],
                    v["TSM label"]["mean"][j],
                ]
                + [v[k]["mean"][j] for k in mixed]
                + [_claim_variance(s)]
            )
    return cols, rows


def _roles(r: dict) -> dict:
    """Each objective's role (:func:`_role`) as recorded in a target's result."""
    default = {k: "pure" if k in LABELS else "mixture" for k in r["objectives"]}
    return r.get("roles") or default


def mixture_verdict(r: dict, j: int, network: str | None = None) -> tuple[str, str] | None:
    """At the ``j``-th sigma of target result ``r``: ``(text, verdict)`` comparing the
    mixture with the lowest mean error against the pure objective (DSM or TSM) with the
    lowest mean, controls left out, among the objectives behind ``network`` (one of
    :data:`PRECONDS`; ``None``: all); ``verdict`` is ``'tied'`` when the means differ by no
    more than ``sqrt(sd_mix^2 + sd_pure^2)`` (std over seeds), else ``'mixture best'`` or
    ``'<pure> best'``. ``None`` without both kinds."""
    roles = _roles(r)
    pre = r.get("precond") or {}
    keep = [k for k in r["objectives"] if network is None or pre.get(k, "edm") == network]
    err = {k: np.asarray(r["error"][k])[:, j] for k in keep}
    mix = [k for k in err if roles[k] == "mixture"]
    pure = [k for k in err if roles[k] == "pure"]
    if not mix or not pure:
        return None
    m = min(mix, key=lambda k: float(np.mean(err[k])))
    p = min(pure, key=lambda k: float(np.mean(err[k])))
    mm, mp = float(np.mean(err[m])), float(np.mean(err[p]))
    noise = math.hypot(float(np.std(err[m])), float(np.std(err[p])))
    if abs(mm - mp) <= noise:
        verdict = "tied"
    else:
        verdict = "mixture best" if mm < mp else f"{_col(p)} best"
    return f"{_col(m)} {mm:.3g} vs {_col(p)} {mp:.3g}: {verdict} (x{mm / mp:.3g})", verdict


def error_table(results: dict) -> tuple[list, list]:
    """Table (b): relative score error per target, sigma and objective (mean ± std), the
    lowest mean, and the best mixture against the best pure objective
    (:func:`mixture_verdict`)."""
    objs = results[next(iter(results))]["objectives"]
    cols = (
        ["target", "sigma"]
        + [_col(k) for k in objs]
        + ["best (lowest mean)"]
        + [f"best mixture vs best of DSM/TSM, {NETWORKS[n]}" for n in VERDICTS]
        + ["paper (expected shape)"]
    )
    rows = []
    for name, r in results.items():
        for j, s in enumerate(r["sigmas"]):
            means = {k: float(np.mean(np.asarray(r["error"][k])[:, j])) for k in objs}
            stds = {k: float(np.std(np.asarray(r["error"][k])[:, j])) for k in objs}
            best = min(means, key=lambda k: means[k] if math.isfinite(means[k]) else math.inf)
            vs = [mixture_verdict(r, j, n) for n in VERDICTS]
            rows.append(
                [name, s]
                + [pm(means[k], stds[k]) for k in objs]
                + [_col(best), *(v[0] if v else "" for v in vs), _claim_error(s)]
            )
    return cols, rows


def samples_table(results: dict) -> tuple[list, list]:
    """Table (c): energy distance and sliced W2 per target and model (mean ± std)."""
    cols = ["target", "model", "energy distance^2", "sliced W2", "paper"]
    rows = []
    for name, r in results.items():
        for k, v in r["samples"].items():
            ref = k in ("exact score", "exact samples")
            label = f"{k} (reference)" if ref else _col(k)
            rows.append(
                [
                    name,
                    label,
                    pm(np.mean(v["energy"]), np.std(v["energy"])),
                    pm(np.mean(v["sw2"]), np.std(v["sw2"])),
                    "",
                ]
            )
    return cols, rows


def summary_table(results: dict) -> tuple[list, list]:
    """Per target: at how many sigmas each objective is best, its mean log10 error, and at
    how many sigmas the best mixture is best or tied (:func:`mixture_verdict`)."""
    objs = results[next(iter(results))]["objectives"]
    cols = (
        ["target"]
        + [f"{_col(k)}: #best / mean log10 err" for k in objs]
        + [f"sigmas where a mixture is best or tied, {NETWORKS[n]}" for n in VERDICTS]
    )
    rows = []
    for name, r in results.items():
        e = {k: np.mean(np.asarray(r["error"][k]), axis=0) for k in objs}  # [S]
        best = np.argmin(np.stack([e[k] for k in objs]), axis=0)
        counts = []
        for n in VERDICTS:
            verdicts = [mixture_verdict(r, j, n) for j in range(len(r["sigmas"]))]
            if not any(verdicts):
                counts.append("")
                continue
            ok = [
                s
                for s, v in zip(r["sigmas"], verdicts, strict=True)
                if v and v[1] in ("mixture best", "tied")
            ]
            missed = ", ".join(f"{s:g}" for s in r["sigmas"] if s not in ok)
            where = f" (not at sigma {missed})" if missed else " (all)"
            counts.append(f"{len(ok)} / {len(r['sigmas'])}{where}")
        rows.append(
            [name]
            + [
                f"{int(np.sum(best == i))} / {float(np.mean(np.log10(e[k]))):.2f}"
                for i, k in enumerate(objs)
            ]
            + counts
        )
    return cols, rows


def make_figure(results: dict, path: Path) -> None:
    """Label variance, score error and energy distance, one column per target, as PNG."""
    plt = pyplot()

    names = list(results)
    fig, axes = plt.subplots(3, len(names), figsize=(4.6 * len(names), 11.5), squeeze=False)
    for j, name in enumerate(names):
        r = results[name]
        sig = np.asarray(r["sigmas"])
        ax = axes[0, j]
        v = r["variance"]
        ax.plot(sig, r["dim"] / sig**2, "k:", lw=1, label="d/σ²")
        ax.plot(sig, v["DSM label"]["mean"], "o-", label="DSM")
        ax.plot(sig, v["TSM label"]["mean"], "s-", label="TSM")
        for k in r["objectives"]:
            if k not in ("dsm", "tsm"):
                ax.plot(sig, v[k]["mean"], ".--", label=k)
        ax.set(xscale="log", yscale="log", xlabel="σ", title=f"{name}: label variance E||u - s||²")
        ax.legend(fontsize=7)
        ax = axes[1, j]
        for k in r["objectives"]:
            e = np.asarray(r["error"][k])
            m, s = e.mean(0), e.std(0)
            ax.errorbar(sig, m, yerr=s, marker="o", ms=3, capsize=2, label=_col(k))
        ax.set(xscale="log", yscale="log", xlabel="σ", title=f"{name}: relative score error")
        ax.legend(fontsize=7)
        ax = axes[2, j]
        keys = list(r["samples"])
        m = [np.mean(r["samples"][k]["energy"]) for k in keys]
        s = [np.std(r["samples"][k]["energy"]) for k in keys]
        ax.bar(
            range(len(keys)),
            m,
            yerr=s,
            capsize=2,
            color=["C0"] * len(r["objectives"]) + ["grey", "lightgrey"],
        )
        ax.set_xticks(
            range(len(keys)), [_col(k) for k in keys], rotation=45, ha="right", fontsize=7
        )
        ax.set(yscale="log", title=f"{name}: energy distance² to exact samples")
    save_figure(fig, path, dpi=110)


# --------------------------------------------------------------------------- entry point
def compute(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Every target of ``table.run_targets``; ``{settings, results, wall_s, cpu_s}``."""
    tc = _settings(cfg)
    _process(tc)  # fail fast on the process and the sigma range
    t0, cpu0 = time.perf_counter(), time.process_time()
    results = {}
    for name in tc.run_targets:
        results[name] = run_target(name, tc, Path(run_dir), log=log)
    return {
        "settings": tc,
        "results": results,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - cpu0,
    }


def report(out: dict) -> dict:
    """The tables, notes and seeds for :func:`experiments.tables.common.write_report`."""
    tc, results = out["settings"], out["results"]
    tr, mc, sc = tc.train, tc.model, tc.samples
    notes = [
        f"Process {OmegaConf.to_container(tc.process)}; sigma is the VE-frame noise level.",
        f"Same budget for every objective: MLP width {mc.width}, depth {mc.depth}, "
        f"emb {mc.emb_dim} ({mc.embedding}) behind EDM preconditioning (sigma_data = target "
        "RMS std), or, for the objectives marked precond: fisher, behind the Fisher-scaled "
        "preconditioning (scorelib.nets.precond.fisher_precond: EDM's c_out times "
        "sigma / sqrt(sigma^2 + sigma_fisher^2), sigma_fisher = the target's "
        "sqrt(d / E||grad log p0||^2)); "
        f"Adam lr {tr.lr}, warm-up {tr.warmup_steps}, clip {tr.grad_clip}; "
        f"{tr.steps} steps of batch {tr.batch_size}; t sampling {tr.t_sampling}; weighting "
        f"lambda per objective (default {tr.weighting}); EMA half-life "
        f"{tr.ema_halflife_frac} of the images seen (evaluated: EMA weights). Larger budgets "
        f"per target (table.budgets): {OmegaConf.to_container(tc.get('budgets') or {})}.",
        "Objectives (kappa = weight of the TSM label, thresholds in VE sigma): "
        + "; ".join(f"{k}: {OmegaConf.to_container(v)}" for k, v in tc.objectives.items())
        + ". gaussian_optimal uses kappa = sd^2/(sd^2 + sigma^2) with sd = the target's RMS std, "
        "gaussian_optimal_modes with sd = sigma_fisher (kappa_sigma_d: fisher, the modes' "
        "scale; its weight keeps the RMS std). "
        "Weightings: sigma2 is lambda = sigma^2 (standard for DSM), alpha2 is lambda = alpha^2 "
        "(the normalised TSM loss ||alpha s - grad log p0||^2; 1 for VE/EDM), fisher is "
        "lambda = (sigma^2 + sigma_fisher^2)(sigma^2 + sd^2) / sd^2, the unit weight of the "
        "Fisher-scaled network's output (as EDM's lambda is for its own). Controls (left out "
        f"of the mixture verdict): {list(tc.get('controls') or [])}. Verdicts compare the "
        "objectives behind one network: behind EDM's, each with its own weight (DSM sigma2, "
        "TSM and switch_edm alpha2); behind the Fisher-scaled one, every objective with the "
        "same weight (fisher: only the label differs, but it is a weight made for the "
        "mixtures); and across both, each objective in its own best recipe.",
        f"(a) n = {tc.variance.n} per sigma; values are E||u - s_t(x_t)||^2 summed over "
        "coordinates (the conditional label variance; the irreducible part of the loss).",
        f"(b) n = {tc.error.n} noisy points per sigma; relative error "
        "sum||s_theta - s_true||^2 / sum||s_true||^2; mean ± std over seeds.",
        f"(c) {sc.sampler} with {sc.steps} steps on the EDM rho={sc.rho} grid from sigma_max to "
        f"sigma_min, then 0; start x_T an exact draw from p_T; {sc.n} samples per model against "
        f"{sc.n} fresh exact samples; energy distance squared (V-statistic), sliced W2 with "
        f"{sc.sw_projections} projections. 'exact samples' is the floor of both metrics at this n.",
        "The paper (De Bortoli et al. 2024) reports figures, not numbers: the 'paper' columns give "
        "the expected shape (from secondary summaries of the paper), not values.",
    ]
    for name, r in results.items():
        tm = r["timings"]
        skipped = {k: v for k, v in r["model"]["skipped_steps"].items() if any(v)}
        notes.append(
            f"{name}: d = {r['dim']}, sigma_data = {r['sigma_data']:.3g}, sigma_fisher = "
            f"{r.get('sigma_fisher', float('nan')):.3g}, "
            f"{r['model']['n_params']} parameters per network; wall {tm['total_s']:.0f} s "
            f"(cpu {tm['cpu_s']:.0f} s): variance "
            f"{tm['variance_s']:.0f} s, training {tm['train_total_s']:.0f} s (compile "
            f"{tm['compile_s']:.0f} s, {tm['steps_per_s']:.1f} steps/s for all "
            f"{len(r['objectives'])}x{len(tc.seeds)} networks), score error "
            f"{tm['error_s']:.0f} s, "
            f"sampling {tm['samples_s']:.0f} s"
            + (f"; non-finite steps skipped: {skipped}" if skipped else "")
        )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    total = sum(r["timings"]["total_s"] for r in results.values())
    cpu = sum(r["timings"]["cpu_s"] for r in results.values())
    reused = sum(1 for r in results.values() if r.get("reused"))
    notes.append(
        f"compute time of all targets {total:.0f} s wall, {cpu:.0f} s cpu, on {os.cpu_count()} "
        f"cores shared with other jobs (load average at the end {load[0]:.1f})"
        if load
        else f"compute time of all targets {total:.0f} s wall, {cpu:.0f} s cpu"
    )
    notes.append(
        f"this launch: {out['wall_s']:.0f} s wall"
        + (f", {reused} target(s) reused from partial/ of an earlier launch" if reused else "")
    )
    tables = []
    for tname, fn, caption in [
        (
            "label_variance",
            variance_table,
            "(a) Conditional label variance E||u - s_t(x_t)||^2 per sigma (Monte Carlo, "
            "exact noisy score).",
        ),
        (
            "score_error",
            error_table,
            "(b) Relative error of the learned score, sum||s_theta - s||^2 / sum||s||^2, "
            "per sigma; mean ± std over seeds, same training budget for every objective.",
        ),
        (
            "summary",
            summary_table,
            "Per target: number of sigmas at which each objective has the lowest mean error, "
            "and its mean log10 relative error over the sigmas.",
        ),
        (
            "samples",
            samples_table,
            "(c) Sample quality, same sampler for every model: energy distance^2 and sliced W2 to "
            "exact target samples, mean ± std over seeds.",
        ),
    ]:
        cols, rows = fn(results)
        tables.append({"name": tname, "caption": caption, "columns": cols, "rows": rows})
    return {"tables": tables, "notes": notes, "seeds": [int(s) for s in tc.seeds]}


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Compute the table into ``run_dir`` (``results.json``, ``figure.png``, ``partial/``);
    returns :func:`report`'s dict plus ``figure``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    out = compute(cfg, run_dir, log=log)
    results = {"results": out["results"], "wall_s": out["wall_s"], "cpu_s": out["cpu_s"]}
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1))
    fig = run_dir / "figure.png"
    make_figure(out["results"], fig)
    return {**report(out), "figure": str(fig)}
