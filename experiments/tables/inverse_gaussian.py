"""Posterior samplers against the exact Gaussian posterior:
``python -m experiments.reproduce table=inverse_gaussian``.

Issue 37, item 3 and the oracle half of item 5. For a Gaussian prior and a linear-Gaussian
measurement ``y = A x0 + sigma_y n`` the posterior is Gaussian in closed form
(``scorelib.scores.posterior.gaussian_posterior``), so each approximate method's draws can be
judged against it. This module composes library calls and reports; every estimator is a
tested function of ``scorelib`` (``scorelib.metrics.posterior``).

* Priors (``table.priors``): ``digits``, the Gaussian fitted to the 8x8 digits' training split
  (``scorelib.scores.gaussian_fit.fit_gaussian``; anisotropic), and ``isotropic``,
  ``N(the same mean, c I)`` with ``c`` the digits' mean variance.
* Operators (``table.operators``, ``scorelib.operators``; parameters ``table.task.*``):
  denoise, box and random inpainting, downsample, blur, compressed sensing and a sensors
  measurement (``Measurement.stack``: a downsampled image with ``sigma_y`` and a few random
  pixels with their own, smaller ``sigma_y``); ``table.noiseless_operators`` also at
  ``sigma_y = 0`` on the isotropic prior.
* Methods (``table.methods``): ``exact`` (the sampler driven by the exact posterior, a
  ``GaussianScore``: its error is the discretisation plus Monte Carlo), ``projection``,
  ``dps`` (every zeta of ``table.zetas``; the best by W2 in the summary), ``pigdm``
  (``sigma_data^2`` = the prior's mean variance) with ``table.sampler`` on the EDM grid, and
  ``ddrm`` (``scorelib.samplers.ddrm``, the same grid; where the operator has an SVD and one
  noise level), all from ``scorelib.scores.measured.posterior_source``.
* ``table.measurements`` clean test digits, each measured once; ``table.draws`` posterior
  draws per measurement (``repeats``). Per measurement: ``gaussian_w2`` (W2 between the
  Gaussian fitted to the draws and the exact posterior, relative mean and std errors),
  ``std_calibration`` (per-pixel std ratio, exact posterior mass of the draws' central
  interval) and the floor ``gaussian_w2_floor`` (as many exact draws, ``table.floor_draws``
  times); every statistic is the mean over measurements.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments.runs.layout import pyplot, save_figure
from experiments.tables.common import pm, scaled
from scorelib._checks import check_int, check_real, require
from scorelib._io import atomic_write_text
from scorelib.data import load_digits
from scorelib.metrics.posterior import gaussian_w2, gaussian_w2_floor, std_calibration
from scorelib.operators import (
    Downsample,
    GaussianBlur,
    Identity,
    Inpainting,
    Measurement,
    RandomProjection,
)
from scorelib.processes import EDM
from scorelib.samplers import ddrm, draw_samples, edm_grid, get_sampler
from scorelib.scores import GaussianScore
from scorelib.scores.gaussian_fit import fit_gaussian
from scorelib.scores.measured import posterior_source
from scorelib.scores.posterior import gaussian_posterior, prior_covariance

DATA_SHAPE = (8, 8, 1)
PRIORS = {"digits": "digits (fitted)", "isotropic": "isotropic"}
OPERATORS = {
    "denoise": "denoise",
    "box": "inpaint box",
    "random": "inpaint random",
    "downsample": "downsample",
    "blur": "blur",
    "cs": "compressed sensing",
    "sensors": "sensors",
}
METHODS = {
    "exact": "exact posterior",
    "projection": "projection",
    "dps": "DPS",
    "pigdm": "PiGDM",
    "ddrm": "DDRM",
}
STATS = ("w2", "w2_squared", "mean_error", "rel_mean_error", "std_error")
FLOOR_STATS = ("w2", "rel_mean_error", "std_error")


# --------------------------------------------------------------------------- settings
def _names(values, field: str, allowed, *, empty: bool = False) -> list[str]:
    out = list(values) if OmegaConf.is_list(values) or isinstance(values, list | tuple) else None
    ok = out is not None and (empty or bool(out))
    ok = ok and all(isinstance(v, str) and v in allowed for v in out)
    ok = ok and len(set(out)) == len(out)
    what = "a list of distinct names" + ("" if empty else ", at least one,")
    require(ok, field, f"{what} of {list(allowed)}", values)
    return out


def _table_error(e: ValueError, prefix: str = "table.") -> ValueError:
    """A library error naming ``task.*`` or ``sampler.*``, renamed to the table's field."""
    text = str(e)
    for head in ("task.", "sampler."):
        if text.startswith(head):
            text = prefix + (text if head == "task." else text[len(head) :])
    return ValueError(text)


