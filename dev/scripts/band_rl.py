"""RL on the sometimes-solvable band in the embedded world (issue 53 A): on one budget (the same steps, the
same batch of 8 problems x 16 samples, the same lr, the format-penalty reward), RL on the mixed band vs RL
on every problem vs RL on the hard set (all_zero), gain in sampled accuracy on the held-out problems, the
seed as the unit (mean ± SE, ddof 1; paired t across arms: every arm of a seed starts from the same model
and is evaluated with the same sampling seeds, so its step-0 accuracy is the same).

    python dev/scripts/band_rl.py --out runs/band_cmp --seeds 0 1 2        # the preset: ~20 minutes on 2 idle cores
    python dev/scripts/band_rl.py --out runs/band_small --seeds 0 1 2 -- filter.k=32 world.pool_size=60 \
        filter.heldout_per_source=20 student.max_steps=10 student.questions_per_step=4 rl.eval_samples=4
        # the scaled-down run of dev/results/band_rl_world.json (2 cores shared with 6 other jobs)

Extra overrides (after --) go to both commands (each ignores what it does not read).

Steps (each skipped when its output exists, so a rerun resumes):
  1. ``soar-filter experiment=band_rl_arith`` -> ``<out>/bands`` (fail@128 bands, 30 held out);
  2. ``soar-rl experiment=band_rl_arith rl.band=<arm>`` per seed and arm -> ``<out>/rl_<arm>_s<seed>``;
  3. ``<out>/band_rl.json`` (copy it to dev/results/): the bands, raw per-seed eval curves and gains, the
     summary over the seeds whose arms all finished, and the paired tests (``--collect``: only this).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from soar.run import read_metrics
from soar.stats import mean_se, paired_t

ARMS = {"mixed": "[mixed]", "all": "[all_zero,mixed,all_one]", "all_zero": "[all_zero]"}
"""Arm -> ``rl.band``."""


def run(cmd: list[str], log: Path) -> None:
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    with open(log, "w") as fh:
        res = subprocess.run(["nice", "-n", "10", *cmd], stdout=fh, stderr=subprocess.STDOUT,
                             env={**os.environ, "OMP_NUM_THREADS": "2"})
    if res.returncode:
        sys.exit(f"failed ({res.returncode}), see {log}")
    print(f"  {time.time() - t0:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--collect", action="store_true", help="run nothing: summarise the finished runs")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for soar-filter and soar-rl (after --)")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    bands = out / "bands"
    if not (bands / "summary.json").exists():
        run(["soar-filter", "experiment=band_rl_arith", f"run.dir={bands}", "run.progress=false", *args.overrides],
            out / "filter.log")
    filt = json.loads((bands / "summary.json").read_text())

    runs: dict[str, dict[int, dict]] = {arm: {} for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            rdir = out / f"rl_{arm}_s{seed}"
            if args.collect and not (rdir / "summary.json").exists():
                continue
            if not (rdir / "summary.json").exists():
                run(["soar-rl", "experiment=band_rl_arith", f"seed={seed}", f"rl.bands={bands}", f"rl.band={ARMS[arm]}",
                     f"run.dir={rdir}", "run.progress=false", *args.overrides], out / f"rl_{arm}_s{seed}.log")
            rows = [r for r in read_metrics(rdir / "metrics.jsonl") if "eval/accuracy" in r]
            evals = {k: [r[k] for r in rows] for k in rows[0] if k.startswith("eval/")}
            runs[arm][seed] = {"steps": [r["step"] for r in rows], **evals,
                               "gain": evals["eval/accuracy"][-1] - evals["eval/accuracy"][0],
                               "train_problems": json.loads((rdir / "summary.json").read_text())["train_problems"]}

    seeds = [s for s in args.seeds if all(s in runs[a] for a in args.arms)]  # seeds with every arm finished
    gains = {arm: mean_se([runs[arm][s]["gain"] for s in seeds]) for arm in args.arms}
    by_band = {arm: {k.rsplit("/", 1)[1]: mean_se([runs[arm][s][k][-1] - runs[arm][s][k][0] for s in seeds])
                     for k in (runs[arm][seeds[0]] if seeds else ()) if k.startswith("eval/accuracy/band/")}
               for arm in args.arms}
    paired = {f"mixed - {arm}": paired_t([runs["mixed"][s]["gain"] - runs[arm][s]["gain"] for s in seeds])
              for arm in args.arms if arm != "mixed" and "mixed" in args.arms}
    result = {"seeds": seeds, "complete": len(seeds) >= 3,  # the seed is the unit: fewer than 3 is no result
              "arms": {a: ARMS[a] for a in args.arms}, "overrides": args.overrides,
              "bands": {k: filt[k] for k in ("problems", "bands", "band_files")},
              "gain_heldout": gains, "gain_heldout_by_band": by_band, "paired_t": paired, "runs": runs}
    (out / "band_rl.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({"bands": filt["bands"], "heldout": filt["band_files"]["heldout"]["problems"],
                      "gain": {a: (g["mean"], g["se"]) for a, g in gains.items()},
                      "paired": {k: (v["mean"], v["se"], v["t"], v["p"]) for k, v in paired.items()}}, indent=1))


if __name__ == "__main__":
    main()
