"""Inverse problems on a trained score run (``experiments.reconstruct``): measure held-out
clean examples, draw posterior samples with each method, score them and write them.

Composition only: the operators (``scorelib.operators``), the measurement-conditioned
sources (``scorelib.scores.measured``), DDRM (``scorelib.samplers.ddrm``) and the estimators
(``scorelib.metrics.reconstruction``) are the library's. :func:`plan` checks every field and
builds every object before anything is restored, sampled or written (a sweep checks each
job with it); :func:`reconstruct` restores the checkpoint, draws, and writes under
``<run_dir>/reconstructions/step<k>/<name>`` (:func:`output_name`: a pure function of what
the reconstructions depend on, so none overwrites another).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments import schema
from experiments.build import build_data
from experiments.common import write_run_info
from experiments.runs import run_kind
from experiments.runs.base import TrainedRun, configure_jax, override_keys, run_precision
from experiments.runs.classifier import ClassifierRun
from experiments.runs.distill import DistillRun
from experiments.runs.layout import (
    display_path,
    pyplot,
    read_config,
    samples_name,
    save_figure,
)
from experiments.runs.score import ScoreRun, sampler_name_parts
from scorelib import operators
from scorelib._checks import check_int, check_real, require
from scorelib._io import atomic_savez, atomic_write_text
from scorelib.metrics import reconstruction as rm
from scorelib.samplers import draw_samples
from scorelib.samplers.ddrm import ddrm
from scorelib.scores.measured import METHODS, posterior_source

#: Tasks whose operator needs images ``(H, W, C)``; flat data takes the others.
IMAGE_TASKS = ("inpaint_box", "downsample", "blur", "colourise", "sensors")
#: Each task's operator parameters (the ``task.<field>`` in the output name).
TASK_PARAMS = {
    "denoise": (),
    "inpaint_box": ("box",),
    "inpaint_random": ("keep",),
    "downsample": ("factor",),
    "blur": ("std", "size"),
    "cs": ("m",),
    "colourise": (),
    "sensors": ("factor", "keep", "sigma_y_points"),
}
#: The central interval whose coverage is reported.
LEVEL = 0.9
#: Examples shown in the figure.
FIGURE_COLUMNS = 8
#: ``Data.reference``'s seed: the held-out points of flat data (toys, targets).
REFERENCE_SEED = 12345


@dataclasses.dataclass
class Plan:
    """Everything a reconstruction needs, checked: the run (built, not restored), the task's
    measurement, the clean examples and their measurements, the sources of each method and
    the output name."""

    cfg: DictConfig
    kind: type[TrainedRun]
    run: ScoreRun
    sampler_cfg: DictConfig
    task: str
    params: dict  # the operator parameters, defaults resolved
    measurement: operators.Measurement
    truth: np.ndarray | None  # [n, *data_shape], or None (given measurements without x0)
    y: np.ndarray  # [n, m]
    draws: int
    methods: dict  # name -> its source options
    ddrm_opts: dict
    name: str
    measurements_file: str | None = None

    @property
    def num_images(self) -> int:
        return int(self.y.shape[0])

    @property
    def images(self) -> bool:
        return len(self.run.data.data_shape) == 3


# --------------------------------------------------------------------------- checks


def check_run_kind(run_dir) -> type[TrainedRun]:
    """:class:`ScoreRun` for a score training run.

    Raises:
      FileNotFoundError: ``run_dir`` has no ``config.yaml``.
      ValueError: naming ``run_dir`` for a distillation or classifier run.
    """
    kind = run_kind(run_dir)
    require(
        kind is ScoreRun,
        "run_dir",
        "a score training run (experiments.train): its score is the prior",
        f"a {'distillation' if kind is DistillRun else 'classifier'} run ({run_dir})"
        if kind in (DistillRun, ClassifierRun)
        else str(run_dir),
    )
    return kind


def sampler_config(cfg: DictConfig, run_cfg: DictConfig, overrides: list[str], total: int):
    """The run's sampler (``sampler=run``) or the one named, as ``experiments.sample``
    resolves it, drawing ``total`` samples.

    Raises:
      ValueError: ``sampler.num_samples`` given (it is ``task.num_images x task.draws``), or
        as :meth:`ScoreRun.sampler_config`.
    """
    if "sampler.num_samples" in override_keys(overrides):
        raise ValueError(
            "sampler.num_samples is task.num_images x task.draws here: give task.num_images "
            "and task.draws instead"
        )
    out = ScoreRun.sampler_config(cfg, run_cfg, overrides)
    out.num_samples = total
    return out


def build_measurement(tc: DictConfig, data_shape, key) -> tuple[operators.Measurement, dict]:
    """The task's measurement and its operator parameters (defaults resolved).

    Raises:
      ValueError: naming ``task`` (an image task on flat data, colourise on other than RGB)
        or the ``task.<field>`` out of range.
    """
    name = tc.name
    shape = tuple(data_shape)
    sigma_y = check_real(tc.sigma_y, "task.sigma_y", low=0.0)
    flat = len(shape) != 3
    allowed = [t for t in TASK_PARAMS if t not in IMAGE_TASKS]
    require(
        not (flat and name in IMAGE_TASKS),
        "task",
        f"one of {allowed} for the run's flat data (shape {list(shape)}): {name} needs images",
        name,
    )
    if name == "colourise":
        require(
            shape[-1] == 3,
            "task",
            f"a task for the run's {shape[-1]}-channel images (colourise needs RGB, 3 channels)",
            name,
        )
    params: dict[str, Any] = {}
    if name == "denoise":
        op = operators.Identity.create(shape)
    elif name == "inpaint_box":
        box = OmegaConf.to_container(tc.box) if OmegaConf.is_config(tc.box) else tc.box
        op = operators.Inpainting.box(shape, box)
        params["box"] = list(box)
    elif name == "inpaint_random":
        op = operators.Inpainting.random(key, shape, tc.keep)
        params["keep"] = float(tc.keep)
    elif name == "downsample":
        op = operators.Downsample.create(shape, tc.factor)
        params["factor"] = op.factor
    elif name == "blur":
        op = operators.GaussianBlur.create(shape, tc.std, tc.size)
        params.update(std=op.std, size=op.size)
    elif name == "cs":
        d = math.prod(shape)
        m = max(1, d // 4) if tc.m is None else tc.m
        op = operators.RandomProjection.create(key, shape, m)
        params["m"] = op.m
    elif name == "colourise":
        op = operators.Colourisation.create(shape)
    else:  # sensors
        points_sigma = check_real(tc.sigma_y_points, "task.sigma_y_points", low=0.0)
        low = operators.Downsample.create(shape, tc.factor)
        points = operators.Inpainting.random(key, shape, tc.keep)
        params.update(factor=low.factor, keep=float(tc.keep), sigma_y_points=points_sigma)
        return operators.Measurement.stack(
            [
                operators.Measurement.create(low, sigma_y),
                operators.Measurement.create(points, points_sigma),
            ]
        ), params
    return operators.Measurement.create(op, sigma_y), params


def held_out(data, n) -> np.ndarray:
    """The first ``n`` held-out clean examples: the test split of images, or fixed exact
    samples of flat data (``Data.reference``).

    Raises:
      ValueError: naming ``task.num_images`` (more than the test split holds, or no split).
    """
    n = check_int(n, "task.num_images", low=1)
    if data.images is None:
        return np.asarray(data.reference(n, seed=REFERENCE_SEED), np.float32)
    test = data.images.test
    require(test is not None, "task.num_images", "used with data that has a test split", n)
    require(
        n <= len(test), "task.num_images", f"an integer in [1, {len(test)}] (the test split)", n
    )
    return np.asarray(test[:n], np.float32)


def load_measurements(
    path, n: int, m: int, data_shape, describe: dict
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(y [n, m], x0 [n, *data_shape] or None)`` from a ``.npz`` (keys ``y``, ``x0``; an
    ``operator`` description, as ``measurements.npz`` holds, must be ``describe``, this
    task's).

    Raises:
      FileNotFoundError: naming ``task.measurements``.
      ValueError: naming ``task.measurements``: no ``y``, a wrong shape, non-finite values,
        measurements of another operator.
    """
    p = Path(str(path))
    if not p.is_file():
        raise FileNotFoundError(f"task.measurements={p}: no such file")
    try:
        with np.load(p) as f:
            arrays = {k: np.asarray(f[k]) for k in ("y", "x0", "operator") if k in f.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"task.measurements={p}: not a readable .npz ({e})") from None
    if "operator" in arrays:
        try:
            theirs = json.loads(str(arrays["operator"]))
        except ValueError:
            theirs = None
        require(
            theirs == describe,
            f"task.measurements={p}",
            f"measurements of this task's operator ({_describe_line(describe)})",
            _describe_line(theirs) if isinstance(theirs, dict) else "another operator",
        )
    y = arrays.get("y")
    require(y is not None, f"task.measurements={p}", "a .npz with an array 'y'", "no 'y'")
    want = (n, m)
    require(
        y.shape == want and np.issubdtype(y.dtype, np.number),
        f"task.measurements={p}",
        f"a .npz whose y is [task.num_images, m] = {list(want)} (the operator's m)",
        f"y of shape {tuple(y.shape)}",
    )
    require(bool(np.all(np.isfinite(y))), f"task.measurements={p}", "finite", "non-finite y")
    x0 = arrays.get("x0")
    if x0 is not None:
        require(
            x0.shape == (n, *data_shape),
            f"task.measurements={p}",
            f"a .npz whose x0 is [{n}, *{list(data_shape)}] (the clean examples)",
            f"x0 of shape {tuple(x0.shape)}",
        )
        x0 = np.asarray(x0, np.float32)
    return np.asarray(y, np.float32), x0


