"""SURE-Score's reconstruction claim in miniature:
``python -m experiments.reproduce table=sure_reconstruct``.

Aali, Arvinte, Kumar and Tamir, "Solving inverse problems with score-based generative
priors learned from noisy data", arXiv 2305.01166: a score prior learned from training data
corrupted by known Gaussian noise (SURE-Score, ``scorelib.objectives.SURE``) reconstructs
from measurements nearly as well as a prior learned from clean data, and better than a
prior learned naively from the noisy data.

The priors are the models of ``table=sure`` (:func:`experiments.tables.sure.models`: the same
``table.overrides``, ``table.sure`` and slugs), per training seed of ``table.seeds`` and
noise level ``sigma_n`` of ``table.noise_levels``: DSM on the clean digits (once per seed),
DSM on the noisy digits (the naive prior) and SURE-Score on the same noisy digits. Each
reconstructs the same ``task.num_images`` held-out clean test digits from the same
measurements ``y = A x0 + sigma_y n`` (``task.seed`` fixed) of every task of
``table.tasks`` (compressed sensing and box inpainting by default) with each method of
``method.names`` (PiGDM and DPS by default), through ``experiments.reconstruct`` itself
(:func:`experiments.runs.reconstruction.reconstruct`, on each run's own sampler and grid;
its outputs stay under each run's ``reconstructions/``). PSNR and SSIM are those of the
posterior mean (the mean of ``task.draws`` draws) against the clean digits
(``scorelib.metrics.reconstruction``).

The claim is checked per task, noise level and method by the share of the clean-minus-naive
PSNR gap that the SURE prior recovers, ``(PSNR_SURE - PSNR_naive) / (PSNR_clean -
PSNR_naive)``, per training seed (paired: same measurements, same sampler noise): "holds"
when it exceeds ``table.most`` in every seed, "fails" when it is below in every seed,
"mixed" otherwise, and "no gap" where, in some seed, the clean prior does not beat the naive
one by twice the standard error of their paired per-example PSNR difference (nothing to
recover). This module composes library runs and reports.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments.build import build_data
from experiments.runs.layout import pyplot, save_figure
from experiments.runs.reconstruction import build_measurement, method_options, reconstruct
from experiments.tables import sure
from experiments.tables.common import check_seeds, compose_config, pm, quoted_path, scaled
from experiments.tables.digits_models import check, compose, slug, train_model
from scorelib._checks import check_real, require
from scorelib._io import atomic_write_text
from scorelib.metrics import reconstruction as rm

PAPER = (
    "a prior trained on noisy data alone by SURE-Score reconstructs close to one trained on "
    "clean data and better than one trained naively on the noisy data (MIMO, MRI)"
)
#: The three priors per noise level, in the table's order (clean once per seed).
CLEAN, NAIVE, SURE = sure.DSM_CLEAN, sure.DSM_NOISY, sure.SURE
#: Examples shown per task in the figure.
FIGURE_COLUMNS = 8


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError: naming ``table.<field>`` (a noise level <= 0, seeds that are not distinct
        integers, ``table.most`` outside (0, 1), no task, a task or reconstruction override
        that does not compose or is out of range, e.g. ``task.m`` outside ``1..64``) or,
        from Hydra, a bad training override.
    """
    tc = scaled(cfg, base="small")
    require(bool(tc.noise_levels), "table.noise_levels", "a list of noise levels > 0", [])
    for s in tc.noise_levels:
        check_real(s, "table.noise_levels", low=0.0, low_open=True, high_open=True)
    seeds = check_seeds(tc.seeds)
    check_real(tc.most, "table.most", low=0.0, high=1.0, low_open=True, high_open=True)
    require(
        OmegaConf.is_dict(tc.tasks) and len(tc.tasks) > 0,
        "table.tasks",
        "a mapping {label: [experiments.reconstruct task overrides]} with at least one task",
        OmegaConf.to_container(tc.tasks) if OmegaConf.is_config(tc.tasks) else tc.tasks,
    )
    trainings = sure.models(tc, seeds[0])
    for _, overrides in trainings.values():
        check(overrides)  # a bad training override fails here, before any training
    data = build_data(compose(next(iter(trainings.values()))[1]))
    for label in tc.tasks:
        rc = reconstruct_config("unchecked", tc, label)
        require(
            not rc.task.measurements,
            f"table.tasks.{label}",
            "overrides that measure the test digits (no task.measurements)",
            rc.task.measurements,
        )
        # each operator built and each method's options checked, as experiments.reconstruct does
        try:
            measurement, _ = build_measurement(rc.task, data.data_shape, jax.random.key(0))
            method_options(rc.method, 1.0, measurement)
        except ValueError as e:
            raise ValueError(f"table.tasks.{label}: {e}") from None
    return tc


