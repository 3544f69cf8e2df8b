"""The pre-registered band-RL study's analysis (dev/studies/band_rl/PROTOCOL.md), from the packed raw data alone.

    python dev/studies/band_rl/analyze.py                        # raw/ -> results.json
    python dev/studies/band_rl/analyze.py --toy --raw /tmp/band_toy/raw --out /tmp/band_toy/results.json

Per arm and seed, from ``<arm>_s<seed>/metrics.jsonl.gz``: the primary metric, ``eval/accuracy`` (the mean over
the seed's held-out problems of the fraction of ``rl.eval_samples`` samples correct) at the fixed read-out step,
and its gain over step 0 (the same model and draws for every arm of a seed). Each arm: mean +- SE over seeds
(ddof 1); the registered comparisons: two-sided paired t of the read-out accuracy, the primary one read against
alpha, the rest with Holm's adjustment. Also each arm's training problems and the filter's bands per seed. It
refuses to report before every registered (arm, seed) is packed (no interim looks); ``--toy`` reads the toy
protocol's seeds, for the pipeline's smoke test only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent))

from common import holm, load_protocol, packed, read_jsonl_gz, seeds  # noqa: E402  (dev/studies/common.py)

from soar.stats import mean_se, paired_t  # noqa: E402


def arm_record(raw: Path, arm: str, seed: int, step: int) -> dict:
    folder = raw / f"{arm}_s{seed}"
    evals = {r["step"]: r for r in read_jsonl_gz(folder / "metrics.jsonl.gz") if "eval/accuracy" in r}
    if step not in evals or 0 not in evals:
        raise SystemExit(f"{folder}: no evaluation at step 0 and the read-out step {step} (steps {sorted(evals)})")
    bands = json.loads((folder / "bands_summary.json").read_text())
    return {"accuracy": evals[step]["eval/accuracy"], "start": evals[0]["eval/accuracy"],
            "gain": evals[step]["eval/accuracy"] - evals[0]["eval/accuracy"],
            "by_band": {k.rsplit("/", 1)[1]: evals[step][k] - evals[0][k] for k in evals[step]
                        if k.startswith("eval/accuracy/band/")},
            "train_problems": json.loads((folder / "summary.json").read_text())["train_problems"],
            "bands": {n: bands["band_files"][n]["problems"] for n in ("all_zero", "mixed", "all_one", "heldout")}}


def analyse(proto: dict, raw: Path, seed_list: list[int]) -> dict:
    step = proto["readout_step"]
    rec = {arm: {s: arm_record(raw, arm, s, step) for s in seed_list} for arm in proto["arms"]}
    arms = {arm: {m: mean_se([rec[arm][s][m] for s in seed_list]) for m in ("accuracy", "gain", "train_problems")}
            for arm in proto["arms"]}
    for arm, row in arms.items():  # per held-out band, where every seed's held-out draw has that band
        shared = set.intersection(*(set(rec[arm][s]["by_band"]) for s in seed_list))
        row["gain_by_band"] = {b: mean_se([rec[arm][s]["by_band"][b] for s in seed_list]) for b in sorted(shared)}

    def diff(a: str, b: str) -> dict:
        return paired_t([rec[a][s]["accuracy"] - rec[b][s]["accuracy"] for s in seed_list])

    a, b = proto["primary"]["comparison"]
    primary = {"comparison": f"{a} - {b}", **diff(a, b)}
    primary["passes"] = bool(primary["p"] is not None and primary["p"] < proto["primary"]["alpha"] and primary["mean"] > 0)
    secondary = {f"{x} - {y}": diff(x, y) for x, y in proto["comparisons"]}
    for k, p in holm({k: v["p"] for k, v in secondary.items()}).items():
        secondary[k]["p_holm"] = p
    return {"seeds": seed_list, "readout_step": step, "per_seed": rec, "arms": arms, "primary": primary,
            "secondary": secondary}


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
        acc, gain = row["accuracy"], row["gain"]
        print(f"{arm:8s} held-out accuracy at step {result['readout_step']}: {acc['mean']:.3f} +- {acc['se'] or 0:.3f} "
              f"(gain {gain['mean']:+.3f}; {row['train_problems']['mean']:.0f} training problems)")
    for name, d in [(result["primary"]["comparison"], result["primary"]), *result["secondary"].items()]:
        print(f"{name}: {d['mean']:+.4f} +- {d['se'] or 0:.4f}, t {d['t']}, df {d['df']}, p {d['p']}")
    print(f"primary: {'PASS' if result['primary']['passes'] else 'FAIL'}; wrote {args.out}")


if __name__ == "__main__":
    main()
