"""The pre-registered band-RL study's runs (dev/studies/band_rl/PROTOCOL.md), from the frozen commit's code;
resumable: every step is skipped when its output exists, a killed soar-* run resumes from its checkpoint.

    git worktree add --detach /work/studies/band_rl/code $(cat dev/studies/band_rl/FROZEN_COMMIT)
    nice -n 10 python dev/studies/band_rl/run.py --code /work/studies/band_rl/code \
        --out /work/studies/band_rl/runs                            # resumable; --status: counts only
    python dev/studies/band_rl/run.py --code . --out /tmp/band_toy --toy    # the pipeline at toy size

Per seed, in order (``protocol.json`` holds every override):
  1. ``soar-filter`` of the preset with the seed: the seed's own pool (``world.pool_seed=${seed}``), its own
     k samples per problem and its own held-out draw -> ``<out>/s<seed>/bands``;
  2. each arm, ``soar-rl`` from the world model at the same budget on that filter's band files: ``mixed``,
     ``all`` (every band), ``random`` (every band, cut to a seeded random subset the size of this seed's
     mixed band: ``rl.subset_size``) -> ``<out>/s<seed>/<arm>``; each scores the same held-out problems with
     the same sampling seeds at every evaluation step;
  3. packed into ``--raw`` (``<arm>_s<seed>/``: metrics, config, meta, summary, and the filter's summary and
     manifest).
``--status`` prints how many (arm, seed) pairs are packed, never a number from them (no interim looks).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import Commands, check_frozen, load_protocol, pack_run, packed, seeds  # noqa: E402  (dev/studies/common.py)


def run_seed(proto: dict, cmd: Commands, seed: int, out: Path, raw: Path) -> None:
    seed_dir = out / f"s{seed}"
    bands = seed_dir / "bands"
    if not (bands / "summary.json").exists():
        cmd.soar("soar-filter", [proto["preset"], f"seed={seed}", f"run.dir={bands}", *proto["common_overrides"],
                                 *proto["filter_overrides"]], seed_dir / "filter.log")
    mixed = json.loads((bands / "summary.json").read_text())["band_files"]["mixed"]["problems"]
    if not mixed:
        raise SystemExit(f"{bands}: the mixed band is empty, so the mixed and random arms are undefined for seed {seed}")
    for arm, spec in proto["arms"].items():
        dest = raw / f"{arm}_s{seed}"
        if packed(dest):
            continue
        run_dir = seed_dir / arm
        if not (run_dir / "summary.json").exists():
            subset = [f"rl.subset_size={mixed}"] if spec.get("subset") == "mixed" else []
            cmd.soar("soar-rl", [proto["preset"], f"seed={seed}", f"rl.bands={bands}", f"rl.band={spec['band']}", *subset,
                                 f"student.max_steps={proto['steps']}", f"run.dir={run_dir}", *proto["common_overrides"],
                                 *proto["budget_overrides"]], seed_dir / f"{arm}.log")
        pack_run(run_dir, dest, {"bands_summary.json": bands / "summary.json",
                                 "bands_manifest.jsonl.gz": bands / "manifest.jsonl"})
        print(f"packed {arm} seed {seed}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", required=True, help="a worktree of the frozen commit")
    ap.add_argument("--out", required=True, help="where the run folders go")
    ap.add_argument("--raw", default=None, help="where finished runs are packed (default: this folder's raw/; "
                                                 "--toy: <out>/raw)")
    ap.add_argument("--parallel", type=int, default=1, help="seeds run side by side")
    ap.add_argument("--toy", action="store_true", help="protocol.json's toy sizes: a smoke test, never data")
    ap.add_argument("--status", action="store_true", help="how many (arm, seed) pairs are packed (no numbers)")
    args = ap.parse_args()
    proto, out = load_protocol(HERE, args.toy), Path(args.out).resolve()
    raw = Path(args.raw or (out / "raw" if args.toy else HERE / "raw")).resolve()
    seed_list = seeds(proto, HERE)
    jobs = [(arm, s) for s in seed_list for arm in proto["arms"]]
    if args.status:
        print(f"{sum(packed(raw / f'{a}_s{s}') for a, s in jobs)} of {len(jobs)} (arm, seed) pairs packed")
        return
    if not args.toy:
        check_frozen(HERE, Path(args.code))
    out.mkdir(parents=True, exist_ok=True)
    cmd, t0 = Commands(Path(args.code), out / "timings.jsonl"), time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(lambda s: run_seed(proto, cmd, s, out, raw), seed_list))
    print(f"done in {time.perf_counter() - t0:.0f} s; each command's time in {out / 'timings.jsonl'}")


if __name__ == "__main__":
    main()