def reconstruct_overrides(run_path, tc: DictConfig, label: str) -> list[str]:
    """The ``experiments.reconstruct`` command line of task ``label`` on the run at
    ``run_path``."""
    return [f"run_dir={quoted_path(run_path)}", *tc.tasks[label], *tc.reconstruct]


def reconstruct_config(run_path, tc: DictConfig, label: str) -> DictConfig:
    """The composed ``experiments.reconstruct`` config of task ``label``.

    Raises:
      ValueError: naming ``table.tasks.<label>`` for overrides that do not compose.
    """
    try:
        return compose_config("reconstruct", reconstruct_overrides(run_path, tc, label))
    except Exception as e:  # Hydra's composition errors, as one line naming the field
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"table.tasks.{label} (with table.reconstruct) must compose as "
            f"experiments.reconstruct overrides; got {first}"
        ) from None


def posterior_means(out: Path, methods) -> tuple[np.ndarray, dict, dict]:
    """``(x0 [n, *shape], {method: posterior mean [n, *shape]}, metrics.json)`` of one
    ``experiments.reconstruct`` output directory."""
    with np.load(out / "measurements.npz") as f:
        x0 = np.asarray(f["x0"], np.float64)
    means = {}
    for m in methods:
        with np.load(out / f"reconstructions_{m}.npz") as f:
            means[m] = np.asarray(f["mean"], np.float64)
    return x0, means, json.loads((out / "metrics.json").read_text())


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Train (or find) every prior, reconstruct every task with every method; writes
    ``results.json`` and ``figure.png`` into ``run_dir``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    methods = None
    results, measured, figure = [], {}, {}
    for seed in (int(s) for s in tc.seeds):
        for (sigma_n, label), (name, overrides) in sure.models(tc, seed).items():
            path = run_dir / "runs" / slug(name)
            train_model(overrides, path, log)  # trained here, or found complete
            for task in tc.tasks:
                rc = reconstruct_config(path, tc, task)
                methods = list(rc.method.names)
                out = reconstruct(rc, reconstruct_overrides(path, tc, task))
                x0, means, metrics = posterior_means(out, methods)
                measured.setdefault(task, metrics["measurement"])
                for m, mean in means.items():
                    psnr = rm.psnr(mean, x0)
                    ssim = rm.ssim(mean, x0)
                    r = metrics["methods"][m]
                    results.append(
                        {
                            "seed": seed,
                            "sigma_n": sigma_n,
                            "model": label,
                            "task": task,
                            "method": m,
                            "psnr": float(psnr.mean()),
                            "ssim": float(ssim.mean()),
                            "psnr_draw": r["psnr_draw"][0],
                            "coverage": r["coverage"][0],
                            "psnr_per_example": psnr.tolist(),
                            "reconstructions": str(out.relative_to(run_dir)),
                        }
                    )
                    if seed == int(tc.seeds[0]) and m == methods[0]:
                        key = label if sigma_n is None else f"{label}, sigma_n {sigma_n:g}"
                        figure.setdefault(task, {"truth": x0[:FIGURE_COLUMNS]})[key] = mean[
                            :FIGURE_COLUMNS
                        ]
                log(
                    f"[{name}] {task}: "
                    + ", ".join(
                        f"{r['method']} PSNR {r['psnr']:.2f} dB" for r in results[-len(methods) :]
                    )
                )
    atomic_write_text(
        run_dir / "results.json",
        json.dumps({"rows": results, "measurement": measured}, indent=1, default=str),
    )
    fig = run_dir / "figure.png"
    make_figure(figure, fig, methods[0])
    return report(results, measured, tc, fig)