def describe_operator(task: str, params: dict, measurement, seed: int) -> dict:
    """The operator's description stored in ``measurements.npz`` (key ``operator``, JSON)."""
    op = measurement.operator
    return {
        "task": task,
        "operator": type(op).__name__,
        "params": params,
        "m": int(op.m),
        "data_shape": list(op.data_shape),
        "seed": int(seed),
    }


def _describe_line(d: dict) -> str:
    params = ", ".join(f"{k}={v}" for k, v in (d.get("params") or {}).items())
    return f"task={d.get('task')} ({params}{', ' if params else ''}task.seed={d.get('seed')})"


def method_options(mc: DictConfig, sigma_data: float, measurement) -> tuple[dict, dict]:
    """``({method: source options}, ddrm's sampler options)`` of ``method``.

    Raises:
      ValueError: naming ``method.names`` (empty, repeated or unknown names; ddrm on an
        operator without an SVD or with several noise levels) or ``method.<option>`` (given
        while no chosen method uses it, or out of range).
    """
    names = list(mc.names or [])
    require(
        len(names) >= 1 and len(set(names)) == len(names),
        "method.names",
        f"a list of distinct methods from {sorted(METHODS)}",
        names,
    )
    for n in names:
        require(n in METHODS, "method.names", f"a list of methods from {sorted(METHODS)}", n)
    given = {k: mc.get(k) for k in schema.METHOD_OPTIONS if mc.get(k) is not None}
    for key in given:
        users = schema.METHOD_OPTIONS[key]
        if not set(users) & set(names):
            raise ValueError(
                f"method.{key} is used only by method {' | '.join(users)}; got method.names="
                f"[{','.join(names)}] (remove method.{key} or add {users[0]} to method.names)"
            )
    op = measurement.operator
    if "ddrm" in names:
        require(
            op.svd() is not None and measurement.scalar_noise,
            "method.names",
            f"methods without ddrm for this task: ddrm needs the operator's SVD and one "
            f"sigma_y, which {type(op).__name__} does not have",
            names,
        )
    opts = {}
    for n in names:
        if n == "dps":
            opts[n] = {"zeta": given["zeta"]} if "zeta" in given else {}
        elif n == "pigdm":
            opts[n] = {"sigma_data": given.get("sigma_data", sigma_data)}
        else:
            opts[n] = {}
    ddrm_opts = {
        "eta": check_real(given.get("eta", 0.85), "method.eta", low=0.0, high=1.0),
        "eta_b": check_real(given.get("eta_b", 1.0), "method.eta_b", low=0.0, high=1.0),
    }
    return opts, ddrm_opts


