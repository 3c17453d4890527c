"""TIW-DSM on biased digits: ``python -m experiments.reproduce table=tiw_digits``.

Kim, Na, Kim and Moon, "Training unbiased diffusion models from biased dataset", ICLR 2024:
with a biased training set and a small unbiased reference set, a time-dependent density
ratio (a discriminator on noised inputs) both reweights the denoising loss and corrects its
target, so the model learns the unbiased law (``scorelib.objectives.TIWLoss``).

The bias (one split for every seed, ``table.split_seed``): ``table.n_reference`` examples of
the digits' training split drawn uniformly are the reference set; of the rest, class
``table.minority`` keeps a share ``table.keep`` and the other classes all their examples:
the biased set. Written into ``<run>/data/`` as ``.npz`` files of ``data=npz``: the score
models' training set (biased plus reference, as the paper trains on their union; the test
split beside it) and the classifier's (the same images, labels 1 for reference, 0 for
biased). Per seed of ``table.seeds``:

* the reference-vs-biased classifier, an ``experiments.train_classifier`` run
  (``table.classifier``);
* DSM (the preset's EDM loss) on the training set: the biased baseline;
* TIW-DSM (``objective=tiw``, the classifier's log ratio with the training set's prior odds
  ``log(n_reference / n_biased)``);
* the time-independent weight (``objective.mode=iw``: the ratio at the smallest noise
  level, on the clean example, no correction);
* DSM on the whole unbiased training split: what unbiased data allow.

Each sample set (the run's own sampler) is read against the clean test digits: the share of
the minority class and the total variation of the ten class shares against the test split's
(the bundled digits classifier's predictions), and ``evaluate_images`` (the classifier
two-sample test in pixels, recall, FD). This module composes runs and reports.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from experiments.build import build_objective
from experiments.runs.evaluation import CLASSIFIERS, evaluate_images
from experiments.runs.score import tiw_log_ratio
from experiments.tables.common import check_seeds, pm, quoted_path, scaled
from experiments.tables.digits_models import check, train_model
from experiments.tables.fdistill_digits import make_figure
from experiments.tables.guidance import classifier_config, train_classifier_run
from scorelib._checks import check_int, check_real
from scorelib._io import atomic_savez, atomic_write_text
from scorelib.data import load_digits
from scorelib.metrics import class_share_tv, class_shares
from scorelib.metrics.classifier import FeatureExtractor, default_cache_dir
from scorelib.objectives.tiw import effective_sample_fraction

PAPER = (
    "TIW-DSM regenerates the unbiased density: closer to the unbiased data than DSM on the "
    "biased set and than time-independent reweighting (abstract)"
)
ROWS = {
    "dsm": "DSM, biased training set",
    "tiw": "TIW-DSM (time-dependent ratio)",
    "iw": "IW-DSM (time-independent ratio)",
    "unbiased": "DSM, unbiased training split (reference)",
}


def _settings(cfg: DictConfig) -> DictConfig:
    """The table config at its scale, checked before anything is trained.

    Raises:
      ValueError: naming ``table.<field>`` (seeds; ``minority`` not a class 0..9; ``keep``
        outside (0, 1); ``n_reference`` outside 1..len(train) / 2; ``floor_draws`` < 1) or,
        from Hydra, a bad override.
    """
    tc = scaled(cfg, base="small")
    check_seeds(tc.seeds)
    check_int(tc.minority, "table.minority", low=0, high=9)
    check_real(tc.keep, "table.keep", low=0.0, high=1.0, low_open=True, high_open=True)
    n_train = len(load_digits().train)
    check_int(tc.n_reference, "table.n_reference", low=1, high=n_train // 2)
    check_int(tc.split_seed, "table.split_seed", low=0)
    check_int(tc.floor_draws, "table.floor_draws", low=1)
    check([*tc.overrides, "trainer.seed=0"])  # the unbiased model: digits as they are
    classifier_config(tc.classifier, 0)  # composes
    return tc


def biased_split(tc: DictConfig) -> dict:
    """``{"reference", "biased"}`` index arrays into the digits' training split."""
    digits = load_digits()
    rng = np.random.default_rng(int(tc.split_seed))
    order = rng.permutation(len(digits.train))
    ref = np.sort(order[: int(tc.n_reference)])
    rest = order[int(tc.n_reference) :]
    minority = rest[digits.train_labels[rest] == int(tc.minority)]
    kept = minority[: max(1, int(round(float(tc.keep) * len(minority))))]
    biased = np.sort(np.concatenate([rest[digits.train_labels[rest] != int(tc.minority)], kept]))
    return {"reference": ref, "biased": biased}


def _uint8(x) -> np.ndarray:
    """Images in ``[-1, 1]`` as ``data=npz``'s uint8 (``x / 127.5 - 1`` back within 0.004)."""
    return np.round((np.asarray(x) + 1.0) * 127.5).astype(np.uint8)