def measurements(tc: DictConfig, key) -> dict[str, Measurement]:
    """``{label: Measurement}``: each of ``table.operators`` at ``table.sigma_y`` and each of
    ``table.noiseless_operators`` at 0 (label ``"<operator>, sigma_y = 0"``); the random
    parts (mask, matrix, sensor pixels) drawn from ``key`` by operator.

    Raises:
      ValueError: naming ``table.task.<field>`` for an operator parameter out of range.
    """
    task = tc.task

    def operator(name: str):
        k = jax.random.fold_in(key, list(OPERATORS).index(name))
        if name == "denoise":
            return Identity.create(DATA_SHAPE)
        if name == "box":
            box = OmegaConf.to_container(task.box) if OmegaConf.is_list(task.box) else task.box
            return Inpainting.box(DATA_SHAPE, box)
        if name == "random":
            return Inpainting.random(k, DATA_SHAPE, task.keep)
        if name == "downsample":
            return Downsample.create(DATA_SHAPE, task.factor)
        if name == "blur":
            return GaussianBlur.create(DATA_SHAPE, task.std, task.size)
        if name == "cs":
            return RandomProjection.create(k, DATA_SHAPE, task.m)
        raise AssertionError(name)

    def measure(name: str, sigma_y: float, point_sigma_y: float) -> Measurement:
        if name != "sensors":
            return Measurement.create(operator(name), sigma_y)
        s = task.sensors
        k = jax.random.fold_in(key, list(OPERATORS).index(name))
        try:
            low = Downsample.create(DATA_SHAPE, s.factor)
            points = Inpainting.random(k, DATA_SHAPE, s.keep)
        except ValueError as e:
            raise ValueError(str(e).replace("task.", "task.sensors.", 1)) from e
        return Measurement.stack(
            [Measurement.create(low, sigma_y), Measurement.create(points, point_sigma_y)]
        )

    out = {}
    try:
        for name in tc.operators:
            out[name] = measure(name, float(tc.sigma_y), float(tc.task.sensors.sigma_y))
        for name in tc.noiseless_operators:
            out[f"{name}, sigma_y = 0"] = measure(name, 0.0, 0.0)
    except ValueError as e:
        raise _table_error(e) from e
    return out


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is computed.

    Raises:
      ValueError: naming ``table.<field>``.
    """
    tc = scaled(cfg, base="small")
    check_int(tc.seed, "table.seed", low=0)
    priors = _names(tc.priors, "table.priors", PRIORS)
    _names(tc.operators, "table.operators", OPERATORS)
    noiseless = _names(tc.noiseless_operators, "table.noiseless_operators", OPERATORS, empty=True)
    require(
        "denoise" not in noiseless,
        "table.noiseless_operators",
        "operators other than denoise (its noiseless posterior is a point mass)",
        noiseless,
    )
    require(
        not noiseless or "isotropic" in priors,
        "table.noiseless_operators",
        "empty unless table.priors has isotropic (the noiseless rows use that prior only)",
        noiseless,
    )
    check_real(tc.sigma_y, "table.sigma_y", low=0.0, low_open=True)
    check_real(tc.task.sensors.sigma_y, "table.task.sensors.sigma_y", low=0.0, low_open=True)
    methods = _names(tc.methods, "table.methods", METHODS)
    if "dps" in methods:
        zetas = OmegaConf.to_container(tc.zetas) if OmegaConf.is_list(tc.zetas) else tc.zetas
        require(
            isinstance(zetas, list) and bool(zetas) and len(set(zetas)) == len(zetas),
            "table.zetas",
            "a list of distinct numbers > 0, at least one (DPS is in table.methods)",
            tc.zetas,
        )
        for z in zetas:
            check_real(z, "table.zetas", low=0.0, low_open=True)
    check_real(tc.ddrm.eta, "table.ddrm.eta", low=0.0, high=1.0)
    check_real(tc.ddrm.eta_b, "table.ddrm.eta_b", low=0.0, high=1.0)
    try:
        get_sampler(tc.sampler)
    except ValueError as e:
        raise ValueError(f"table.sampler: {e}") from e
    try:
        edm_grid(tc.steps, tc.sigma_min, tc.sigma_max)
    except ValueError as e:
        raise _table_error(e) from e
    require(isinstance(tc.float64, bool), "table.float64", "true or false", tc.float64)
    check_int(tc.measurements, "table.measurements", low=1, high=359)  # the digits' test split
    check_int(tc.draws, "table.draws", low=2)
    check_int(tc.batch_size, "table.batch_size", low=1)
    check_int(tc.floor_draws, "table.floor_draws", low=1)
    check_real(tc.level, "table.level", low=0.0, high=1.0, low_open=True, high_open=True)
    require(
        tc.figure_operator in list(tc.operators),
        "table.figure_operator",
        f"one of table.operators {list(tc.operators)}",
        tc.figure_operator,
    )
    measurements(tc, jax.random.key(0))  # the operators' parameters
    return tc


# ---------------------------------------------------------------------------- compute
def priors(names, process) -> tuple[dict[str, GaussianScore], np.ndarray]:
    """``({name: prior}, test images)``: the digits' Gaussian fit and its isotropic twin."""
    ds = load_digits()
    fit = fit_gaussian(process, ds.train)
    mu, cov = prior_covariance(fit)
    c = float(np.trace(cov)) / mu.size
    out = {
        "digits": fit,
        "isotropic": GaussianScore.from_covariance(process, mu, c * np.eye(mu.size), DATA_SHAPE),
    }
    return {n: out[n] for n in names}, np.asarray(ds.test)