def output_name(plan_parts: dict) -> str:
    """``<task>_<sampler>_<steps>_n<num_images>x<draws>_seed<task.seed>`` plus
    ``+<field>-<value>`` for the methods, each operator parameter, ``sigma_y``, each method
    option given, each sampler field that changes samples (as ``experiments.sample`` names
    them), the sampler's seed when not 0, ``use_ema=false`` and a measurements file (its
    stem and the first 8 hex digits of its SHA-1)."""
    p = plan_parts
    head, extras = sampler_name_parts(p["record"])
    values = [("methods", "_".join(p["methods"]))]
    for k, v in p["params"].items():
        values.append((k, "x".join(map(str, v)) if isinstance(v, list) else v))
    values.append(("sigma_y", p["sigma_y"]))
    values += [(f"method.{k}", v) for k, v in p["method_opts"].items()]
    values += extras
    if p["record"]["seed"] != 0:
        values.append(("sampler.seed", p["record"]["seed"]))
    if p["file"] is not None:
        digest = hashlib.sha1(Path(p["file"]).read_bytes()).hexdigest()[:8]
        values.append(("measurements", f"{Path(p['file']).stem}~{digest}"))
    base = samples_name(
        f"{p['task']}_{head}",
        num_samples=p["num_images"],
        seed=p["seed"],
        extras=values,
        use_ema=p["use_ema"],
    )
    return base.replace(f"_n{p['num_images']}_", f"_n{p['num_images']}x{p['draws']}_", 1)


