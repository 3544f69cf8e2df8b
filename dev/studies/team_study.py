"""The machinery both pre-registered team studies share (dev/studies/team_scr, dev/studies/team_mappa): run
every (arm, seed) of a study's ``protocol.json`` with ``soar-team`` from the frozen commit's code (resumable),
pack each finished run into ``raw/``, and analyse the packed runs alone, refusing partial data.

    git worktree add --detach /work/studies/team/code $(cat dev/studies/team_scr/FROZEN_COMMIT)
    nice -n 5 python dev/studies/team_scr/run.py --code /work/studies/team/code --out /work/studies/team_scr
    python dev/studies/team_scr/run.py --code . --out /tmp/team_scr_toy --toy     # the pipeline at toy size
    python dev/studies/team_scr/analyze.py                                        # raw/ -> results.json

First the world model, once for both studies: ``soar-world pretrain <preset> world.out_dir=<world model>``
(``dev/studies/team_world_model/``, committed beside the raw data so that a study finished on another
machine uses the same weights; ``--toy``: the tests' micro team world model, ``world_model_dir`` of its
section). Then a run is ``soar-team <preset> seed=<s> run.dir=<out>/<arm>_s<s> world.out_dir=<world model>
<common overrides> <arm overrides>``; a killed run resumes from its checkpoint when ``run.py`` is rerun
(``soar-team``'s own resume). The analysis: per arm the primary metric at the fixed read-out step, per seed;
mean +- SE (ddof 1); each arm minus its named baseline paired by seed, two-sided paired t (``soar.stats``).
Secondary metrics are reported, never gated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from common import Commands, check_frozen, load_protocol, pack_run, packed, read_jsonl_gz  # noqa: E402  (dev/studies/common.py)

from soar.stats import mean_se, paired_t  # noqa: E402

WORLD_MODEL = Path(__file__).resolve().parent / "team_world_model"
"""The team world model both studies run on (built by the first study's ``run.py``, then committed)."""


def run_name(arm: str, seed: int) -> str:
    return f"{arm}_s{seed}"


def team_args(proto: dict, arm: str, seed: int, run_dir: Path, world_model: Path) -> list[str]:
    return [proto["preset"], f"seed={seed}", f"run.dir={run_dir}", f"world.out_dir={world_model}",
            *proto["common_overrides"], *proto["arms"][arm]]


def run_main(here: Path) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", required=True, help="a worktree of the frozen commit (FROZEN_COMMIT beside protocol.json)")
    ap.add_argument("--out", required=True, help="where the run folders go")
    ap.add_argument("--raw", default=None, help="where finished runs are packed (default: this folder's raw/; "
                                                 "--toy: <out>/raw)")
    ap.add_argument("--world-model", default=None, help=f"the world model's folder (default: {WORLD_MODEL}, or the "
                                                         "protocol's world_model_dir in --code), built there if absent")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--status", action="store_true", help="how many runs are packed (no numbers)")
    ap.add_argument("--pilot", action="store_true", help="time one run of each arm on the pilot seed (not analysed)")
    ap.add_argument("--toy", action="store_true", help="protocol.json's toy sizes: a smoke test, never data")
    args = ap.parse_args()
    proto, out = load_protocol(here, args.toy), Path(args.out).resolve()
    raw = Path(args.raw or (out / "raw" if args.toy else here / "raw")).resolve()
    seeds = [proto["pilot_seed"]] if args.pilot else proto["seeds"]
    jobs = [(arm, s) for s in seeds for arm in proto["arms"]]
    if args.status:
        print(f"{sum(packed(raw / run_name(*job)) for job in jobs)} of {len(jobs)} runs packed")
        return
    if not args.toy:
        check_frozen(here, Path(args.code))
    out.mkdir(parents=True, exist_ok=True)
    cmd, t0 = Commands(Path(args.code), out / "timings.jsonl"), time.perf_counter()
    world_model = Path(args.world_model or (Path(args.code) / proto["world_model_dir"] if "world_model_dir" in proto
                                            else WORLD_MODEL)).resolve()
    if not (world_model / "train_info.json").exists():
        cmd.soar("soar-world", ["pretrain", proto["preset"], f"world.out_dir={world_model}", "run.progress=false"],
                 out / "world_model.log")
        print(f"built the world model in {world_model} ({time.perf_counter() - t0:.0f} s)", flush=True)

    def run(job) -> None:
        name, started = run_name(*job), time.perf_counter()
        if packed(raw / name):
            return
        if not (out / name / "summary.json").exists():
            cmd.soar("soar-team", team_args(proto, *job, out / name, world_model), out / f"{name}.log")
        if not args.pilot:
            pack_run(out / name, raw / name, {"problems.json": out / name / "problems.json"})
        print(f"done {name} in {time.perf_counter() - started:.0f} s ({time.perf_counter() - t0:.0f} s in all)", flush=True)

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(run, jobs))


