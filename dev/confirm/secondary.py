"""The confirmation's secondary readings (PROTOCOL.md a-c), run from the frozen commit's code, seed by seed as
each pair finishes (amendment 1: run folders do not outlive a session's machine), and packed beside the runs
for ``analyze.py``. ``run.py`` calls it after each pair; by hand:

    nice -n 10 python dev/confirm/secondary.py --code /work/confirm/code --runs /work/confirm/runs \
        --out /work/confirm/secondary --seeds 7        # resumable: finished parts are kept

a. ``after_promotion.py GT --against BT --promotion 1 --from-step 28 --datasets 13 --students 1
   --variants as_written`` per seed whose Grounded-T run promoted -> ``raw/paired_s<seed>.json``;
b, c. ``compare_methods.py --gate RUNS --rows Hard-Only Grounded-T Base-T SOAR-PQ "Base-T PQ" --students 1
   --min-promotions 1`` -> each fresh student's ``eval.json`` as ``raw/fresh/<Row>_s<seed>/eval.json``,
   and each Grounded-T / Base-T run's PQ export card as ``raw/<variant>_s<seed>/export_pq.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import protocol, seeds  # noqa: E402  (dev/confirm/run.py)

ROWS = ["Hard-Only", "Grounded-T", "Base-T", "SOAR-PQ", "Base-T PQ"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", required=True, help="the frozen commit's worktree")
    ap.add_argument("--runs", required=True, help="run.py's --out")
    ap.add_argument("--out", required=True, help="where the secondary readings' own runs go")
    ap.add_argument("--raw", default=str(HERE / "raw"))
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", help="registered seeds whose pairs have finished (default: all)")
    args = ap.parse_args()
    code, runs, out, raw = (Path(p).resolve() for p in (args.code, args.runs, args.out, args.raw))
    registered = seeds(protocol())
    seed_list = args.seeds or registered
    if not set(seed_list) <= set(registered):
        raise SystemExit(f"--seeds {sorted(set(seed_list) - set(registered))}: not registered seeds ({registered})")
    missing = [s for s in seed_list for v in ("grounded", "base") if not (runs / f"{v}_s{s}" / "summary.json").exists()]
    if missing:
        raise SystemExit(f"runs not finished for seeds {sorted(set(missing))}: a seed's readings come after its pair")
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false"}
    if not (runs / "hard_set").exists():  # compare_methods --gate reads the gate's hard set there
        (runs / "hard_set").symlink_to(code / protocol()["hard_set"])

    def paired(seed: int) -> None:
        dest = raw / f"paired_s{seed}.json"
        gt, bt = runs / f"grounded_s{seed}", runs / f"base_s{seed}"
        if dest.exists() or not (gt / "promotions.jsonl").read_text().strip():
            return  # done, or no promoted student to score against
        with open(out / f"paired_s{seed}.log", "w") as log:
            subprocess.run([sys.executable, str(code / "dev" / "scripts" / "after_promotion.py"), str(gt), "--against",
                            str(bt), "--promotion", "1", "--from-step", "28", "--datasets", "13", "--students", "1",
                            "--variants", "as_written", "--out", str(out / f"paired_s{seed}.json")],
                           env=env, cwd=code, stdout=log, stderr=subprocess.STDOUT, check=True)
        shutil.copyfile(out / f"paired_s{seed}.json", dest)

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(paired, seed_list))
    methods = out / "methods"
    started = time.time()
    with open(out / "compare_methods.log", "a") as log:
        # Its last part needs compare_teachers.py's gate.json, which the confirmation has none of (nothing
        # here reads that part); compare_methods.json is written once every fresh student has its eval.json.
        subprocess.run([sys.executable, str(code / "dev" / "scripts" / "compare_methods.py"), "--out", str(methods),
                        "--gate", str(runs), "--seeds", *map(str, seed_list), "--rows", *ROWS, "--students", "1",
                        "--min-promotions", "1", "--parallel", str(args.parallel)],
                       env=env, cwd=code, stdout=log, stderr=subprocess.STDOUT)
    done = methods / "compare_methods.json"
    if not done.exists() or done.stat().st_mtime < started:
        raise SystemExit(f"compare_methods.py did not finish its fresh students; see {out / 'compare_methods.log'}")
    for path in (methods / "eval").glob("*_s*/eval.json"):
        label = json.loads(path.read_text())["label"]
        k = int(path.parent.name.rsplit("_s", 1)[1])
        if label in ROWS:
            dest = raw / "fresh" / f"{label.replace(' ', '_')}_s{k // 100}"
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / "eval.json")
    for s in seed_list:
        for variant in ("grounded", "base"):
            card = runs / f"{variant}_s{s}" / "export_pq" / "export.json"
            if card.exists():
                shutil.copyfile(card, raw / f"{variant}_s{s}" / "export_pq.json")
        # what this seed's readings hold; run.py reads it as "done" (raw/ is committed, the run folders are not)
        (raw / f"secondary_s{s}.json").write_text(json.dumps({
            "seed": s, "paired": (raw / f"paired_s{s}.json").exists(),
            "fresh_rows": sorted(p.parent.name.rsplit("_s", 1)[0] for p in (raw / "fresh").glob(f"*_s{s}/eval.json"))},
            indent=1))


if __name__ == "__main__":
    main()