def write_data(tc: DictConfig, out: Path) -> dict:
    """Write the score models' and the classifier's ``.npz`` files; their paths and sizes."""
    digits = load_digits()
    split = biased_split(tc)
    idx = np.concatenate([split["biased"], split["reference"]])
    images = _uint8(digits.train[idx])
    out.mkdir(parents=True, exist_ok=True)
    score = out / "train.npz"
    atomic_savez(
        score,
        images=images,
        labels=digits.train_labels[idx],
        test_images=_uint8(digits.test),
        test_labels=digits.test_labels,
    )
    # the classifier's test split: the test digits (reference-like, 1) and the same digits
    # biased as the training set is (0): its accuracy there is a sanity check only
    test_ref = np.arange(len(digits.test))
    disc = out / "classifier.npz"
    n_ref, n_biased = len(split["reference"]), len(split["biased"])
    atomic_savez(
        disc,
        images=images,
        labels=np.concatenate([np.zeros(n_biased, np.int32), np.ones(n_ref, np.int32)]),
        test_images=_uint8(digits.test[test_ref]),
        test_labels=np.ones(len(test_ref), np.int32),
    )
    return {"score": score, "classifier": disc, "n_reference": n_ref, "n_biased": n_biased}


def models(tc: DictConfig, seed: int, data: dict, classifier_run: Path) -> dict:
    """``{row key: overrides}`` of one seed's score models."""
    npz = ["data=npz", f"data.path={quoted_path(data['score'])}", "data.sigma_data=0.5"]
    base = [*tc.overrides, *npz, f"trainer.seed={seed}"]
    odds = math.log(data["n_reference"] / data["n_biased"])
    tiw = [
        "objective=tiw",
        f"objective.classifier_run={quoted_path(classifier_run)}",
        f"objective.prior_log_odds={odds}",
        "objective.P_mean=-1.6",  # the preset's EDM loss (configs/objective/edm_digits.yaml)
    ]
    return {
        "dsm": base,
        "tiw": [*base, *tiw],
        "iw": [*base, *tiw, "objective.mode=iw"],
        "unbiased": [*tc.overrides, f"trainer.seed={seed}"],
    }


def ratio_statistics(run, tc: DictConfig, data: dict, seed: int) -> list[dict]:
    """The TIW model's weights ``w_t`` on the noised training examples at each of
    ``table.ratio_sigmas``: their mean (1 for an exact ratio: ``E_q w_t = 1``), their
    effective sample fraction, and their mean on the minority class and on the others beside
    the exact class-level ratios (the class's share in the unbiased split over its share in
    the training set)."""
    objective = build_objective(run.cfg, run.process, None, tiw_log_ratio(run.cfg, run.process))
    with np.load(data["score"]) as f:
        x = f["images"].astype(np.float32) / 127.5 - 1.0
        labels = f["labels"]
    k = int(tc.minority)
    p = class_shares(load_digits().train_labels, 10)  # the unbiased split's class shares
    q = class_shares(labels, 10)  # the training set's
    rng = np.random.default_rng(seed)
    out = []
    for s in (float(v) for v in tc.ratio_sigmas):
        noise = rng.normal(size=x.shape).astype(np.float32)
        w = np.asarray(objective.weights_at(x, s, noise), np.float64)
        out.append(
            {
                "seed": seed,
                "sigma": s,
                "mean": float(w.mean()),
                "ess": effective_sample_fraction(w),
                "minority": float(w[labels == k].mean()),
                "others": float(w[labels != k].mean()),
                "exact_minority": float(p[k] / q[k]),
                "exact_others": float((1 - p[k]) / (1 - q[k])),
            }
        )
    return out


def predicted_shares(extractor, x) -> np.ndarray:
    """``[10]`` shares of the bundled classifier's predicted classes."""
    return class_shares(extractor.predict(x), 10)


def run(cfg: DictConfig, run_dir: Path, log=print) -> dict:
    """Write the biased data, train the classifier and the four models per seed, sample and
    read them; writes ``results.json`` into ``run_dir``."""
    tc = _settings(cfg)
    run_dir = Path(run_dir)
    data = write_data(tc, run_dir / "data")
    log(f"biased set {data['n_biased']}, reference {data['n_reference']}")
    digits = load_digits()
    extractor = FeatureExtractor.load_or_train(
        CLASSIFIERS["digits"](), default_cache_dir(os.environ)
    )
    test_shares = predicted_shares(extractor, digits.test)
    clf_overrides = [*tc.classifier, "data=npz", f"data.path={quoted_path(data['classifier'])}"]
    results, figure, ratios = [], {}, []
    for seed in (int(s) for s in tc.seeds):
        clf_dir = run_dir / "runs" / f"classifier_seed{seed}"
        acc = train_classifier_run(clf_overrides, seed, clf_dir, log)
        log(f"[classifier seed {seed}] {acc.get('clean_accuracy', acc)}")
        for key, overrides in models(tc, seed, data, clf_dir).items():
            run, state, wall = train_model(overrides, run_dir / "runs" / f"{key}_seed{seed}", log)
            x, _ = run.draw(state.ema_params, progress=False)
            x = np.asarray(x)
            shares = predicted_shares(extractor, x)
            m = evaluate_images(x, digits, "digits", seed=seed, floor_draws=int(tc.floor_draws))
            row = {
                "seed": seed,
                "model": key,
                "train_s": wall,
                "minority_share": float(shares[int(tc.minority)]),
                "class_tv": class_share_tv(shares, test_shares),
                **{k: m[k] for k in ("c2st_pixels_samples", "recall_pixels_samples", "fd")},
                "c2st_pixels_floor": m["c2st_pixels_floor"],
                "fd_floor": m["fd_floor"],
            }
            results.append(row)
            if key == "tiw":
                ratios += ratio_statistics(run, tc, data, seed)
            if seed == int(tc.seeds[0]):
                figure[ROWS[key]] = x[:64]
            log(
                f"[{key} seed {seed}] minority {row['minority_share']:.3f}, class TV "
                f"{row['class_tv']:.3f}, C2ST {row['c2st_pixels_samples']:.3f}"
            )
    record = {
        "rows": results,
        "ratios": ratios,
        "test_shares": test_shares.tolist(),
        "n_reference": data["n_reference"],
        "n_biased": data["n_biased"],
    }
    atomic_write_text(run_dir / "results.json", json.dumps(record, indent=1, default=float))
    fig = run_dir / "figure.png"
    make_figure(figure, fig)
    return {**report(record, tc), "figure": str(fig)}


