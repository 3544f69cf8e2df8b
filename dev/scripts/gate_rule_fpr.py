"""How often each gate pass rule passes when the teacher's learning has no effect at all: simulated with
the between-seed and within-run variances measured on the committed gates' raw data. Writes
``dev/results/gate_rule_fpr.json``.

    python dev/scripts/gate_rule_fpr.py

The model: in seed s, the last third's m = 13 per-step differences (Grounded-T minus Base-T) are
d_sj = b_s + e_sj, with b_s ~ N(0, sigma_b^2) the seed's own offset and e_sj a stationary AR(1) series of
variance sigma_w^2 and lag-1 correlation rho (steps of one run are not independent: a promotion moves
every later step). Under no effect the mean is 0. Measured per gate on the packed runs
(``dev/results/raw``, seeds with all 40 steps): sigma_w^2 the mean over seeds of the within-run variance
of d_sj, rho the pooled lag-1 autocorrelation, sigma_b^2 the variance of the seeds' last-third means
less sigma_w^2 / m (the AR(1) correction included); pooled over gates, each gate's seeds about their
own mean. And one gate with no effect by construction: Base-T run twice on seeds 3-5 (the τ = 0.02
fresh-seed gate and the T = 200 gate; the frozen teacher does not see T).

Rules:
- ``old``: a majority of seeds ahead (at least 2 of 3) and the step-level z (every last-third step of
  every seed as a replicate: mean over SE) above 2 (compare_teachers.py before issue 50);
- ``new``: one-sided paired t over the seeds' last-third differences, p < 0.05 (dev/confirm/PROTOCOL.md).
Each at 3 seeds (the gates so far) and 16 (the confirmation).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # soar.stats, installed or not

from soar.seeding import derive_seed  # noqa: E402
from soar.stats import last_third  # noqa: E402

RAW = REPO / "dev" / "results" / "raw"
GATES = ["arith_g16_kl0.001_s12", "arith_g16_kl0.001_tau0.01", "arith_g16_kl0.001_tau0.01_slr3e-5",
         "arith_g16_kl0.001_tau0.02_slr3e-5", "arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345", "arith_horizon200"]
"""Packed gates in gold-probability units with at least two seeds of 40 steps (the r = 2 pilot has one)."""
STEPS = 40


def rewards(gate: str, run: str) -> list[float]:
    path = RAW / gate / run / "metrics.jsonl.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt") as fh:
        return [json.loads(line)["teacher/reward_mean"] for line in fh if line.strip()]


def differences(gate: str, a: str = "grounded", b: str = "base", other_gate: str | None = None) -> list[np.ndarray]:
    """Per seed with two full runs: the last third's per-step ``a`` minus ``b`` (``b`` from ``other_gate``)."""
    out = []
    for s in range(30):
        x, y = rewards(gate, f"{a}_s{s}"), rewards(other_gate or gate, f"{b}_s{s}")
        if len(x) == STEPS and len(y) == STEPS:
            out.append(np.subtract(last_third(x), last_third(y)))
    return out


def ar1_mean_variance_factor(rho: float, m: int) -> float:
    """Var(mean of m steps of a stationary AR(1)) / (sigma_w^2 / m)."""
    k = np.arange(1, m)
    return float(1 + 2 * np.sum((1 - k / m) * rho ** k))


def components(groups: list[list[np.ndarray]]) -> dict:
    """sigma_w, rho and sigma_b from groups of seeds (each group's seeds about their own mean)."""
    within = [np.var(d, ddof=1) for g in groups for d in g]
    lag = [(d[:-1] - d.mean()) @ (d[1:] - d.mean()) / ((d - d.mean()) @ (d - d.mean())) for g in groups for d in g]
    sigma_w2, rho = float(np.mean(within)), float(np.clip(np.mean(lag), -0.9, 0.95))
    m = len(groups[0][0])
    dev2 = [(d.mean() - np.mean([x.mean() for x in g])) ** 2 for g in groups for d in g]
    dof = sum(len(g) - 1 for g in groups)
    var_means = float(np.sum(dev2) / dof)
    sigma_b2 = max(var_means - sigma_w2 / m * ar1_mean_variance_factor(rho, m), 0.0)
    return {"sigma_w": float(np.sqrt(sigma_w2)), "rho": rho, "sigma_b": float(np.sqrt(sigma_b2)),
            "sd_of_seed_means": float(np.sqrt(var_means)), "seeds": sum(len(g) for g in groups), "dof": dof, "m": m}