def gap_share(clean: float, naive: float, method: float) -> float:
    """The share of the clean-minus-naive gap that ``method`` recovers, ``(method - naive) /
    (clean - naive)`` (1: as good as the clean prior, 0: as the naive one); ``nan`` when
    there is no gap (``clean <= naive``)."""
    gap = clean - naive
    return (method - naive) / gap if gap > 0 else math.nan


def resolved_gap(clean_per_example, naive_per_example) -> bool:
    """Whether the clean prior beats the naive one on these examples: the mean paired PSNR
    difference exceeds twice its standard error over the examples."""
    d = np.asarray(clean_per_example, float) - np.asarray(naive_per_example, float)
    return bool(d.mean() > 2.0 * d.std(ddof=1) / math.sqrt(d.size))


def verdict(shares, resolved, most: float) -> str:
    """The claim's verdict from the per-seed gap shares and whether each seed's gap is
    resolved (:func:`resolved_gap`)."""
    s = np.asarray(shares, float)
    if not all(resolved) or np.isnan(s).any():
        return (
            "no gap: the clean prior does not beat the naive one by 2 s.e. in every seed, "
            "so there is nothing to recover"
        )
    if (s > most).all():
        return f"holds: recovers more than {most:g} of the gap in every seed"
    if (s < most).all():
        return f"fails: recovers less than {most:g} of the gap in every seed"
    return f"mixed: above {most:g} in some seeds, below in others"


def _cell(values) -> str | float | None:
    v = np.asarray(values, float)
    if v.size == 0:
        return None
    return float(v[0]) if v.size == 1 else pm(v.mean(), v.std())