def _shifted(sampler, offset: int):
    """``sampler`` with its examples' global indices shifted by ``offset`` (the exact
    posterior of measurement ``j`` drawn with the indices the measured sources give it)."""

    def sample(source, key, shape, *, first_index=0, **kw):
        return sampler(source, key, shape, first_index=first_index + offset, **kw)

    return sample


def judge(samples, exact, n: int, level: float) -> dict:
    """The statistics of ``[M n, d]`` draws (``n`` per measurement, in order) against the
    exact posteriors ``[(mean, cov)] * M``, each the mean over measurements; NaN (and
    ``num_nonfinite``) when a measurement's draws hold a non-finite value."""
    per = []
    bad = int(np.sum(~np.all(np.isfinite(samples), axis=1)))
    for j, (mean, cov) in enumerate(exact):
        xj = samples[j * n : (j + 1) * n]
        if not np.all(np.isfinite(xj)):
            per.append(dict.fromkeys([*STATS, "std_ratio", "coverage"], np.nan))
            continue
        w = gaussian_w2(xj, mean, cov)
        cal = std_calibration(
            xj, np.sqrt(np.clip(np.diag(cov), 0, None)), exact_mean=mean, level=level
        )
        per.append(
            {
                **{k: w[k] for k in STATS},
                "std_ratio": cal["median_ratio"],
                "coverage": cal["coverage"],
                "std_map": cal["std"],
            }
        )
    out = {k: float(np.mean([p[k] for p in per])) for k in [*STATS, "std_ratio", "coverage"]}
    out["num_nonfinite"] = bad
    out["std_map0"] = per[0].get("std_map")
    return out


def floor(exact, n: int, draws: int, seed: int) -> dict:
    """The Monte-Carlo floor averaged over measurements draw by draw: ``floor_<stat>`` and
    ``floor_<stat>_std`` (over the ``draws`` repetitions)."""
    per = [
        gaussian_w2_floor(mean, cov, n, draws=draws, seed=seed * 1000 + j)["per_draw"]
        for j, (mean, cov) in enumerate(exact)
    ]
    out = {}
    for k in FLOOR_STATS:
        v = np.array([[p[i][k] for p in per] for i in range(draws)]).mean(axis=1)
        out[f"floor_{k}"], out[f"floor_{k}_std"] = float(v.mean()), float(v.std())
    return out