def plan(cfg: DictConfig, overrides: list[str]) -> Plan:
    """Check every field of an ``experiments.reconstruct`` config and build every object,
    before any checkpoint is read, any sample drawn or any file written.

    Raises:
      ValueError, FileNotFoundError: one line naming the field (``run_dir``, ``task``,
        ``task.<field>``, ``method.<field>``, ``sampler.<field>``).
    """
    kind = check_run_kind(cfg.run_dir)
    run_cfg = read_config(cfg.run_dir)
    tc = cfg.task
    draws = check_int(tc.draws, "task.draws", low=2)
    seed = check_int(tc.seed, "task.seed", low=0)
    n = check_int(tc.num_images, "task.num_images", low=1)
    data = build_data(run_cfg)
    key = jax.random.key(seed)
    measurement, params = build_measurement(tc, data.data_shape, jax.random.fold_in(key, 0))
    methods, ddrm_opts = method_options(cfg.method, float(run_cfg.data.sigma_data), measurement)
    op = measurement.operator
    if tc.measurements:
        describe = describe_operator(tc.name, params, measurement, seed)
        y, truth = load_measurements(tc.measurements, n, op.m, data.data_shape, describe)
    else:
        truth = held_out(data, n)
        y = np.asarray(measurement.measure(jnp.asarray(truth), jax.random.fold_in(key, 1)))
    sampler = sampler_config(cfg, run_cfg, overrides, n * draws)
    run = kind.prepare(cfg.run_dir, cfg.step, sampler)
    prior = run.sampling_source(run.state.params)  # untrained: for the checks only
    for name, opts in methods.items():  # every source's own checks, before any compute
        posterior_source(name, prior, measurement, y, repeats=draws, **opts)
    given = {k: cfg.method[k] for k in schema.METHOD_OPTIONS if cfg.method.get(k) is not None}
    name = output_name(
        {
            "task": tc.name,
            "record": run.sampling.record,
            "methods": list(methods),
            "params": params,
            "sigma_y": float(tc.sigma_y),
            "method_opts": given,
            "num_images": n,
            "draws": draws,
            "seed": seed,
            "use_ema": bool(cfg.use_ema),
            "file": tc.measurements or None,
        }
    )
    return Plan(
        cfg=cfg,
        kind=kind,
        run=run,
        sampler_cfg=sampler,
        task=tc.name,
        params=params,
        measurement=measurement,
        truth=truth,
        y=y,
        draws=draws,
        methods=methods,
        ddrm_opts=ddrm_opts,
        name=name,
        measurements_file=str(tc.measurements) if tc.measurements else None,
    )


# --------------------------------------------------------------------------- compute


def shown_measurement(p: Plan) -> tuple[str, np.ndarray]:
    """``(label, [n, *data_shape])``: the measurement in image space, ``A^+ y`` (``A^T y``
    for the blur, whose pseudo-inverse amplifies the noise without bound)."""
    op = p.measurement.operator
    y = jnp.asarray(p.y)
    if isinstance(op, operators.GaussianBlur):
        return "A^T y", np.asarray(op.At(y))
    return "A^+ y", np.asarray(op.pinv(y))


