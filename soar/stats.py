"""Statistics with the seed as the unit: one value per seed (a run's last-third reward, a fresh student's
pass@k), summarised by mean and standard error (ddof 1), compared by paired tests across seeds.

    from soar.stats import mean_se, paired_t, wilcoxon
    d = [gt - bt for gt, bt in zip(grounded_by_seed, base_by_seed)]
    paired_t(d, alternative="greater")    # {"mean", "se", "t", "df", "p", "n"}
    wilcoxon(d, alternative="greater")    # {"w_plus", "p", "n"} (exact sign-flip distribution)

Steps of one run are not replicates: ``step_z`` exists only to show, labelled as such, what the old
step-pooled reading said.
"""

from __future__ import annotations

import numpy as np


def mean_se(xs) -> dict:
    """Mean, standard error (sample SD, ddof 1, over sqrt(n); None for one value), n and the values."""
    xs = np.asarray(xs, dtype=float)
    if not len(xs):
        return {"mean": None, "se": None, "n": 0, "values": []}
    return {"mean": float(xs.mean()), "se": float(xs.std(ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else None,
            "n": int(len(xs)), "values": [float(x) for x in xs]}


def sample_sd(values) -> float | None:
    """The sample standard deviation (ddof 1) of what is reported over seeds; None below 2 values."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def paired_t(diffs, alternative: str = "two-sided") -> dict:
    """One-sample t test of per-seed paired differences against 0: mean, SE, t, df = n - 1 and p
    (``two-sided``, or ``greater``: the differences' mean is above 0)."""
    from scipy import stats

    d = mean_se(diffs)
    if d["n"] < 2 or not d["se"]:
        return {**d, "t": None, "df": d["n"] - 1, "p": None, "alternative": alternative}
    t = d["mean"] / d["se"]
    df = d["n"] - 1
    p = float(stats.t.sf(t, df)) if alternative == "greater" else float(2 * stats.t.sf(abs(t), df))
    return {**d, "t": float(t), "df": df, "p": p, "alternative": alternative}


def wilcoxon(diffs, alternative: str = "two-sided") -> dict:
    """Wilcoxon signed-rank test of per-seed differences: W+ (the sum of the ranks of |d| over positive d,
    zeros dropped, ties averaged) and its p under random signs, exact by enumerating every sign pattern
    (n <= 20), else by the normal approximation."""
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    d = d[d != 0]
    n = len(d)
    if n == 0:
        return {"w_plus": None, "p": None, "n": 0, "alternative": alternative}
    ranks = stats.rankdata(np.abs(d))
    w_plus = float(ranks[d > 0].sum())
    if n <= 20:
        signs = ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1).astype(bool)
        null = (signs * ranks).sum(1)
        upper = float(np.mean(null >= w_plus - 1e-9))
        lower = float(np.mean(null <= w_plus + 1e-9))
        p = upper if alternative == "greater" else min(1.0, 2 * min(upper, lower))
    else:
        mu, sd = n * (n + 1) / 4, np.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        z = (w_plus - mu) / sd
        p = float(stats.norm.sf(z)) if alternative == "greater" else float(2 * stats.norm.sf(abs(z)))
    return {"w_plus": w_plus, "p": p, "n": n, "alternative": alternative}


def step_z(diffs_by_seed) -> dict:
    """The step-pooled reading (every step of every seed as if independent): mean, SE and z. Steps of one
    run are not replicates, so this understates the SE; shown beside ``paired_t``, labelled."""
    pooled = mean_se([x for seed in diffs_by_seed for x in seed])
    return {**pooled, "z": pooled["mean"] / pooled["se"] if pooled["se"] else None, "unit": "step (not independent)"}


def icc(x_DR) -> float | None:
    """One-way intra-class correlation of a (datasets, replicates) table: the share of the reward's
    variance that belongs to the dataset rather than to the student's own seed (None with 1 replicate)."""
    x_DR = np.asarray(x_DR, dtype=float)
    d, r = x_DR.shape
    if r < 2 or d < 2:
        return None
    ms_between = r * x_DR.mean(1).var(ddof=1)
    ms_within = x_DR.var(1, ddof=1).mean()
    return float((ms_between - ms_within) / (ms_between + (r - 1) * ms_within)) if ms_between + ms_within > 0 else None


def last_third(xs: list) -> list:
    """The last third of a run's steps (the last len // 3 of them; all of a run shorter than 3 steps)."""
    return xs[len(xs) - len(xs) // 3:] if len(xs) >= 3 else xs
