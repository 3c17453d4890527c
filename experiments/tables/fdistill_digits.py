"""f-distill on the digits: ``python -m experiments.reproduce table=fdistill_digits``.

The teacher is an ``experiments.train`` run of the digits (``table.teacher``, or the main
job trained here into ``<run_dir>/teacher``); each student is an ``experiments.distill``
run of the preset ``experiment=fdistill_digits`` (``<run_dir>/runs/<name>_seed<s>``,
resumed or reused if present), one per divergence and seed, and one per entry of
``table.variants`` (a divergence with extra overrides, e.g. the refining stage) and seed.
Rows: the teacher at 35 NFE (Heun) and at few NFE (DPM-Solver++(2M), each at the best of
``table.few_step_sigma_min``: the EDM grid's lowest positive level before the final step to
0, chosen by FD), the students, and the floor of each metric (draws of training images);
columns: FD in classifier features against the test digits, the classifier two-sample test
and recall in pixels and in features, the copy rate, and the paper's CIFAR-10 FID (Xu, Nie
and Vahdat 2025, Table 2) for reference; notes check the paper's ordering (the divergences
weighting where the teacher has more mass beat reverse-KL) against the spread over seeds.
The module runs the library and reports; every number comes from
``experiments.runs.evaluation.evaluate_images``.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf
from scipy import stats

from experiments.build import Sampling
from experiments.runs import DistillRun, load_run, train_run
from experiments.runs.evaluation import evaluate_images
from experiments.runs.layout import pyplot, save_figure
from experiments.tables.common import (
    check_digits_run,
    check_seeds,
    compose_config,
    given_or_trained,
    paired_cell,
    paired_difference,
    paired_verdict,
    run_revision,
    scaled,
    seed_cell,
)
from scorelib import distill
from scorelib._checks import check_real
from scorelib._io import atomic_write_text
from scorelib.data.images import quantise
from scorelib.metrics import fd_features, pooled_std, seeds_needed
from scorelib.metrics.classifier import ClassifierConfig, FeatureExtractor, default_cache_dir
from scorelib.samplers import draw_samples, get_sampler, make_grid

#: CIFAR-10 one-step FID and the teacher's (Xu et al. 2025, Table 2), for reference.
PAPER_FID = {
    "teacher_35": 1.79,
    "rkl": 2.13,
    "sf": 2.21,
    "sh": 1.99,
    "js": 2.00,
    "jf": 2.05,
    "kl": 1.92,
}

#: CIFAR-10 one-step recall and the teacher's (Xu et al. 2025, Table 2), for reference.
PAPER_RECALL = {
    "teacher_35": 0.63,
    "rkl": 0.60,
    "sf": 0.60,
    "sh": 0.63,
    "js": 0.62,
    "jf": 0.62,
    "kl": 0.62,
}


#: The key suffix of a student's row sampled from its raw (not averaged) weights.
RAW = "_raw"


def _settings(cfg: DictConfig) -> DictConfig:
    tc = scaled(cfg)
    for d in tc.divergences:
        distill.check_divergence(d, "table.divergences")
    if tc.teacher is not None:
        check_digits_run("table.teacher", tc.teacher)
    check_seeds(tc.seeds)
    for s_min in tc.few_step_sigma_min:
        check_real(s_min, "table.few_step_sigma_min", low=0.0, low_open=True)
    names = list(tc.divergences)
    for i, v in enumerate(tc.variants):
        field = f"table.variants[{i}]"
        if set(v) != {"name", "divergence", "overrides"}:
            raise ValueError(
                f"{field} must have the keys name, divergence, overrides; got {list(v)}"
            )
        if not OmegaConf.is_list(v.overrides) or not all(isinstance(o, str) for o in v.overrides):
            raise ValueError(f"{field}.overrides must be a list of overrides; got {v.overrides!r}")
        if (
            not re.fullmatch(r"[a-z0-9_]+", str(v.name))
            or v.name in names
            or str(v.name).endswith(RAW)
        ):
            raise ValueError(
                f"{field}.name must be a new name of lowercase letters, digits and _ (not one of "
                f"{names}, not ending in {RAW}: the raw rows' suffix); got {v.name!r}"
            )
        names.append(v.name)
        distill.check_divergence(v.divergence, f"{field}.divergence")
    if tc.get("baseline") is not None and tc.baseline not in names:
        raise ValueError(
            f"table.baseline must be a student of the table ({names}) or null; got {tc.baseline!r}"
        )
    return tc


def students(tc) -> list[tuple[str, str, list[str]]]:
    """``(name, divergence, extra overrides)`` of each student a seed trains: one per
    ``table.divergences`` (named by it), then ``table.variants``."""
    return [(d, d, []) for d in tc.divergences] + [
        (v.name, v.divergence, list(v.overrides)) for v in tc.variants
    ]


def check_teacher(tc, run_dir: Path) -> None:
    """Refuse ``table.teacher`` (a run of the digits: ``_settings``) before any compute
    unless every student config builds on it (its data shape and model checked by
    ``experiments.distill``).

    Raises:
      ValueError, FileNotFoundError: ``table.teacher=<run>: ...``.
    """
    for _, d, extra in students(tc):
        try:
            DistillRun.build(student_config(tc, d, int(tc.seeds[0]), Path(tc.teacher), extra))
        except (ValueError, FileNotFoundError) as e:
            raise type(e)(f"table.teacher={tc.teacher}: {e}") from e


def teacher_samples(teacher_dir: Path, tc, seed: int, log) -> tuple[dict, Any, dict]:
    """``({row: samples}, run, {nfe: sigma_min})`` of the teacher: Heun at 35 NFE on the
    EDM grid down to the teacher run's own ``sampler.sigma_min`` (0.002 when its sampler
    has none), and DPM-Solver++(2M) at each few-step NFE on the EDM grid whose lowest
    positive level (before the final step to 0) is the one of ``table.few_step_sigma_min``
    with the lowest FD against the test digits.

    With the default 0.002 the 2-step grid is [80, 0.002, 0]: its first step already lands
    at 0.002 and the second changes nothing (the 1-NFE sample again), so the few-step
    rows would not be the teacher's best few-step sampler. The choice is made on the test
    split the rows are reported on: it favours the teacher.
    """
    run, state = load_run(teacher_dir)
    source = run.source(state.ema_params)
    ext = FeatureExtractor.load_or_train(ClassifierConfig(), default_cache_dir(os.environ))
    test_feats = ext.features(run.data.images.test)

    def draw(name, steps, sigma_min):
        grid = make_grid("edm", steps, run.process, sigma_min=sigma_min)
        sampling = Sampling(name, get_sampler(name), grid, {"float64": False})
        return draw_samples(
            sampling,
            source,
            jax.random.key(seed),
            run.data.data_shape,
            num_samples=int(tc.samples),
            batch_size=int(tc.batch_size),
        )

    # the teacher run's own lowest level when it samples on the EDM grid (the digits preset
    # ends at sigma 0.1), else EDM's 0.002
    own = run.cfg.sampler
    heun_min = 0.002
    if own.get("grid") == "edm" and own.get("sigma_min") is not None:
        heun_min = float(own.sigma_min)
    x, info = draw("heun", int(tc.teacher_heun_steps), heun_min)
    label = "teacher, Heun" + (f", sigma_min {heun_min:g}" if heun_min != 0.002 else "")
    rows = {(label, int(info["nfe"]), True): x}
    log(f"[teacher] Heun NFE {info['nfe']} sigma_min {heun_min:g}")
    chosen = {}
    for n in tc.few_step_nfe:
        best = None
        for s_min in tc.few_step_sigma_min if n > 1 else [0.002]:  # 1 step: [80, 0]
            x, info = draw("dpmpp_2m", int(n), float(s_min))
            fd = fd_features(ext.features(quantise(x, run.data.images.levels)), test_feats)
            log(f"[teacher] DPM-Solver++(2M) NFE {info['nfe']} sigma_min {s_min}: FD {fd:.4g}")
            if best is None or fd < best[0]:
                best = (fd, float(s_min), x, int(info["nfe"]))
        _, s_min, x, nfe = best
        chosen[nfe] = s_min
        label = "teacher, DPM-Solver++(2M)" + (f", sigma_min {s_min:g}" if n > 1 else "")
        rows[(label, nfe, False)] = x
    return rows, run, chosen


def student_config(
    tc, divergence: str, seed: int, teacher_dir: Path, extra: Sequence[str] = ()
) -> DictConfig:
    """The ``experiments.distill`` config of the student of ``divergence`` and ``seed``
    (``trainer.seed``): the preset ``experiment=fdistill_digits`` with ``table.overrides``,
    then ``extra`` (a variant's)."""
    overrides = [
        "experiment=fdistill_digits",
        f"teacher.run_dir={teacher_dir}",
        f"distill.divergence={divergence}",
        f"trainer.seed={seed}",
        *tc.overrides,
        *extra,
    ]
    return compose_config("distill", overrides)


def student(tc, name: str, divergence: str, extra, seed: int, teacher_dir: Path, run_dir, log):
    """The trained student (``<run_dir>/runs/<name>_seed<seed>``, resumed or reused)."""
    out = run_dir / "runs" / f"{name}_seed{seed}"
    log(f"[{name} seed {seed}] {out.relative_to(run_dir)}")
    cfg = student_config(tc, divergence, seed, teacher_dir, extra)
    return train_run(DistillRun, cfg, out, progress=False, handle_signals=False, tensorboard=False)


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Teacher, students (one per divergence and seed), metrics; writes ``results.json``
    and ``figure.png``. Seed ``s`` trains the students with ``trainer.seed=s`` and draws
    every row's samples with sampling seed ``s``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    if tc.teacher is not None:
        check_teacher(tc, run_dir)
    teacher_dir = given_or_trained(tc.teacher, tc.teacher_overrides, run_dir / "teacher", log)
    results, figs, chosen = [], {}, {}
    for seed in map(int, tc.seeds):
        rows, trun, chosen[seed] = teacher_samples(teacher_dir, tc, seed, log)
        train_s = {}
        for name, d, extra in students(tc):
            srun, state = student(tc, name, d, extra, seed, teacher_dir, run_dir, log)
            train_s[name] = training_seconds(run_dir / "runs" / f"{name}_seed{seed}")
            nfe = distill.generator_nfe(srun.dcfg.sigma_refine)
            label = f"student, {distill.describe(d)}" + "".join(f", {o}" for o in extra)
            draws = [("", name, state.ema_params)]
            if tc.get("raw_rows", False):  # the same student's raw (not averaged) weights
                draws.append((", no EMA", f"{name}{RAW}", state.params["student"]))
            for suffix, key, params in draws:
                x = srun.sample(params, int(tc.samples), seed, int(tc.batch_size))
                rows[(label + suffix, nfe, key)] = x
        for (label, nfe, key), x in rows.items():
            log(f"[seed {seed}] evaluating {label} ({nfe} NFE)")
            r = evaluate_images(
                x, trun.data.images, "digits", seed=seed, strong_c2st=bool(tc.strong_c2st)
            )
            r.update(
                label=label,
                nfe=nfe,
                key=key if isinstance(key, str) else ("teacher_35" if key else None),
                seed=seed,
                train_s=train_s.get(key.removesuffix(RAW)) if isinstance(key, str) else None,
            )
            results.append(r)
            if seed == int(tc.seeds[0]):
                figs[f"{label} ({nfe} NFE)"] = x[:64]
    atomic_write_text(run_dir / "results.json", json.dumps(results, indent=1, default=str))
    fig = run_dir / "figure.png"
    make_figure(figs, fig)
    return report(results, tc, teacher_dir, fig, chosen, run_dir)


def training_seconds(student_dir: Path) -> float | None:
    """The wall time of a student's training from its ``metrics.jsonl``: the loop's clock
    ``time_s`` (compilation, steps, logs and checkpoints), which restarts at each resumption,
    summed over the segments (the last value before each drop, and the final one). Lines
    that do not parse (a line cut by a kill) are skipped; ``None`` without any."""
    path = Path(student_dir) / "metrics.jsonl"
    if not path.exists():
        return None
    times = []
    for line in path.read_text().splitlines():
        try:
            t = json.loads(line).get("time_s")
        except (json.JSONDecodeError, AttributeError):
            continue
        if t is not None:
            times.append(float(t))
    if not times:
        return None
    ends = [a for a, b in zip(times, times[1:], strict=False) if b < a]
    return float(sum(ends) + times[-1])


def teacher_note(tc, teacher_dir: Path, run_dir: Path) -> str:
    """Where the teacher came from, as the command or relative to the run (no absolute
    paths), with the revision its run recorded."""
    rev = run_revision(teacher_dir)
    if tc.teacher is not None:
        return f"Teacher: `table.teacher={tc.teacher}` (an experiments.train run at revision {rev})"
    return (
        f"Teacher: trained in this run (`teacher/`, experiments.train with "
        f"{list(tc.teacher_overrides)}, revision {rev})"
    )


#: The divergences whose weight ``h(r) = f''(r) r^2`` grows with ``r = p / q``: they weight
#: the regions where the teacher has more mass than the student (Xu et al. 2025, Table 1 and
#: Section 4: these beat reverse-KL, ``h = 1``, on CIFAR-10).
TEACHER_MASS = ("kl", "jf", "js", "sh")

#: The table's metrics of the paper's ordering: key of :func:`evaluate_images`, name, and
#: whether lower is better.
ORDER_METRICS = (
    ("c2st_pixels_samples", "pixel C2ST", True),
    ("recall_pixels_samples", "pixel recall", False),
    ("fd", "FD", True),
)
ORDER_KEYS = tuple(key for key, _, _ in ORDER_METRICS)


def paper_ordering(values: dict[str, Sequence[float]], lower_is_better: bool) -> dict:
    """Each divergence of :data:`TEACHER_MASS` in ``values`` against reverse-KL: ``{name:
    (difference of means, Welch's two-sided p, verdict)}``, the difference signed so that
    positive is better than reverse-KL; the verdict ``'better'`` or ``'worse'`` where
    p < 0.05, else ``'within the seeds' spread'``.

    Args:
      values: ``{divergence: per-seed values}``, with ``'rkl'``; at least 2 seeds each.
      lower_is_better: whether a lower value is better (FD, C2ST) or a higher (recall).

    Raises:
      ValueError: without ``'rkl'`` or with fewer than 2 values of a compared divergence.
    """
    if "rkl" not in values:
        raise ValueError("the paper's ordering compares with reverse-KL: 'rkl' has no values")
    out = {}
    for d in TEACHER_MASS:
        if d not in values:
            continue
        a, b = np.asarray(values[d], float), np.asarray(values["rkl"], float)
        if min(a.size, b.size) < 2:
            raise ValueError(f"the ordering needs at least 2 seeds per divergence; {d}: {a.size}")
        diff = float(b.mean() - a.mean()) if lower_is_better else float(a.mean() - b.mean())
        if np.array_equal(a, b):  # no difference at all (scipy's p is nan there)
            p = 1.0
        else:
            p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
        verdict = (
            "within the seeds' spread" if not p < 0.05 else ("better" if diff > 0 else "worse")
        )
        out[d] = (diff, p, verdict)
    return out


#: How the paper's CIFAR-10 gap between a divergence and reverse-KL is scaled to this table:
#: its relative size, ``(FID_rkl - FID_d) / FID_rkl`` (recall: ``(R_d - R_rkl) / R_rkl``),
#: times reverse-KL's mean here: of FD, of pixel recall, and of pixel C2ST's excess over
#: chance (``C2ST - 0.5``).
PAPER_GAP_RULE = "the paper's relative FID gap on FD and C2ST - 0.5, its recall gap on recall"


#: The most seeds :func:`paper_gap_seeds` looks for.
MAX_SEEDS = 10_000


def paper_gap_seeds(by_div: dict[str, list[dict]]) -> dict[str, dict[str, int | str]]:
    """For each metric of :data:`ORDER_METRICS` and each divergence of
    :data:`TEACHER_MASS` with results, the seeds per divergence that a two-sided t-test
    (alpha 0.05, power 0.8; :func:`scorelib.metrics.seeds_needed`) needs to detect the
    paper's gap to reverse-KL scaled to this table (:data:`PAPER_GAP_RULE`), with the
    pooled standard deviation over seeds of the two (:func:`scorelib.metrics.pooled_std`),
    or why there is no number: the paper reports no gap in that direction, no spread here,
    or more than :data:`MAX_SEEDS`. Empty without ``'rkl'`` or with one seed."""
    if "rkl" not in by_div or len(by_div["rkl"]) < 2:
        return {}
    out = {}
    for key, name, _ in ORDER_METRICS:
        base = np.array([r[key] for r in by_div["rkl"]], float)
        per = {}
        for d in TEACHER_MASS:
            if d not in by_div or len(by_div[d]) < 2:
                continue
            if key == "recall_pixels_samples":
                gap = (PAPER_RECALL[d] - PAPER_RECALL["rkl"]) / PAPER_RECALL["rkl"]
                delta = gap * base.mean()
            else:
                gap = (PAPER_FID["rkl"] - PAPER_FID[d]) / PAPER_FID["rkl"]
                delta = gap * (base.mean() - (0.5 if key.startswith("c2st") else 0.0))
            pooled = pooled_std(base, [r[key] for r in by_div[d]])
            if gap <= 0:
                per[d] = "no gap in the paper"
            elif pooled == 0:
                per[d] = "2 (no spread here)"
            else:
                n = seeds_needed(delta, pooled, max_n=MAX_SEEDS)
                per[d] = f"more than {MAX_SEEDS}" if n is None else n
        out[name] = per
    return out


def report(results: list, tc, teacher_dir: Path, fig: Path, chosen=None, run_dir=None) -> dict:
    labels = list(dict.fromkeys((r["label"], r["nfe"]) for r in results))
    cols = [
        "model",
        "NFE",
        "FD (digits classifier)",
        "FD / teacher-35 FD",
        "C2ST pixels",
        "C2ST features",
        "recall pixels",
        "recall features",
        "copy rate",
        "CIFAR-10 FID (paper)",
        "CIFAR-10 recall (paper)",
    ]
    strong = all("c2st_pixels_strong_samples" in r for r in results)
    if strong:
        cols.insert(5, "C2ST pixels (2x boosting)")
    cols.append("training s")
    teacher_fd = np.mean([r["fd"] for r in results if r["key"] == "teacher_35"])
    rows = []
    for label, nfe in labels:
        rs = [r for r in results if (r["label"], r["nfe"]) == (label, nfe)]
        rows.append(
            [
                label,
                nfe,
                seed_cell(rs, "fd"),
                float(np.mean([r["fd"] for r in rs]) / teacher_fd),
                seed_cell(rs, "c2st_pixels_samples"),
                seed_cell(rs, "c2st_features_samples"),
                seed_cell(rs, "recall_pixels_samples"),
                seed_cell(rs, "recall_features_samples"),
                seed_cell(rs, "mem_copy_rate"),
                PAPER_FID.get(rs[0]["key"]),
                PAPER_RECALL.get(rs[0]["key"]),
            ]
        )
        if strong:
            rows[-1].insert(5, seed_cell(rs, "c2st_pixels_strong_samples"))
        times = [r["train_s"] for r in rs if r.get("train_s") is not None]
        rows[-1].append(float(np.mean(times)) if times else None)
    first = [r for r in results if r["label"] == labels[0][0]]
    rows.append(
        [
            "training images (floor)",
            None,
            seed_cell(first, "fd_floor"),
            None,
            seed_cell(first, "c2st_pixels_floor"),
            seed_cell(first, "c2st_features_floor"),
            seed_cell(first, "recall_pixels_floor"),
            seed_cell(first, "recall_features_floor"),
            seed_cell(first, "mem_reference_copy_rate"),
            None,
            None,
            None,
        ]
    )
    if strong:
        rows[-1].insert(5, seed_cell(first, "c2st_pixels_strong_floor"))
    n_seeds = len(tc.seeds)
    seeds = f"mean ± std over seeds {list(tc.seeds)}" if n_seeds > 1 else f"seed {tc.seeds[0]}"
    notes = [
        f"{teacher_note(tc, teacher_dir, run_dir)}; students: `experiments.distill "
        f"experiment=fdistill_digits trainer.seed=<seed>` with the overrides "
        f"{list(tc.overrides)}; {seeds} "
        "(a student per seed; every row sampled with the seed).",
        f"{tc.samples} samples per row, quantised to the data's grey levels; FD in the "
        "bundled digits classifier's features against the test split; C2ST (5-fold, 0.5 = "
        "indistinguishable) and k-NN recall (k = 3) of slices of the test split's size "
        "against it; the floor row: draws of as many training images.",
    ]
    if tc.few_step_nfe:
        notes.insert(
            1,
            "Few-step teacher rows: DPM-Solver++(2M) on the EDM grid (rho 7, sigma_max 80, a "
            "final step to 0) whose lowest positive level is the best by FD of "
            f"{list(tc.few_step_sigma_min)} (chosen per seed: {chosen}); with 0.002 the 2-step "
            "grid [80, 0.002, 0] is the 1-step sampler again.",
        )
    by_div = {}
    for r in results:
        if isinstance(r["key"], str) and r["key"] in distill.DIVERGENCES:
            by_div.setdefault(r["key"], []).append(r)
    if "rkl" in by_div and n_seeds > 1:
        for key, name, lower in ORDER_METRICS:
            order = paper_ordering({d: [r[key] for r in rs] for d, rs in by_div.items()}, lower)
            if order:
                notes.append(
                    f"The paper's ordering by {name} (divergences weighting where the teacher "
                    "has more mass against reverse-KL; the difference of means, positive = better; "
                    "Welch's t-test over the seeds): "
                    + "; ".join(
                        f"{distill.describe(d)} {v} ({diff:+.3g}, p {p:.2g})"
                        for d, (diff, p, v) in order.items()
                    )
                    + "."
                )
        power = paper_gap_seeds({d: rs for d, rs in by_div.items()})
        if power:
            notes.append(
                "Seeds per divergence a t-test would need to detect the paper's gap to "
                "reverse-KL, scaled to this table (power 0.8, alpha 0.05, the spread measured "
                f"here; {PAPER_GAP_RULE}): "
                + "; ".join(
                    f"{name}: " + ", ".join(f"{distill.describe(d)} {n}" for d, n in per.items())
                    for name, per in power.items()
                )
                + "."
            )

    def judged(rs):  # a student's means beside the teacher's at 35 NFE
        c2st, recall, fd = (np.mean([r[k] for r in rs]) for k in ORDER_KEYS)
        teacher_recall = np.mean([r["recall_pixels_samples"] for r in first])
        return (
            f"pixel C2ST {c2st:.3f} (target <= 0.65), pixel recall {recall:.3f} = "
            f"{recall / teacher_recall:.2f}x the teacher's {teacher_recall:.3f} at 35 NFE "
            f"(target >= 0.85x), FD {fd:.3g} = {fd / teacher_fd:.2f}x the teacher's."
        )

    if by_div:
        means = {d: np.mean([r["c2st_pixels_samples"] for r in rs]) for d, rs in by_div.items()}
        best = min(means, key=means.get)
        best_rs = by_div[best]
        notes.append(f"Best student by pixel C2ST: {distill.describe(best)}, {judged(best_rs)}")
    for v in tc.variants:
        rs = [r for r in results if r["key"] == v.name]
        if rs:
            notes.append(f"{rs[0]['label']} ({rs[0]['nfe']} NFE): {judged(rs)}")
    tables = [
        {
            "name": "summary",
            "caption": "f-distill students of the digits EDM teacher beside the teacher "
            "at 35 and few NFE, and the floor of each metric.",
            "columns": cols,
            "rows": rows,
        }
    ]
    if tc.get("baseline") is not None:
        tables.append(paired_table(results, str(tc.baseline), strong))
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": tables,
        "notes": notes,
        "figure": str(fig),
    }