def draw_method(p: Plan, method: str, params) -> tuple[np.ndarray, dict]:
    """``(draws [n, draws, *data_shape], info)`` of one method (``info``: ``nfe``,
    ``wall_s``, ``num_nonfinite``)."""
    run = p.run
    prior = run.sampling_source(params)
    source = posterior_source(
        method, prior, p.measurement, p.y, repeats=p.draws, **p.methods[method]
    )
    sampling = run.sampling
    if method == "ddrm":
        opts = {**p.ddrm_opts, "float64": sampling.opts.get("float64", False)}

        def sample(src, key, shape, **kw):
            return ddrm(src, key, shape, grid=sampling.grid, **opts, **kw)
    else:
        sample = sampling
    n, shape = p.num_images, tuple(run.data.data_shape)
    x, info = draw_samples(
        sample,
        source,
        jax.random.key(run.cfg.sampler.seed),
        shape,
        num_samples=n * p.draws,
        batch_size=run.cfg.sampler.batch_size,
        progress=True,
        desc=f"{method} ({'ddrm' if method == 'ddrm' else sampling.name})",
    )
    keep = {k: info[k] for k in ("nfe", "steps", "wall_s", "num_nonfinite") if k in info}
    return np.asarray(x).reshape(n, p.draws, *shape), keep


def method_metrics(p: Plan, x: np.ndarray, info: dict) -> dict:
    """The metrics of one method's draws ``x: [n, draws, *shape]`` (mean and std over the
    examples of each per-example value)."""
    op = p.measurement.operator
    n = p.num_images
    mean = x.mean(axis=1)
    std = rm.posterior_std(x)
    ax = np.asarray(op.A(jnp.asarray(x.reshape(n * p.draws, *x.shape[2:])))).reshape(n, p.draws, -1)
    out = {
        "posterior_std": rm.mean_std(std.reshape(n, -1).mean(axis=1)),
        "consistency_draws": rm.mean_std(rm.data_consistency(ax, p.y).mean(axis=1)),
        "consistency_mean": rm.mean_std(
            rm.data_consistency(np.asarray(op.A(jnp.asarray(mean))), p.y)
        ),
        **info,
    }
    if p.truth is not None:
        out["psnr_mean"] = rm.mean_std(rm.psnr(mean, p.truth))
        out["psnr_draw"] = rm.mean_std(rm.psnr(x, p.truth).mean(axis=1))
        out["coverage"] = rm.mean_std(rm.coverage(x, p.truth, level=LEVEL))
        if p.images:
            out["ssim_mean"] = rm.mean_std(rm.ssim(mean, p.truth))
            out["ssim_draw"] = rm.mean_std(rm.ssim(x, p.truth).mean(axis=1))
    return out


def measurement_metrics(p: Plan, label: str, shown: np.ndarray) -> dict:
    """The measurement's own row: the noise level, the truth's residual
    ``||A x0 - y|| / sqrt(m)``, and the quality of the shown ``A^+ y`` (or ``A^T y``)."""
    sigma = np.asarray(p.measurement.sigma_y, np.float64)
    out: dict[str, Any] = {
        "shown_as": label,
        "m": int(p.measurement.operator.m),
        "sigma_y_rms": float(np.sqrt(np.mean(sigma**2))),
    }
    if p.truth is not None:
        ax0 = np.asarray(p.measurement.operator.A(jnp.asarray(p.truth)))
        out["consistency_truth"] = rm.mean_std(rm.data_consistency(ax0, p.y))
        out["psnr"] = rm.mean_std(rm.psnr(shown, p.truth))
        if p.images:
            out["ssim"] = rm.mean_std(rm.ssim(shown, p.truth))
    return out


# --------------------------------------------------------------------------- reports