def case(tc, prior_name, prior, label, meas, truth, keys, log) -> tuple[list[dict], dict]:
    """Every method on one prior and measurement: ``(records, figure maps)``."""
    M, n = int(tc.measurements), int(tc.draws)
    y = np.asarray(meas.measure(truth, keys["noise"]), np.float64)
    posts = [gaussian_posterior(prior, meas, yj) for yj in y]
    exact = [prior_covariance(p) for p in posts]
    base = {"prior": prior_name, "operator": label, "sigma_y": _sigma_text(meas)}
    fl = floor(exact, n, int(tc.floor_draws), int(tc.seed))
    grid = edm_grid(tc.steps, tc.sigma_min, tc.sigma_max)
    sampler = get_sampler(tc.sampler)
    kw = {"grid": grid, "float64": bool(tc.float64), "batch_size": int(tc.batch_size)}
    _, cov0 = prior_covariance(prior)
    sigma_data = float(np.sqrt(np.trace(cov0) / cov0.shape[0]))
    svd = meas.operator.svd() is not None and meas.scalar_noise
    runs = []
    for method in tc.methods:
        if method == "exact":
            runs.append((method, None, None))
        elif method == "dps":
            runs += [(method, float(z), {"zeta": float(z)}) for z in tc.zetas]
        elif method == "pigdm":
            runs.append((method, None, {"sigma_data": sigma_data}))
        elif method == "ddrm" and not svd:
            continue
        else:
            runs.append((method, None, {}))
    records, maps = [], {}
    for method, zeta, opts in runs:
        t0 = time.perf_counter()
        if method == "exact":
            parts = [
                draw_samples(
                    _shifted(sampler, j * n),
                    posts[j],
                    keys["sample"],
                    DATA_SHAPE,
                    num_samples=n,
                    **kw,
                )
                for j in range(M)
            ]
            x = np.concatenate([p[0] for p in parts])
            info = parts[0][1]
        else:
            src = posterior_source(method, prior, meas, y, repeats=n, **opts)
            opt = dict(tc.ddrm) if method == "ddrm" else {}
            x, info = draw_samples(
                ddrm if method == "ddrm" else sampler,
                src,
                keys["sample"],
                DATA_SHAPE,
                num_samples=M * n,
                **kw,
                **opt,
            )
        stats = judge(np.asarray(x, np.float64).reshape(M * n, -1), exact, n, float(tc.level))
        maps[(method, zeta)] = stats.pop("std_map0")
        rec = {
            **base,
            "method": method,
            "zeta": zeta,
            **stats,
            **fl,
            "nfe": int(info["nfe"]),
            "sampler": "ddrm" if method == "ddrm" else str(tc.sampler),
            "steps": int(tc.steps),
            "wall_s": time.perf_counter() - t0,
        }
        records.append(rec)
        log(
            f"[{prior_name} / {label}] {method}{'' if zeta is None else f' zeta={zeta:g}'}: "
            f"W2 {rec['w2']:.3g} (floor {rec['floor_w2']:.3g}), std ratio "
            f"{rec['std_ratio']:.3g}, {rec['wall_s']:.1f} s"
        )
    m0, c0 = exact[0]
    maps["truth"] = np.asarray(truth[0]).reshape(-1)
    maps["measured"] = np.asarray(
        meas.operator.pinv(np.asarray(y[:1], np.float32)), np.float64
    ).reshape(-1)
    maps["post_mean"], maps["post_std"] = m0, np.sqrt(np.clip(np.diag(c0), 0, None))
    return records, maps


def _sigma_text(meas: Measurement):
    if meas.scalar_noise:
        return float(meas.sigma_y)
    return "/".join(f"{v:g}" for v in dict.fromkeys(np.asarray(meas.sigma_y).tolist()))


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Every prior x operator x method; writes ``results.json``, ``figure.png`` (std maps of
    ``table.figure_operator``) and ``w2.png`` (W2 over its floor, per operator and method)."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    process = EDM()
    root = jax.random.key(int(tc.seed))
    meas = measurements(tc, jax.random.fold_in(root, 1))
    prior_of, test = priors(list(tc.priors), process)
    truth = test[: int(tc.measurements)]
    records, figure_maps = [], {}
    for p, prior in prior_of.items():
        for i, (label, m) in enumerate(meas.items()):
            if label not in tc.operators and p != "isotropic":
                continue  # the noiseless rows: isotropic prior only
            keys = {
                "noise": jax.random.fold_in(jax.random.fold_in(root, 2), i),
                "sample": jax.random.fold_in(root, 3),
            }
            recs, maps = case(tc, p, prior, label, m, truth, keys, log)
            records += recs
            if label == tc.figure_operator:
                figure_maps[p] = maps
    wall = time.perf_counter() - t0
    results = {
        "records": records,
        "setup": {
            "sampler": str(tc.sampler),
            "steps": int(tc.steps),
            "grid": f"EDM, sigma {tc.sigma_max:g} to {tc.sigma_min:g}, then 0",
            "float64": bool(tc.float64),
            "measurements": int(tc.measurements),
            "draws": int(tc.draws),
            "sigma_y": float(tc.sigma_y),
        },
        "wall_s": wall,
    }
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1, default=_json))
    figures = [run_dir / "figure.png", run_dir / "w2.png"]
    std_figure(figure_maps, records, tc, figures[0])
    w2_figure(records, figures[1])
    return report(records, tc, [str(f) for f in figures])


