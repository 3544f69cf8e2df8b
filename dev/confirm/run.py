"""The pre-registered confirmation's runs (dev/confirm/PROTOCOL.md), from the frozen commit's code.

    echo 0 > /proc/sys/kernel/sched_autogroup_enabled      # first: else nice does not protect the runs
    git worktree add --detach /work/confirm/code <FROZEN_COMMIT>
    nice -n 5 python dev/confirm/run.py --code /work/confirm/code --out /work/confirm/runs     # resumable
    python dev/confirm/run.py --code /work/confirm/code --out /work/confirm/runs --status      # counts only

Seed by seed: a seed's Grounded-T and Base-T side by side (``--parallel`` 2, one torch thread each),
``soar-train`` of the frozen code (``PYTHONPATH=<code>``) with exactly the protocol's overrides
(``protocol.json``), on the protocol's hard set; each finished run packed into ``--raw`` (``pack.py``);
then that seed's secondary readings (``secondary.py --seeds S``, amendment 1), before the next seed, so
the cores are never shared by more than ``--parallel`` jobs. A killed run resumes from its checkpoint
when this is rerun; a pair already packed in ``--raw`` is not rerun, except a pair whose secondary
readings are missing and whose run folders were lost with an earlier machine: it is rerun last, for the
readings only, and must reproduce its packed metrics (``time/*`` aside) or it gets no readings
(amendment 1). ``--status`` says how many runs and readings are finished, never their numbers (no
interim looks).
The kernel's autogroup scheduling gives every session an equal share of the cores whatever its nice value
(other work took 70-76 % of seed 6's time), so the runs refuse to start while it is on (``--allow-autogroup``
overrides); other work beside them goes at nice 19.

    python dev/confirm/run.py --code /work/confirm/code --out /work/confirm/runs --analyze

runs the registered analysis once everything is packed: ``python dev/confirm/analyze.py`` with its
defaults, exactly; its printed summary goes to ``results.txt`` and the command, the commit and the hash
of ``results.json`` to ``analysis.json`` (``tests/test_confirm_analysis.py`` checks both).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pack import pack  # noqa: E402  (dev/confirm/pack.py)


def protocol() -> dict:
    return json.loads((HERE / "protocol.json").read_text())


def seeds(proto: dict) -> list[int]:
    """The registered seeds, each one that ``replaced.json`` records as unrecoverable (``{"seed": "why"}``)
    replaced by the next unused replacement seed, in order."""
    replaced = json.loads((HERE / "replaced.json").read_text()) if (HERE / "replaced.json").exists() else {}
    spare = iter(s for s in proto["replacement_seeds"] if str(s) not in replaced)
    return [s if str(s) not in replaced else next(spare) for s in proto["seeds"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", required=True, help="a worktree of the frozen commit")
    ap.add_argument("--out", required=True, help="where the run folders go")
    ap.add_argument("--raw", default=str(HERE / "raw"), help="where finished runs are packed")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--status", action="store_true", help="how many runs are finished (no numbers)")
    ap.add_argument("--allow-autogroup", action="store_true", help="start even though autogroup scheduling is on")
    ap.add_argument("--analyze", action="store_true", help="the registered analysis, once every pair and reading is in")
    args = ap.parse_args()
    proto, code, out = protocol(), Path(args.code).resolve(), Path(args.out).resolve()
    jobs = [(variant, s) for s in seeds(proto) for variant in proto["variants"]]
    raw = Path(args.raw).resolve()

    def packed(job) -> bool:  # committed raw data: a fresh machine does not rerun a finished pair
        return (raw / f"{job[0]}_s{job[1]}" / "summary.json").exists()

    done = [job for job in jobs if packed(job) or (out / f"{job[0]}_s{job[1]}" / "summary.json").exists()]
    seed_list = seeds(proto)
    read = [s for s in seed_list if (raw / f"secondary_s{s}.json").exists()]
    if args.status:
        print(f"{len(done)} of {len(jobs)} runs finished; secondary readings for {len(read)} of {len(seed_list)} seeds")
        return
    if args.analyze:
        if len(done) < len(jobs) or len(read) < len(seed_list) or raw != (HERE / "raw").resolve():
            raise SystemExit(f"{len(done)} of {len(jobs)} runs and {len(read)} of {len(seed_list)} seeds' readings are "
                             "in dev/confirm/raw: the analysis comes after all")
        analyze()
        return
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if autogroup.exists() and autogroup.read_text().strip() == "1" and not args.allow_autogroup:
        raise SystemExit(f"{autogroup} is 1: every session gets an equal share of the cores whatever its nice value, "
                         f"so other work would slow the runs; `echo 0 > {autogroup}` first (or --allow-autogroup)")
    out.mkdir(parents=True, exist_ok=True)
    hard = (code / proto["hard_set"]).resolve()  # the frozen commit's copy (the same bytes as this checkout's)
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()

    def train(job) -> None:
        variant, s = job
        run_dir = out / f"{variant}_s{s}"
        if not (run_dir / "summary.json").exists():
            args_ = [str(Path(sys.executable).parent / "soar-train"), proto["preset"], f"seed={s}", f"loop.hard_set={hard}",
                     f"run.dir={run_dir}", *proto["common_overrides"], *proto["variants"][variant]]
            with open(out / f"{variant}_s{s}.log", "a") as log:
                subprocess.run(args_, env=env, cwd=code, stdout=log, stderr=subprocess.STDOUT, check=True)
        print(f"trained {variant} seed {s} ({time.perf_counter() - t0:.0f} s)", flush=True)

    def secondary(s: int) -> None:
        subprocess.run([sys.executable, str(HERE / "secondary.py"), "--code", str(code), "--runs", str(out),
                        "--out", str(out.parent / "secondary"), "--raw", str(raw), "--parallel", str(args.parallel),
                        "--seeds", str(s)], check=True)
        print(f"secondary readings seed {s} ({time.perf_counter() - t0:.0f} s)", flush=True)

    pairs = [[(v, s) for v in proto["variants"]] for s in seed_list]
    fresh = [pair for pair in pairs if not all(map(packed, pair))]
    lost = [pair for pair in pairs if all(map(packed, pair)) and pair[0][1] not in read
            and not all((out / f"{v}_s{s}" / "summary.json").exists() for v, s in pair)]
    redo = [pair for pair in pairs if pair not in fresh and pair not in lost and pair[0][1] not in read]
    with ThreadPoolExecutor(args.parallel) as pool:
        for pair in [*redo, *fresh, *lost]:  # a finished pair's readings first: its run folders die with the machine
            s = pair[0][1]
            list(pool.map(train, pair))
            if pair in fresh:
                for variant, _ in pair:
                    pack(out / f"{variant}_s{s}", raw / f"{variant}_s{s}", hard)
            elif not all(same_metrics(out / f"{v}_s{s}", raw / f"{v}_s{s}") for v, _ in pair):
                why = "its rerun did not reproduce the packed metrics (amendment 1)"
                (raw / f"secondary_s{s}.json").write_text(json.dumps({"seed": s, "paired": False, "fresh_rows": [],
                                                                      "none_because": why}, indent=1))
                print(f"seed {s}: no secondary readings: {why}", flush=True)
                continue
            secondary(s)


def analyze() -> None:
    """``python dev/confirm/analyze.py``, no arguments (the registered defaults), recorded."""
    argv = [sys.executable, str(HERE / "analyze.py")]
    res = subprocess.run(argv, cwd=HERE.parents[1], capture_output=True, text=True, check=True)
    (HERE / "results.txt").write_text(res.stdout)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    (HERE / "analysis.json").write_text(json.dumps({
        "command": "python dev/confirm/analyze.py", "arguments": argv[2:], "git_sha": sha,
        "results_sha256": hashlib.sha256((HERE / "results.json").read_bytes()).hexdigest()}, indent=1) + "\n")
    print(res.stdout, end="")


def same_metrics(run_dir: Path, packed_dir: Path) -> bool:
    """A rerun's ``metrics.jsonl`` equals the packed one, ``time/*`` aside (amendment 1)."""
    def rows(lines) -> list[dict]:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in lines if line.strip()]

    with gzip.open(packed_dir / "metrics.jsonl.gz", "rt") as fh:
        return rows((run_dir / "metrics.jsonl").read_text().splitlines()) == rows(fh)

if __name__ == "__main__":
    main()