def simulate(c: dict, seeds: int, sims: int, seed: int, rho: float | None = None) -> dict:
    """Pass rates of both rules under no effect (vectorised over ``sims`` gates)."""
    from scipy import stats

    rng = np.random.default_rng(seed)
    m, rho = c["m"], c["rho"] if rho is None else rho
    e = np.empty((sims, seeds, m))
    e[..., 0] = rng.normal(0, 1, (sims, seeds))
    innov = np.sqrt(1 - rho ** 2)
    for j in range(1, m):
        e[..., j] = rho * e[..., j - 1] + innov * rng.normal(0, 1, (sims, seeds))
    d = c["sigma_b"] * rng.normal(0, 1, (sims, seeds, 1)) + c["sigma_w"] * e
    seed_means = d.mean(2)
    pooled = d.reshape(sims, -1)
    z = pooled.mean(1) / (pooled.std(1, ddof=1) / np.sqrt(pooled.shape[1]))
    wins = (seed_means > 0).sum(1)
    old = (wins * 3 >= 2 * seeds) & (z > 2)
    t = seed_means.mean(1) / (seed_means.std(1, ddof=1) / np.sqrt(seeds))
    new = stats.t.sf(t, seeds - 1) < 0.05
    se = lambda p: float(np.sqrt(p * (1 - p) / sims))  # noqa: E731
    return {"old": float(old.mean()), "old_se": se(old.mean()), "new": float(new.mean()), "new_se": se(new.mean()),
            "step_z_above_2": float((z > 2).mean()), "majority_ahead": float((wins * 3 >= 2 * seeds).mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "dev" / "results" / "gate_rule_fpr.json"))
    ap.add_argument("--sims", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    groups = {g: differences(g) for g in GATES}
    groups = {g: d for g, d in groups.items() if len(d) >= 2}
    estimates = {g: components([d]) for g, d in groups.items()}
    estimates["pooled"] = components(list(groups.values()))
    # no effect by construction: the frozen teacher run twice on the same seeds
    estimates["base_t_twice"] = components([differences("arith_horizon200", "base", "base",
                                                        other_gate="arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345")])
    rates = {}
    for name, c in estimates.items():
        rates[name] = {f"{n}_seeds": simulate(c, n, args.sims, derive_seed(args.seed, "gate_rule_fpr", name, n))
                       for n in (3, 16)}
        rates[name]["3_seeds_steps_independent"] = simulate(c, 3, args.sims, derive_seed(args.seed, "fpr_iid", name),
                                                            rho=0.0)
    per_gate_old = [rates[g]["3_seeds"]["old"] for g in groups]
    summary = {
        "old_rule_3_seeds": {"pooled": rates["pooled"]["3_seeds"]["old"],
                             "range_over_gates": [min(per_gate_old), max(per_gate_old)],
                             "base_t_twice": rates["base_t_twice"]["3_seeds"]["old"]},
        "new_rule_16_seeds": {"pooled": rates["pooled"]["16_seeds"]["new"],
                              "range_over_gates": [min(rates[g]["16_seeds"]["new"] for g in groups),
                                                   max(rates[g]["16_seeds"]["new"] for g in groups)]},
        "new_rule_3_seeds": rates["pooled"]["3_seeds"]["new"]}
    report = {"model": "d_sj = b_s + e_sj: b_s ~ N(0, sigma_b^2), e_sj stationary AR(1) (sigma_w, rho); no effect",
              "rules": {"old": "at least 2/3 of the seeds ahead and the step-level z > 2",
                        "new": "one-sided paired t over the seeds' last-third differences, p < 0.05"},
              "sims": args.sims, "variance_estimates": estimates, "pass_rates_under_no_effect": rates, "summary": summary}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for name, c in estimates.items():
        r = rates[name]
        print(f"{name:48s} sigma_b {c['sigma_b']:.4f} sigma_w {c['sigma_w']:.4f} rho {c['rho']:.2f} (n {c['seeds']}): "
              f"old@3 {r['3_seeds']['old']:.3f} (steps iid {r['3_seeds_steps_independent']['old']:.3f}), "
              f"old@16 {r['16_seeds']['old']:.3f}, "
              f"new@16 {r['16_seeds']['new']:.3f}, new@3 {r['3_seeds']['new']:.3f}")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
