"""The pre-registered coach-distillation study's analysis (dev/studies/coach_distill/PROTOCOL.md), from the
packed raw data alone.

    python dev/studies/coach_distill/analyze.py                      # raw/ -> results.json
    python dev/studies/coach_distill/analyze.py --toy --raw /tmp/cd_toy/raw --out /tmp/cd_toy/results.json

Per arm and seed, from ``<arm>_s<seed>/eval.json``: the primary metric (mean sampled accuracy on the seed's
held-out hard problems at the fixed step, the arms' last), pass@k beside it, and accuracy on the easier sums
(forgetting: the arm's minus the untrained model's, per seed). Each arm: mean +- SE over seeds (ddof 1), and a
two-sided paired t of its difference from its named baseline (``protocol.json``'s ``baseline``) and from
every registered comparison; the primary comparison is read against alpha, the rest are reported with Holm's
adjustment across them. It refuses to report before every registered (arm, seed) is packed (no interim
looks); ``--toy`` reads the toy protocol's seeds, for the pipeline's smoke test only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent))

from common import holm, load_protocol, packed, seeds  # noqa: E402  (dev/studies/common.py)

from soar.stats import mean_se, paired_t  # noqa: E402

METRICS = {"hard_mean_acc": ("hard", "mean_acc"), "hard_pass": ("hard", None), "easy_mean_acc": ("easy", "mean_acc")}
"""Reported metric -> (eval.json section, key); ``hard_pass``: pass@k with k the hard samples."""


def arm_scores(raw: Path, arm: str, seed: int) -> dict:
    ev = json.loads((raw / f"{arm}_s{seed}" / "eval.json").read_text())
    out = {}
    for name, (section, key) in METRICS.items():
        if section in ev:
            out[name] = ev[section][key or f"pass@{ev[section]['samples']}"]
    return out


def analyse(proto: dict, raw: Path, seed_list: list[int]) -> dict:
    scores = {arm: {s: arm_scores(raw, arm, s) for s in seed_list} for arm in proto["arms"]}
    rows = {}
    for arm in proto["arms"]:
        row = {m: mean_se([scores[arm][s][m] for s in seed_list]) for m in METRICS if m in scores[arm][seed_list[0]]}
        if "easy_mean_acc" in row and arm != "untrained":
            row["forgetting"] = paired_t([scores[arm][s]["easy_mean_acc"] - scores["untrained"][s]["easy_mean_acc"]
                                          for s in seed_list])
        rows[arm] = row

    def diff(a: str, b: str, metric: str = "hard_mean_acc") -> dict:
        return paired_t([scores[a][s][metric] - scores[b][s][metric] for s in seed_list])

    primary_a, primary_b = proto["primary"]["comparison"]
    primary = diff(primary_a, primary_b)
    primary["passes"] = bool(primary["p"] is not None and primary["p"] < proto["primary"]["alpha"] and primary["mean"] > 0)
    secondary = {f"{a} - {b}": {m: diff(a, b, m) for m in ("hard_mean_acc", "hard_pass")} for a, b in proto["comparisons"]}
    adjusted = holm({k: v["hard_mean_acc"]["p"] for k, v in secondary.items()})
    for k, v in secondary.items():
        v["hard_mean_acc"]["p_holm"] = adjusted[k]
    baselines = {arm: {"baseline": spec["baseline"], **diff(arm, spec["baseline"])}
                 for arm, spec in proto["arms"].items() if spec.get("baseline")}
    return {"seeds": seed_list, "per_seed": scores, "arms": rows, "against_baseline": baselines,
            "primary": {"comparison": f"{primary_a} - {primary_b}", **primary}, "secondary": secondary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", default=str(HERE / "raw"))
    ap.add_argument("--out", default=str(HERE / "results.json"))
    ap.add_argument("--toy", action="store_true", help="the toy protocol's seeds (the pipeline's smoke test)")
    args = ap.parse_args()
    proto, raw = load_protocol(HERE, args.toy), Path(args.raw)
    seed_list = seeds(proto, HERE)
    missing = [f"{a}_s{s}" for s in seed_list for a in proto["arms"] if not packed(raw / f"{a}_s{s}")]
    if missing:
        raise SystemExit(f"{len(missing)} of {len(seed_list) * len(proto['arms'])} registered (arm, seed) runs are not "
                         f"packed (e.g. {missing[0]}): no interim looks")
    result = {"protocol": proto, **analyse(proto, raw, seed_list)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    for arm, row in result["arms"].items():
        h = row["hard_mean_acc"]
        vs = result["against_baseline"].get(arm)
        line = f"{arm:12s} hard mean acc {h['mean']:.3f} +- {h['se'] or 0:.3f}"
        if "hard_pass" in row:
            line += f", pass@k {row['hard_pass']['mean']:.3f}"
        if "forgetting" in row:
            line += f", easier sums {row['forgetting']['mean']:+.3f} vs untrained"
        if vs:
            line += f"; - {vs['baseline']}: {vs['mean']:+.3f} +- {vs['se'] or 0:.3f} (p {vs['p']})"
        print(line)
    p = result["primary"]
    print(f"primary {p['comparison']}: {p['mean']:+.4f} +- {p['se'] or 0:.4f}, t {p['t']}, df {p['df']}, p {p['p']}: "
          f"{'PASS' if p['passes'] else 'FAIL'}")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