def _json(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.floating | np.integer):
        return v.item()
    return str(v)


# ---------------------------------------------------------------------------- report
def best_dps(records) -> dict:
    """``{(prior, operator): the DPS record of least W2}`` (NaN, a diverged run, never
    best)."""
    out = {}
    for r in records:
        if r["method"] != "dps" or not np.isfinite(r["w2"]):
            continue
        k = (r["prior"], r["operator"])
        if k not in out or r["w2"] < out[k]["w2"]:
            out[k] = r
    return out


def summary_rows(records) -> list[dict]:
    """The records of the summary: every method once per case, DPS at its best zeta."""
    best = best_dps(records)
    rows, seen = [], set()
    for r in records:
        k = (r["prior"], r["operator"])
        if r["method"] == "dps":
            if k in seen or k not in best:
                continue
            seen.add(k)
            r = best[k]
        rows.append(r)
    return rows


def _ratio(r) -> float:
    return r["w2"] / r["floor_w2"] if r["floor_w2"] > 0 else np.nan


def _method_label(r) -> str:
    label = METHODS[r["method"]]
    return label if r["zeta"] is None else f"{label} (best zeta {r['zeta']:g})"


def summary_table(records, tc) -> dict:
    level = float(tc.level)
    cols = [
        "prior",
        "operator",
        "method",
        "W2",
        "W2 floor",
        "W2 / floor",
        "mean error / sqrt(tr C)",
        "floor",
        "std error (rel.)",
        "floor",
        "std ratio (median)",
        f"coverage of the {level:.0%} interval",
        "NFE",
    ]
    rows = [
        [
            PRIORS[r["prior"]],
            _operator_label(r),
            _method_label(r),
            r["w2"],
            pm(r["floor_w2"], r["floor_w2_std"]),
            _ratio(r),
            r["rel_mean_error"],
            pm(r["floor_rel_mean_error"], r["floor_rel_mean_error_std"]),
            r["std_error"],
            pm(r["floor_std_error"], r["floor_std_error_std"]),
            r["std_ratio"],
            r["coverage"],
            r["nfe"],
        ]
        for r in summary_rows(records)
    ]
    caption = (
        f"Each method's draws against the exact Gaussian posterior, mean over "
        f"{tc.measurements} measurements of {tc.draws} draws each: W2 between the Gaussian "
        "fitted to the draws and the exact posterior (data units), the mean error in units of "
        "the posterior's spread, the per-pixel std error ||s_hat - s|| / ||s||, the median "
        "per-pixel std ratio s_hat / s and the exact posterior mass of the draws' central "
        f"{level:.0%} intervals; floors: {tc.draws} exact draws (mean ± std over "
        f"{tc.floor_draws} repetitions). {tc.sampler} with {tc.steps} steps on the EDM grid "
        "(DDRM: its own update, same grid); NFE counts source calls (DPS and PiGDM: a forward "
        "and a VJP each). DPS at its best zeta by W2 (every zeta: the dps_sweep table)."
    )
    return {"name": "summary", "caption": caption, "columns": cols, "rows": rows}


def _operator_label(r) -> str:
    name, _, rest = r["operator"].partition(", ")
    return OPERATORS[name] + (f", {rest}" if rest else "")