def value_at(rows: list[dict], metric: str, step: int):
    row = next((r for r in rows if r["step"] == step and metric in r), None)
    return None if row is None else row[metric]


def analyze(proto: dict, raw: Path, allow_partial: bool = False) -> dict:
    """The protocol's analysis of the packed runs in ``raw`` (``allow_partial``: for tests on a sample only)."""
    step, metric = proto["readout_step"], proto["primary"]["metric"]
    values: dict[str, dict[int, float]] = {arm: {} for arm in proto["arms"]}
    secondary: dict[str, dict[str, dict[int, float]]] = {arm: {} for arm in proto["arms"]}
    missing, identities = [], set()
    for arm in proto["arms"]:
        for seed in proto["seeds"]:
            folder = raw / run_name(arm, seed)
            if not (folder / "summary.json").exists():
                missing.append(run_name(arm, seed))
                continue
            rows = read_jsonl_gz(folder / "metrics.jsonl.gz")
            v = value_at(rows, metric, step)
            if v is None:
                raise SystemExit(f"{folder}: no {metric} at the read-out step {step}")
            values[arm][seed] = float(v)
            identities.add(json.loads((folder / "meta.json").read_text())["model"]["identity"])
            for name in proto["secondary"]:
                sv = value_at(rows, name, step)
                if sv is not None:
                    secondary[arm].setdefault(name, {})[seed] = float(sv)
    if missing and not allow_partial:
        raise SystemExit(f"refusing to analyse partial data: {len(missing)} registered runs are not packed "
                         f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''})")
    if len(identities) > 1:
        raise SystemExit(f"the runs used {len(identities)} different world models ({sorted(identities)}): one is registered")
    arms = {arm: {"primary": mean_se([v[s] for s in sorted(v)]),
                  "secondary": {k: mean_se([d[s] for s in sorted(d)]) for k, d in secondary[arm].items()}}
            for arm, v in values.items()}
    comparisons = {}
    for arm, baseline in proto["baselines"].items():
        seeds = sorted(set(values[arm]) & set(values[baseline]))
        diffs = [values[arm][s] - values[baseline][s] for s in seeds]
        comparisons[f"{arm} - {baseline}"] = {**paired_t(diffs), "seeds": seeds}
    return {"protocol": proto["claim"], "readout_step": step, "metric": metric, "partial": bool(missing),
            "missing": missing, "world_model": sorted(identities), "arms": arms, "comparisons": comparisons}


def analyze_main(here: Path) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", default=str(here / "raw"))
    ap.add_argument("--out", default=str(here / "results.json"))
    ap.add_argument("--allow-partial", action="store_true", help="tests on a sample only; never for the report")
    ap.add_argument("--toy", action="store_true", help="protocol.json's toy sizes (with --raw and --out of a toy run)")
    args = ap.parse_args()
    result = analyze(load_protocol(here, args.toy), Path(args.raw), args.allow_partial)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for arm, a in result["arms"].items():
        p = a["primary"]
        print(f"{arm:>16}: {p['mean']:.4f} +- {p['se'] or 0:.4f} (n {p['n']})" if p["mean"] is not None else f"{arm}: -")
    for name, c in result["comparisons"].items():
        print(f"{name:>34}: {c['mean'] if c['mean'] is not None else float('nan'):+.4f} t {c['t']} p {c['p']}")
