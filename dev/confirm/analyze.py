"""The pre-registered confirmation's analysis (dev/confirm/PROTOCOL.md), from the packed raw data alone.

    python dev/confirm/analyze.py                    # dev/confirm/raw -> dev/confirm/results.json
    python dev/confirm/analyze.py --raw DIR --out FILE --seeds 0 1 --steps 6 --allow-partial   # a test sample

Primary: per seed, Grounded-T's mean ``teacher/reward_mean`` over the last third of its steps minus
Base-T's; a one-sided paired t test of those differences (df = seeds - 1) at alpha 0.05, and the exact
one-sided Wilcoxon signed-rank test beside it. Secondary readings, reported and never gating, each with
the seed as the unit, from what ``--raw`` holds of them:
  a. ``paired_s<seed>.json`` (dev/scripts/after_promotion.py --against): each seed's last-third datasets of
     both teachers scored against one student;
  b. ``fresh/<Row>_s<seed>/eval.json`` for rows ``Grounded-T`` and ``Base-T`` (fresh students on 128
     questions sampled from the final and the untrained teacher): pass@32 at the fixed step and by the
     slope rule;
  c. the same for ``SOAR-PQ``, ``Base-T PQ`` and ``Hard-Only``.
The analysis refuses to report the primary result before every registered pair is packed (no interim
looks); ``--allow-partial`` exists for the test on a committed sample only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from soar.stats import last_third, mean_se, paired_t, step_z, wilcoxon  # noqa: E402

sys.path.insert(0, str(HERE))
from run import protocol, seeds  # noqa: E402  (dev/confirm/run.py)


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def run_record(raw: Path, variant: str, seed: int) -> dict | None:
    folder = raw / f"{variant}_s{seed}"
    if not (folder / "summary.json").exists():
        return None
    rows = read_jsonl_gz(folder / "metrics.jsonl.gz")
    promotions = [json.loads(line) for line in (folder / "promotions.jsonl").read_text().splitlines() if line.strip()]
    return {"rewards": [r["teacher/reward_mean"] for r in rows], "promotions": len(promotions),
            "promotion_steps": [p["step"] for p in promotions],
            "hard_set_sha256": json.loads((folder / "provenance.json").read_text())["hard_set_sha256"],
            "git_sha": json.loads((folder / "meta.json").read_text()).get("git_sha")}


def primary(raw: Path, seed_list: list[int], steps: int) -> dict:
    per_seed, by_step = {}, []
    for s in seed_list:
        gt, bt = run_record(raw, "grounded", s), run_record(raw, "base", s)
        if len(gt["rewards"]) != steps or len(bt["rewards"]) != steps:
            raise SystemExit(f"seed {s}: {len(gt['rewards'])} / {len(bt['rewards'])} steps, the protocol's {steps}")
        gt_l, bt_l = last_third(gt["rewards"]), last_third(bt["rewards"])
        per_seed[s] = {"grounded": sum(gt_l) / len(gt_l), "base": sum(bt_l) / len(bt_l),
                       "promotions": [gt["promotions"], bt["promotions"]],
                       "promotion_steps": [gt["promotion_steps"], bt["promotion_steps"]]}
        per_seed[s]["difference"] = per_seed[s]["grounded"] - per_seed[s]["base"]
        by_step.append([a - b for a, b in zip(gt_l, bt_l)])
    diffs = [v["difference"] for v in per_seed.values()]
    t = paired_t(diffs, "greater")
    return {"per_seed": per_seed, "paired_t": t, "wilcoxon": wilcoxon(diffs, "greater"),
            "passes": bool(t["p"] is not None and t["p"] < protocol()["primary"]["alpha"]),
            "grounded_ahead": int(sum(d > 0 for d in diffs)), "seeds": len(diffs),
            "promotions": {"grounded": mean_se([v["promotions"][0] for v in per_seed.values()]),
                           "base": mean_se([v["promotions"][1] for v in per_seed.values()])},
            "step_level_z_not_independent": step_z(by_step)}


READINGS = {"fixed_step": "fixed", "slope_rule": "selected"}
"""A fresh student's readings and their ``eval.json`` keys: pass@k at ``eval.fixed_step``, and averaged
over the slope rule's window (``soar.evaluate``)."""