def _cell(v):
    v = np.asarray(v, float)
    return float(v[0]) if v.size == 1 else pm(v.mean(), v.std())


def report(record: dict, tc: DictConfig) -> dict:
    """One row per model, the test digits' own shares beside them."""
    k = int(tc.minority)
    cols = [
        "model",
        f"share of class {k}",
        "class-share TV vs test",
        "C2ST pixels (0.5 = indistinguishable)",
        "recall pixels",
        "FD (digits classifier)",
        "train s",
        "paper",
    ]
    rows = []
    for key, label in ROWS.items():
        rs = [r for r in record["rows"] if r["model"] == key]
        rows.append(
            [
                label,
                _cell([r["minority_share"] for r in rs]),
                _cell([r["class_tv"] for r in rs]),
                _cell([r["c2st_pixels_samples"] for r in rs]),
                _cell([r["recall_pixels_samples"] for r in rs]),
                _cell([r["fd"] for r in rs]),
                float(np.mean([r["train_s"] for r in rs])),
                PAPER if key == "tiw" else "",
            ]
        )
    first = record["rows"][0]
    rows.append(
        [
            "test digits (target; floor: training digits)",
            record["test_shares"][k],
            0.0,
            first["c2st_pixels_floor"],
            None,
            first["fd_floor"],
            None,
            "",
        ]
    )
    n_ref, n_b = record["n_reference"], record["n_biased"]
    notes = [
        f"Bias: class {k} keeps {float(tc.keep):g} of its training examples; {n_ref} reference "
        f"examples drawn uniformly before the bias; biased set {n_b}. Score models train on "
        "their union (data=npz, written by the table), the unbiased row on the whole split.",
        f"Models: experiments.train with {list(tc.overrides)}; TIW and IW add objective=tiw "
        f"(objective.mode=iw) with the reference-vs-biased classifier (experiments."
        f"train_classifier with {list(tc.classifier)}) and prior odds log({n_ref}/{n_b}).",
        "Class shares: the bundled digits classifier's predictions on the samples; TV against "
        "its predictions on the test digits. C2ST and recall in pixels and FD against the "
        "clean test digits (experiments.runs.evaluation.evaluate_images). Cells: mean ± std "
        "over the seeds.",
    ]
    ratio_rows = []
    for sigma in dict.fromkeys(r["sigma"] for r in record["ratios"]):
        rs = [r for r in record["ratios"] if r["sigma"] == sigma]
        ratio_rows.append(
            [
                sigma,
                _cell([r["mean"] for r in rs]),
                _cell([r["ess"] for r in rs]),
                _cell([r["minority"] for r in rs]),
                rs[0]["exact_minority"],
                _cell([r["others"] for r in rs]),
                rs[0]["exact_others"],
            ]
        )
    notes.append(
        "Ratio: the TIW model's clipped weights w_t on the training examples noised at each "
        "sigma (TIWLoss.weights): their mean (1 for an exact ratio), Kish's effective sample "
        f"fraction, and their means on class {k} and on the others beside the exact "
        "class-level ratios (the class's share in the unbiased split over its share in the "
        "training set; the exact ratio varies within a class too)."
    )
    return {
        "seeds": [int(s) for s in tc.seeds],
        "tables": [
            {
                "name": "ratio",
                "caption": "The discriminator's density ratio on the noised training examples.",
                "columns": [
                    "sigma",
                    "mean w",
                    "effective sample fraction",
                    f"mean w, class {k}",
                    f"class {k}, exact",
                    "mean w, other classes",
                    "other classes, exact",
                ],
                "rows": ratio_rows,
            },
            {
                "name": "summary",
                "caption": "Models of biased digits: DSM, TIW-DSM and time-independent "
                "reweighting against DSM on unbiased digits.",
                "columns": cols,
                "rows": rows,
            },
        ],
        "notes": notes,
    }