#: The paired table's metrics: result key, column, whether lower is better.
PAIRED_METRICS = (
    ("c2st_pixels_samples", "ΔC2ST pixels", True),
    ("c2st_pixels_strong_samples", "ΔC2ST pixels (2x boosting)", True),
    ("recall_pixels_samples", "Δrecall pixels", False),
    ("fd", "ΔFD", True),
)


def paired_table(results: list, baseline: str, strong: bool) -> dict:
    """Every student row (by key) against the ``baseline`` student's row of the same seed:
    the paired difference of each metric (:func:`paired_difference`, mean ± its standard
    error over the seeds) and a verdict: ``better`` / ``worse`` where every metric that
    moves significantly moves that way (:func:`experiments.tables.common.paired_verdict`: a
    paired t-test per metric at 0.05), ``mixed`` where they disagree, else ``same``;
    ``n/a`` with one seed."""
    metrics = [m for m in PAIRED_METRICS if strong or "strong" not in m[0]]
    base = [r for r in results if r["key"] == baseline]
    keys = [
        k
        for k in dict.fromkeys(r["key"] for r in results)
        if isinstance(k, str) and k != "teacher_35"
    ]
    rows = []
    for key in keys:
        if key == baseline:
            continue
        rs = [r for r in results if r["key"] == key]
        diffs = [paired_difference(rs, base, k) for k, _, _ in metrics]
        verdict = paired_verdict(diffs, [lower for _, _, lower in metrics])
        cells = [paired_cell(rs, base, k) for k, _, _ in metrics]
        rows.append([rs[0]["label"], rs[0]["nfe"], *cells, verdict])
    return {
        "name": "paired",
        "caption": f"Each student against the baseline student ({baseline}) of the same seed: "
        "paired differences, mean ± s.e. over the seeds (negative ΔC2ST and ΔFD, positive "
        "Δrecall are better); the verdict counts the metrics whose paired t-test rejects at 0.05.",
        "columns": ["model", "NFE", *[c for _, c, _ in metrics], "verdict"],
        "rows": rows,
    }


def make_figure(samples: dict, path: Path) -> None:
    """One panel per row of the table (``samples``: ``{label: [n, H, W, 1]}``), the label
    wrapped above it."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(samples), figsize=(2.2 * len(samples), 2.8), squeeze=False)
    for ax, (name, x) in zip(axes[0], samples.items(), strict=True):
        n = int(np.ceil(np.sqrt(len(x))))
        h, w = x.shape[1:3]
        canvas = np.ones((n * (h + 1), n * (w + 1)))
        for i, img in enumerate(x):
            r, c = divmod(i, n)
            canvas[r * (h + 1) : r * (h + 1) + h, c * (w + 1) : c * (w + 1) + w] = (
                np.clip(img[..., 0], -1, 1) + 1
            ) / 2
        ax.imshow(canvas, cmap="gray", vmin=0, vmax=1)
        ax.set_title(textwrap.fill(name, 36), fontsize=6)
        ax.axis("off")
    save_figure(fig, path, dpi=120)
