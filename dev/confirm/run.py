"""The pre-registered confirmation's runs (dev/confirm/PROTOCOL.md), from the frozen commit's code.

    git worktree add --detach /work/confirm/code <FROZEN_COMMIT>
    nice -n 10 python dev/confirm/run.py --code /work/confirm/code --out /work/confirm/runs     # resumable
    python dev/confirm/run.py --code /work/confirm/code --out /work/confirm/runs --status      # counts only

Runs seed by seed, a seed's Grounded-T and Base-T side by side (``--parallel`` 2, one torch thread each),
``soar-train`` of the frozen code (``PYTHONPATH=<code>``) with exactly the protocol's overrides
(``protocol.json``), on the protocol's hard set. A killed run resumes from its checkpoint when this is
rerun. Each finished run is packed into ``--raw`` (``pack.py``). ``--status`` says how many runs are
finished, never their numbers (no interim looks).
"""

from __future__ import annotations

import argparse
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
    args = ap.parse_args()
    proto, code, out = protocol(), Path(args.code).resolve(), Path(args.out).resolve()
    jobs = [(variant, s) for s in seeds(proto) for variant in proto["variants"]]
    raw = Path(args.raw).resolve()

    def packed(job) -> bool:  # committed raw data: a fresh machine does not rerun a finished pair
        return (raw / f"{job[0]}_s{job[1]}" / "summary.json").exists()

    done = [job for job in jobs if packed(job) or (out / f"{job[0]}_s{job[1]}" / "summary.json").exists()]
    if args.status:
        print(f"{len(done)} of {len(jobs)} runs finished")
        return
    out.mkdir(parents=True, exist_ok=True)
    hard = (code / proto["hard_set"]).resolve()  # the frozen commit's copy (the same bytes as this checkout's)
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()

    def run(job) -> None:
        variant, s = job
        run_dir = out / f"{variant}_s{s}"
        if packed(job):
            return
        if not (run_dir / "summary.json").exists():
            args_ = [str(Path(sys.executable).parent / "soar-train"), proto["preset"], f"seed={s}", f"loop.hard_set={hard}",
                     f"run.dir={run_dir}", *proto["common_overrides"], *proto["variants"][variant]]
            with open(out / f"{variant}_s{s}.log", "a") as log:
                subprocess.run(args_, env=env, cwd=code, stdout=log, stderr=subprocess.STDOUT, check=True)
        pack(run_dir, raw / f"{variant}_s{s}", hard)
        print(f"done {variant} seed {s} ({time.perf_counter() - t0:.0f} s)", flush=True)

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(run, jobs))


if __name__ == "__main__":
    main()
