"""The tables' paired comparisons and verdicts (no training): the verdict rule against
scipy's paired t-test, and the rows of table=fdistill_ablation's and table=sure's paired
tables on made-up results."""

import numpy as np
import pytest
from scipy import stats

from experiments.tables.common import paired_difference, paired_verdict
from experiments.tables.fdistill_digits import paired_table
from experiments.tables.sure import DSM_NOISY, paired_rows


def test_the_verdict_is_scipys_paired_t_test_per_metric():
    """A metric moves when scipy's paired t-test rejects at 0.05 (t_{0.975, 2} = 4.30 at 3
    seeds, not 2 s.e.); the directions decide the verdict; one seed: n/a."""
    base = [{"seed": s, "m": 0.0} for s in range(3)]
    for diffs in ([0.10, 0.12, 0.15], [0.05, 0.30, 0.10], [-0.2, -0.21, -0.19]):
        rows = [{"seed": s, "m": d} for s, d in enumerate(diffs)]
        p = paired_difference(rows, base, "m")
        rejects = stats.ttest_rel(diffs, [0.0] * 3).pvalue < 0.05
        want = "same" if not rejects else ("better" if np.mean(diffs) < 0 else "worse")
        assert paired_verdict([p], [True]) == want
    # 3.5 s.e.: beyond the 2 s.e. of the first rule, within the t-test's 4.3
    rows = [{"seed": s, "m": d} for s, d in enumerate([0.10, 0.20, 0.30])]
    p = paired_difference(rows, base, "m")
    assert 2 < p["mean"] / p["se"] < 4.3 and paired_verdict([p], [True]) == "same"
    up = paired_difference([{"seed": s, "m": 1.0 + 0.01 * s} for s in range(3)], base, "m")
    assert paired_verdict([up, up], [True, False]) == "mixed"
    assert paired_verdict([up], [False]) == "better"
    one = paired_difference([{"seed": 0, "m": 1.0}], base[:1], "m")
    assert paired_verdict([one], [True]) == "n/a"
    with pytest.raises(ValueError):
        paired_verdict([up], [True, False])


def test_the_paired_table_differences_and_verdicts():
    """``paired_table``: each student minus the baseline of its seed, mean ± s.e. (ddof 1)
    over 3 seeds, and the verdict from the metrics that move beyond 2 s.e."""

    def row(key, seed, c2st, recall, fd):
        return {
            "key": key,
            "label": f"student {key}",
            "nfe": 1,
            "seed": seed,
            "c2st_pixels_samples": c2st,
            "c2st_pixels_strong_samples": c2st + 0.01,
            "recall_pixels_samples": recall,
            "fd": fd,
        }

    results = [row("teacher_35", s, 0.55, 0.87, 4.0) for s in range(3)]
    for s, noise in enumerate((0.0, 0.01, -0.01)):
        results.append(row("kl", s, 0.86 + noise, 0.46, 4.2 + noise))
        results.append(row("good", s, 0.70 + noise + 0.002 * s, 0.60 + 0.001 * s, 4.2 + noise))
        results.append(row("mixed", s, 0.80 + noise, 0.40 + 0.001 * s, 4.2 + noise))
        results.append(row("same", s, 0.86 + noise + 0.01 * (s - 1), 0.46, 4.2 + noise))
    table = paired_table(results, "kl", strong=True)
    rows = {r[0]: dict(zip(table["columns"], r, strict=True)) for r in table["rows"]}
    assert set(rows) == {"student good", "student mixed", "student same"}  # not the teacher
    d = np.array([0.70 + 0.002 * s - 0.86 for s in range(3)])
    se = d.std(ddof=1) / np.sqrt(3)
    assert rows["student good"]["ΔC2ST pixels"] == f"{d.mean():+.3g} ± {se:.2g}"
    assert rows["student good"]["verdict"] == "better"
    assert rows["student mixed"]["verdict"] == "mixed"  # C2ST better, recall worse
    assert rows["student same"]["verdict"] == "same"
    assert "ΔC2ST pixels (2x boosting)" in table["columns"]
    assert "ΔC2ST pixels (2x boosting)" not in paired_table(results, "kl", strong=False)["columns"]


def test_the_paired_rows_against_dsm_on_the_noisy_digits():
    """``paired_rows``: each SURE variant minus DSM on the noisy digits of the same seed,
    mean ± s.e. (ddof 1) over 3 seeds, and the samples' verdict (C2ST and recall)."""

    def row(label, seed, c2st, recall, mse=0.1, sigma_n=0.5):
        return {
            "sigma_n": sigma_n,
            "label": label,
            "seed": seed,
            "c2st_pixels_samples": c2st,
            "recall_pixels_samples": recall,
            "fd": 10.0,
            "mse_held_out": mse,
        }

    results = [row("DSM, clean digits (reference)", s, 0.7, 0.9, sigma_n=None) for s in range(3)]
    for s in range(3):
        results += [
            row(DSM_NOISY, s, 0.99 - 0.001 * s, 0.98),
            row("SURE-Score (a), noisy digits", s, 0.85 + 0.002 * s, 0.80, mse=0.07),
            row("SURE-Score (b), noisy digits", s, 0.99 + 0.001 * (s - 1), 0.97 - 0.001 * s),
        ]
    rows = {r[1]: r for r in paired_rows(results)}
    assert set(rows) == {"SURE-Score (a), noisy digits", "SURE-Score (b), noisy digits"}
    a = rows["SURE-Score (a), noisy digits"]
    d = np.array([0.85 + 0.002 * s - (0.99 - 0.001 * s) for s in range(3)])
    assert a[0] == 0.5 and a[2] == f"{d.mean():+.3g} ± {d.std(ddof=1) / np.sqrt(3):.2g}"
    assert a[5] == "-0.03 ± 0" and a[-1] == "mixed"  # C2ST better, recall worse
    assert rows["SURE-Score (b), noisy digits"][-1] == "worse"  # recall falls, C2ST the same
    assert paired_rows([r for r in results if r["seed"] == 0]) == []  # one seed: no rows