def dps_table(records, tc) -> dict:
    cols = [
        "prior",
        "operator",
        "zeta",
        "W2",
        "W2 / floor",
        "mean error / sqrt(tr C)",
        "std error (rel.)",
        "std ratio (median)",
        "coverage",
        "non-finite draws",
    ]
    rows = [
        [
            PRIORS[r["prior"]],
            _operator_label(r),
            r["zeta"],
            r["w2"],
            _ratio(r),
            r["rel_mean_error"],
            r["std_error"],
            r["std_ratio"],
            r["coverage"],
            r["num_nonfinite"],
        ]
        for r in records
        if r["method"] == "dps"
    ]
    caption = (
        "DPS at every zeta of table.zetas (score units: the step is the sampler's, "
        "zeta times sigma times the VE step; not the paper's per-step zeta')."
    )
    return {"name": "dps_sweep", "caption": caption, "columns": cols, "rows": rows}


def _range(rows) -> str:
    v = [_ratio(r) for r in rows if np.isfinite(r["w2"])]
    if not v:
        return "n/a"
    return f"{min(v):.2g}" if len(v) == 1 else f"{min(v):.2g} to {max(v):.2g}"


def notes(records, tc) -> list[str]:
    rows = summary_rows(records)

    def of(method, prior=None, noiseless=None):
        out = [r for r in rows if r["method"] == method]
        if prior is not None:
            out = [r for r in out if r["prior"] == prior]
        if noiseless is not None:
            out = [r for r in out if ("sigma_y = 0" in r["operator"]) == noiseless]
        return out

    steps = f"{tc.sampler} with {tc.steps} steps"
    out = [
        f"Setup: {steps} on the EDM grid (sigma {tc.sigma_max:g} to {tc.sigma_min:g}, then 0) "
        f"for the exact, projection, DPS and PiGDM sources; DDRM (eta {tc.ddrm.eta:g}, eta_b "
        f"{tc.ddrm.eta_b:g}) on the same grid; float64 = {tc.float64}; {tc.measurements} test "
        f"digits measured once each (sigma_y = {tc.sigma_y:g}; the sensors' points "
        f"{tc.task.sensors.sigma_y:g}), {tc.draws} draws per measurement.",
        "W2 / floor reads the table: about 1 is as close to the exact posterior as "
        f"{tc.draws} exact draws get (the 'exact posterior' row adds the sampler's "
        "discretisation); the coverage of exact draws is about the interval's level.",
    ]
    if tc.get("scale") == "smoke":
        out.insert(
            0,
            f"Smoke scale: {steps} and {tc.draws} draws test the pipeline only; its numbers "
            "(the exact posterior's row too) are not the table's claims: run the small scale.",
        )
    for method, claim in (
        (
            "exact",
            "exact posterior: the sampler on the exact posterior source (discretisation "
            "and Monte Carlo only)",
        ),
        (
            "pigdm",
            "PiGDM: exact for an isotropic prior N(mu, c I) with sigma_data^2 = c (the "
            "isotropic rows), biased otherwise",
        ),
        (
            "projection",
            "projection: exact for noiseless measurements of coordinates independent "
            "under the prior (isotropic prior: the sigma_y = 0 rows), biased when sigma_y > 0 (the "
            "measured part is pinned to y: std ratio 0 on measured pixels)",
        ),
        (
            "ddrm",
            "DDRM: exact in no row with eta > 0: its update off the measurement draws eta "
            "sigma' of fresh noise every step (the paper's eq. 7; DDIM's eta scales with the "
            "step), under-dispersed even where projection is exact (with table.ddrm.eta=0 it "
            "is exact there); with sigma_y > 0 the measured directions end on the prior "
            "denoiser's output, under-dispersed (std ratio < 1)",
        ),
        (
            "dps",
            "DPS (best zeta): exact in no limit of its own; as zeta grows it enforces A D = y "
            "and approaches projection (at the floor only where projection is)",
        ),
    ):
        if not of(method):
            continue
        parts = []
        for prior in tc.priors:
            for noiseless in (False, True):
                rs = of(method, prior, noiseless)
                if rs:
                    what = f"{prior}{', sigma_y = 0' if noiseless else ''}"
                    parts.append(f"{what}: {_range(rs)}")
        out.append(f"{claim}. Measured W2 / floor: {'; '.join(parts)}.")
    best = best_dps(records)
    if best:
        out.append(
            "DPS's best zeta (by W2, chosen on the table's own draws: optimistic): "
            + "; ".join(f"{p} / {_operator_label(r)}: {r['zeta']:g}" for (p, _), r in best.items())
            + "."
        )
    if any(r["num_nonfinite"] for r in records):
        out.append(
            "Diverged runs (non-finite draws) are NaN: "
            + ", ".join(
                f"{r['prior']} / {r['operator']} / {r['method']}"
                + ("" if r["zeta"] is None else f" zeta {r['zeta']:g}")
                for r in records
                if r["num_nonfinite"]
            )
            + "."
        )
    return out