def _pm(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    m, s = v
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def metrics_table(metrics: dict) -> str:
    """The markdown table of ``metrics.json``: a row per method and one for the measurement."""
    meas = metrics["measurement"]
    calibrated = metrics["calibrated_coverage"]
    head = (
        "| method | PSNR mean (dB) | PSNR draw (dB) | SSIM mean | SSIM draw | "
        f"coverage {int(LEVEL * 100)}% | post. std | ||Ax-y||/√m draws | NFE | wall (s) |"
    )
    rows = [head, "|" + "---|" * 10]
    for name, r in metrics["methods"].items():
        rows.append(
            f"| {name} | {_pm(r.get('psnr_mean'))} | {_pm(r.get('psnr_draw'))} | "
            f"{_pm(r.get('ssim_mean'), 3)} | {_pm(r.get('ssim_draw'), 3)} | "
            f"{_pm(r.get('coverage'), 3)} | {_pm(r['posterior_std'], 3)} | "
            f"{_pm(r['consistency_draws'], 3)} | {r.get('nfe', '-')} | "
            f"{r.get('wall_s', 0.0):.1f} |"
        )
    rows.append(
        f"| measurement ({meas['shown_as']}) | {_pm(meas.get('psnr'))} | - | "
        f"{_pm(meas.get('ssim'), 3)} | - | - | - | "
        f"{_pm(meas.get('consistency_truth'), 3)} (truth) | - | - |"
    )
    task = metrics["task"]
    params = ", ".join(f"{k}={v}" for k, v in task["params"].items())
    notes = [
        f"task={task['name']}" + (f" ({params})" if params else "") + f", m = {meas['m']}, "
        f"sigma_y = {task['sigma_y']:g} (RMS over entries {meas['sigma_y_rms']:.3g}), "
        f"{metrics['num_images']} examples x {metrics['draws']} draws; sampler "
        f"{metrics['sampler']['name']} {metrics['sampler']['steps']} steps "
        f"(ddrm on its grid); checkpoint step {metrics['checkpoint_step']}.",
        "Mean ± std over the examples. PSNR (data range 2) and SSIM (scikit-image) of the "
        "posterior mean and of single draws (each example's mean over its draws) against the "
        "clean examples. Coverage: the fraction of true entries inside the draws' central "
        f"{int(LEVEL * 100)}% interval; calibrated draws cover {calibrated:.3f} with this "
        "many draws, overconfident ones less. Post. std: the mean per-entry posterior std. "
        "||Ax-y||/√m: the draws' RMS measurement residual, beside the truth's own (about "
        "sigma_y). NFE: calls of the conditioned source per sample (dps and pigdm each add "
        "a vector-Jacobian product through the network).",
    ]
    return "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


def _image(ax, img, **kw):
    ax.imshow(img, interpolation="nearest", **kw)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_figure(path: Path, p: Plan, shown: tuple[str, np.ndarray], results: dict) -> None:
    """``figure.png``: images: a column per example (up to :data:`FIGURE_COLUMNS`), rows the
    truth, the measurement (``A^+ y``), then each method's first draw, posterior mean and
    per-pixel std (one colour scale for every std row); flat data: per method, each
    measurement's draws (first two coordinates) beside its truth."""
    plt = pyplot()
    label, meas = shown
    if not p.images:
        _plot_points(plt, path, p, meas, results)
        return
    cols = min(FIGURE_COLUMNS, p.num_images)
    rows: list[tuple[str, np.ndarray, bool]] = []
    if p.truth is not None:
        rows.append(("truth", p.truth[:cols], False))
    rows.append((label, meas[:cols], False))
    for name, (x, _) in results.items():
        rows.append((f"{name}\ndraw 1", x[:cols, 0], False))
        rows.append((f"{name}\nmean", x[:cols].mean(axis=1), False))
        rows.append((f"{name}\nstd", x[:cols].std(axis=1, ddof=1).mean(axis=-1), True))
    vmax = max([float(np.nanmax(r[1])) for r in rows if r[2]] + [1e-6])
    fig, axes = plt.subplots(len(rows), cols, figsize=(1.1 * cols + 0.9, 1.1 * len(rows)))
    axes = np.asarray(axes).reshape(len(rows), cols)
    grey = p.truth.shape[-1] == 1 if p.truth is not None else meas.shape[-1] == 1
    for r, (title, imgs, is_std) in enumerate(rows):
        for c in range(cols):
            ax = axes[r, c]
            if is_std:
                _image(ax, imgs[c], cmap="magma", vmin=0.0, vmax=vmax)
            elif grey:
                _image(ax, np.clip(imgs[c][..., 0], -1, 1), cmap="gray", vmin=-1, vmax=1)
            else:
                _image(ax, (np.clip(imgs[c], -1, 1) + 1) / 2)
            if c == 0:
                ax.set_ylabel(title, fontsize=7)
    fig.suptitle(
        f"{p.task}, sigma_y={float(p.cfg.task.sigma_y):g} (std rows: 0 to {vmax:.2f})", fontsize=8
    )
    save_figure(fig, path)


def _plot_points(plt, path: Path, p: Plan, meas: np.ndarray, results: dict) -> None:
    k = min(FIGURE_COLUMNS, p.num_images)
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 4), squeeze=False)
    for ax, (name, (x, _)) in zip(axes[0], results.items(), strict=True):
        for i in range(k):
            pts = x[i].reshape(p.draws, -1)
            ax.scatter(pts[:, 0], pts[:, 1 % pts.shape[1]], s=6, alpha=0.5, color=f"C{i % 10}")
            if p.truth is not None:
                t = p.truth[i].reshape(-1)
                ax.scatter(t[0], t[1 % t.size], marker="x", s=60, color="k")
        ax.set_title(f"{name}: draws (colour per measurement), truth x", fontsize=8)
        ax.set_aspect("equal", adjustable="datalim")
    save_figure(fig, path)