def report(results: list, measured: dict, tc: DictConfig, fig: Path) -> dict:
    """Two tables: PSNR and SSIM per task, prior and method; the gap shares and verdicts."""
    methods = list(dict.fromkeys(r["method"] for r in results))
    seeds = [int(s) for s in tc.seeds]
    levels = [float(s) for s in tc.noise_levels]

    def pick(task, model, sigma_n, method, key):
        return [
            r[key]
            for s in seeds
            for r in results
            if (r["seed"], r["task"], r["model"], r["sigma_n"], r["method"])
            == (s, task, model, sigma_n, method)
        ]

    cols = ["task", "sigma_n (data units)", "prior"]
    for m in methods:
        cols += [f"PSNR {m} (dB)", f"SSIM {m}"]
    rows = []
    for task in tc.tasks:
        order = [(None, CLEAN)] + [(s, lab) for s in levels for lab in (NAIVE, SURE)]
        for sigma_n, model in order:
            row = [task, "clean" if sigma_n is None else sigma_n, model]
            for m in methods:
                row += [_cell(pick(task, model, sigma_n, m, "psnr"))]
                row += [_cell(pick(task, model, sigma_n, m, "ssim"))]
            rows.append(row)
        meas = measured[task]
        shown = f"measurement only ({meas['shown_as']})"
        rows.append(
            [task, "-", shown] + [meas["psnr"][0], meas.get("ssim", [None])[0]] * len(methods)
        )
    gap_cols = [
        "task",
        "sigma_n (data units)",
        "method",
        "PSNR clean prior",
        "PSNR naive (DSM, noisy)",
        "PSNR SURE",
        "SURE - naive (dB, paired)",
        "gap share recovered",
        "verdict",
        "paper",
    ]
    gap_rows = []
    for task in tc.tasks:
        for s in levels:
            for m in methods:
                clean = pick(task, CLEAN, None, m, "psnr")
                naive = pick(task, NAIVE, s, m, "psnr")
                ours = pick(task, SURE, s, m, "psnr")
                shares = [gap_share(c, n, o) for c, n, o in zip(clean, naive, ours, strict=True)]
                resolved = [
                    resolved_gap(c, n)
                    for c, n in zip(
                        pick(task, CLEAN, None, m, "psnr_per_example"),
                        pick(task, NAIVE, s, m, "psnr_per_example"),
                        strict=True,
                    )
                ]
                finite = [x for x in shares if not math.isnan(x)]
                gap_rows.append(
                    [
                        task,
                        s,
                        m,
                        _cell(clean),
                        _cell(naive),
                        _cell(ours),
                        _cell(np.subtract(ours, naive)),
                        _cell(finite),
                        verdict(shares, resolved, float(tc.most)),
                        "" if gap_rows else PAPER,
                    ]
                )
    first = results[0]
    notes = [
        f"Priors: the models of table=sure (experiments.train with {list(tc.overrides)}, "
        f"trainer.seed over the seeds {seeds}; SURE-Score adds {list(tc.sure)} and "
        "data.noise_sigma; DSM rows objective=edm, on the clean or the noisy digits).",
        "Reconstructions: experiments.reconstruct on each prior with "
        f"{list(tc.reconstruct)} and each task's overrides "
        + "; ".join(f"{k}: {list(v)}" for k, v in tc.tasks.items())
        + ". Every prior sees the same measurements of the same held-out test digits and "
        "the same sampler noise, on its own sampler and grid (the run's, as table=sure "
        "samples).",
        "PSNR (data range 2) and SSIM (scikit-image) of the posterior mean (the mean of "
        "task.draws draws) against the clean test digits: the mean over the examples, then "
        "mean ± std over the training seeds. The measurement-only row is A^+ y (no prior).",
        "Gap share: (PSNR_SURE - PSNR_naive) / (PSNR_clean - PSNR_naive) per seed (1: the "
        "clean prior's quality, 0: the naive prior's), mean ± std over the seeds; "
        f"verdict 'holds' when above table.most = {float(tc.most):g} in every seed, 'no "
        "gap' where the clean prior does not beat the naive one by twice the standard error "
        "of the paired per-example PSNR difference in some seed. "
        "SURE - naive is the paired difference per seed.",
        f"Reconstruction files of each prior: <run>/{first['reconstructions']} and siblings "
        "(measurements.npz, reconstructions_<method>.npz, metrics.md, figure.png).",
        "The paper column paraphrases the paper's claim; its experiments (multi-coil MRI, "
        "MIMO channels, annealed Langevin posterior sampling) use other data, so none of its "
        "numbers is comparable.",
    ]
    return {
        "seeds": seeds,
        "tables": [
            {
                "name": "psnr",
                "caption": "Reconstructions of held-out clean digits with priors learned from "
                "clean digits, naively from noisy digits (DSM) and by SURE-Score from the "
                "same noisy digits.",
                "columns": cols,
                "rows": rows,
            },
            {
                "name": "gap",
                "caption": "The share of the clean-vs-naive reconstruction gap the SURE prior "
                "recovers, with the paper's claim checked.",
                "columns": gap_cols,
                "rows": gap_rows,
            },
        ],
        "notes": notes,
        "figure": str(fig),
    }


def make_figure(panels: dict, path: Path, method: str) -> None:
    """Per task: the truth row, then each prior's posterior mean (``method``) of the first
    examples of the first seed."""
    plt = pyplot()
    rows = [(task, k, imgs) for task, group in panels.items() for k, imgs in group.items()]
    cols = max(len(imgs) for _, _, imgs in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(1.0 * cols + 2.6, 0.95 * len(rows)))
    axes = np.asarray(axes).reshape(len(rows), cols)
    for r, (task, label, imgs) in enumerate(rows):
        for c in range(cols):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c < len(imgs):
                ax.imshow(np.clip(imgs[c][..., 0], -1, 1), cmap="gray", vmin=-1, vmax=1)
            if c == 0:
                ax.set_ylabel(f"{task}\n{label}", fontsize=6, rotation=0, ha="right", va="center")
    fig.suptitle(f"posterior means ({method}), first training seed", fontsize=8)
    save_figure(fig, path)