def report(records, tc, figures) -> dict:
    return {
        "tables": [
            summary_table(records, tc),
            *([dps_table(records, tc)] if "dps" in tc.methods else []),
        ],
        "notes": notes(records, tc),
        "seeds": [int(tc.seed)],
        "figure": figures,
    }


# ---------------------------------------------------------------------------- figures
def std_figure(figure_maps: dict, records, tc, path: Path) -> None:
    """Per prior (rows): truth, A^+ y, exact posterior mean and std, then each method's
    per-pixel std of measurement 0 (one colour scale per row, the exact std's range)."""
    plt = pyplot()
    best = best_dps(records)
    cols = ["truth", "A^+ y", "posterior mean", "exact std (closed form)"]
    methods = [m for m in tc.methods]
    ncol = len(cols) + len(methods)
    fig, axes = plt.subplots(
        len(figure_maps), ncol, figsize=(1.6 * ncol, 1.9 * len(figure_maps)), squeeze=False
    )
    for row, (p, maps) in enumerate(figure_maps.items()):
        vmax = float(np.max(maps["post_std"])) * 1.5
        panels = [
            (cols[0], maps["truth"], "grey"),
            (cols[1], maps["measured"], "grey"),
            (cols[2], maps["post_mean"], "grey"),
            (cols[3], maps["post_std"], "std"),
        ]
        for m in methods:
            zeta = None
            if m == "dps":
                b = best.get((p, tc.figure_operator))
                zeta = b["zeta"] if b else None
            std = maps.get((m, zeta))
            label = "exact sampler" if m == "exact" else METHODS[m]
            label += "" if zeta is None else f" ({zeta:g})"
            panels.append((f"{label} std", std, "std"))
        for ax, (title, img, kind) in zip(axes[row], panels, strict=True):
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(title, fontsize=7)
            if img is None:
                ax.text(0.5, 0.5, "n/a", ha="center", va="center", transform=ax.transAxes)
                continue
            img = np.asarray(img).reshape(DATA_SHAPE[:2])
            if kind == "grey":
                ax.imshow(img, cmap="gray", vmin=-1, vmax=1)
            else:
                ax.imshow(img, cmap="magma", vmin=0, vmax=vmax)
        axes[row][0].set_ylabel(PRIORS[p], fontsize=8)
    fig.suptitle(
        f"{OPERATORS[tc.figure_operator]}, sigma_y = {tc.sigma_y:g}: per-pixel posterior std "
        f"(colour scale 0 to 1.5 x the exact maximum)",
        fontsize=8,
    )
    save_figure(fig, path)


def w2_figure(records, path: Path) -> None:
    """W2 over its floor per operator (groups) and method (bars), one panel per prior."""
    plt = pyplot()
    rows = summary_rows(records)
    prior_names = list(dict.fromkeys(r["prior"] for r in rows))
    fig, axes = plt.subplots(
        len(prior_names), 1, figsize=(11, 3.2 * len(prior_names)), squeeze=False
    )
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for ax, p in zip(axes[:, 0], prior_names, strict=True):
        rs = [r for r in rows if r["prior"] == p]
        ops = list(dict.fromkeys(r["operator"] for r in rs))
        width = 0.8 / len(methods)
        for k, m in enumerate(methods):
            xs, hs = [], []
            for i, o in enumerate(ops):
                r = next((r for r in rs if r["operator"] == o and r["method"] == m), None)
                if r is not None and np.isfinite(r["w2"]):
                    xs.append(i + (k - (len(methods) - 1) / 2) * width)
                    hs.append(_ratio(r))
            ax.bar(xs, hs, width=width, label=METHODS[m])
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xticks(range(len(ops)))
        ax.set_xticklabels(
            [_operator_label({"operator": o}).replace(", ", "\n") for o in ops], fontsize=7
        )
        ax.set_ylabel("W2 / Monte-Carlo floor")
        ax.set_title(f"prior: {PRIORS[p]}", fontsize=9)
        ax.legend(fontsize=7, ncol=len(methods))
    save_figure(fig, path)