# --------------------------------------------------------------------------- the command


def reconstruct(cfg: DictConfig, overrides: list[str]) -> Path:
    """Plan (every check), restore the checkpoint, draw each method's posterior samples,
    and write ``measurements.npz``, ``reconstructions_<method>.npz``, ``metrics.json``,
    ``metrics.md``, ``figure.png``, ``config.yaml`` and ``run_info.json`` under
    ``<run_dir>/reconstructions/step<k>/<name>``; prints the table. Returns the directory.

    Raises:
      ValueError, FileNotFoundError: as :func:`plan`, before anything is written.
    """
    configure_jax()
    p = plan(cfg, overrides)
    run_dir = Path(cfg.run_dir)
    configure_jax(run_precision(p.run.cfg))
    state = p.run.restore(run_dir, cfg.step)
    step = int(jax.device_get(state.step))
    params = state.ema_params if cfg.use_ema else state.params
    t0 = time.perf_counter()
    results = {m: draw_method(p, m, params) for m in p.methods}
    shown = shown_measurement(p)
    metrics = {
        "task": {"name": p.task, "params": p.params, "sigma_y": float(cfg.task.sigma_y)},
        "num_images": p.num_images,
        "draws": p.draws,
        "level": LEVEL,
        "calibrated_coverage": rm.calibrated_coverage(p.draws, LEVEL),
        "sampler": p.run.sampling.record,
        "ddrm": p.ddrm_opts if "ddrm" in p.methods else None,
        "checkpoint_step": step,
        "use_ema": bool(cfg.use_ema),
        "measurements_file": p.measurements_file,
        "measurement": measurement_metrics(p, *shown),
        "methods": {m: method_metrics(p, x, info) for m, (x, info) in results.items()},
        "wall_s": time.perf_counter() - t0,
    }
    out = run_dir / "reconstructions" / f"step{step}" / p.name
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, p, metrics, results, shown)
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    resolved.sampler = OmegaConf.to_container(p.sampler_cfg, resolve=True)
    resolved.method.sigma_data = p.methods.get("pigdm", {}).get("sigma_data")
    write_run_info(
        out,
        resolved,
        seed=int(cfg.task.seed),
        extra={"sampler_seed": int(p.run.cfg.sampler.seed), "checkpoint_step": step},
    )
    table = metrics_table(metrics)
    print(table.split("\n\n")[0])
    print(f"reconstructions: {display_path(out)}")
    return out


def write_outputs(out: Path, p: Plan, metrics: dict, results: dict, shown) -> None:
    op = p.measurement.operator
    describe = describe_operator(p.task, p.params, p.measurement, int(p.cfg.task.seed))
    arrays = {
        "y": p.y,
        "sigma_y": np.asarray(p.measurement.sigma_y, np.float32),
        "operator": np.asarray(json.dumps(describe)),
        "pinv_y" if shown[0] == "A^+ y" else "At_y": shown[1].astype(np.float32),
    }
    if p.truth is not None:
        arrays["x0"] = p.truth
    if isinstance(op, operators.Inpainting):
        arrays["mask"] = np.asarray(op.mask)
    atomic_savez(out / "measurements.npz", **arrays)
    for name, (x, _) in results.items():
        atomic_savez(
            out / f"reconstructions_{name}.npz",
            reconstructions=x.astype(np.float32),
            mean=x.mean(axis=1).astype(np.float32),
            std=rm.posterior_std(x).astype(np.float32),
        )
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2, default=float))
    atomic_write_text(out / "metrics.md", metrics_table(metrics))
    plot_figure(out / "figure.png", p, shown, results)


__all__ = ["Plan", "plan", "reconstruct", "output_name", "metrics_table"]