def fresh_scores(raw: Path, row: str, seed_list: list[int], reading: str) -> dict[int, float]:
    """Per seed, a fresh-student row's pass@32 (``reading``: ``fixed_step`` or ``slope_rule``)."""
    out = {}
    for s in seed_list:
        path = raw / "fresh" / f"{row.replace(' ', '_')}_s{s}" / "eval.json"
        if path.exists():
            value = json.loads(path.read_text()).get(READINGS[reading], {}).get("eval/pass@32")
            if value is not None:
                out[s] = float(value)
    return out


def paired_rows(raw: Path, seed_list: list[int], a: str, b: str) -> dict:
    """Row ``a`` minus row ``b`` of fresh students, per seed where both exist, at the fixed step and by the
    slope rule; two-sided paired t over those seeds."""
    out = {}
    for key in READINGS:
        sa, sb = fresh_scores(raw, a, seed_list, key), fresh_scores(raw, b, seed_list, key)
        common = sorted(set(sa) & set(sb))
        out[key] = {"seeds": common, a: mean_se([sa[s] for s in common]), b: mean_se([sb[s] for s in common]),
                    "difference": paired_t([sa[s] - sb[s] for s in common])}
    return out


def secondary(raw: Path, seed_list: list[int]) -> dict:
    paired = {}
    for s in seed_list:
        path = raw / f"paired_s{s}.json"
        if path.exists():
            # after_promotion.py --against: the mean over the seed's datasets of (Grounded-T's minus Base-T's)
            paired[s] = json.loads(path.read_text())["against"]["as_written_minus_against"]["gold_prob"]["mean"]
    return {"a_paired_reading": {"per_seed": paired, "test": paired_t(list(paired.values()))},
            "b_teacher_questions": paired_rows(raw, seed_list, "Grounded-T", "Base-T"),
            "c_promotion_questions": {"SOAR-PQ - Base-T PQ": paired_rows(raw, seed_list, "SOAR-PQ", "Base-T PQ"),
                                      "SOAR-PQ - Hard-Only": paired_rows(raw, seed_list, "SOAR-PQ", "Hard-Only"),
                                      "Base-T PQ - Hard-Only": paired_rows(raw, seed_list, "Base-T PQ", "Hard-Only")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", default=str(HERE / "raw"))
    ap.add_argument("--out", default=str(HERE / "results.json"))
    ap.add_argument("--seeds", type=int, nargs="+", help="default: the protocol's (with replacements)")
    ap.add_argument("--allow-partial", action="store_true", help="analyse the seeds that are packed (tests only)")
    ap.add_argument("--steps", type=int, help="steps every run must have (default: the protocol's; tests only)")
    args = ap.parse_args()
    proto, raw = protocol(), Path(args.raw)
    seed_list = args.seeds or seeds(proto)
    packed = [s for s in seed_list if run_record(raw, "grounded", s) and run_record(raw, "base", s)]
    if len(packed) < len(seed_list) and not args.allow_partial:
        raise SystemExit(f"{len(packed)} of {len(seed_list)} registered pairs are packed: no interim looks")
    hashes = {run_record(raw, v, s)["hard_set_sha256"] for s in packed for v in proto["variants"]}
    shas = {run_record(raw, v, s)["git_sha"] for s in packed for v in proto["variants"]}
    result = {"protocol": proto, "seeds": packed, "hard_set_sha256": sorted(hashes), "git_sha": sorted(map(str, shas)),
              "primary": primary(raw, packed, args.steps or proto["steps"]), "secondary": secondary(raw, packed)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    p = result["primary"]
    t, w = p["paired_t"], p["wilcoxon"]
    print(f"primary: Grounded-T - Base-T last third {t['mean']:+.4f} +- {t['se']:.4f} (n {t['n']}), t {t['t']:.2f}, "
          f"df {t['df']}, one-sided p {t['p']:.3g}; Wilcoxon W+ {w['w_plus']}, p {w['p']:.3g}: "
          f"{'PASS' if p['passes'] else 'FAIL'} (Grounded-T ahead in {p['grounded_ahead']} of {p['seeds']})")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
