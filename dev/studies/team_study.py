"""The machinery both pre-registered team studies share (dev/studies/team_scr, dev/studies/team_mappa): run
every (arm, seed) of a study's ``protocol.json`` with ``soar-team`` (resumable), pack each finished run into
``raw/``, and analyse the packed runs alone, refusing partial data.

    python dev/studies/team_scr/run.py --out /tmp/team_scr_runs            # resumable; --status: counts only
    python dev/studies/team_scr/analyze.py                                 # raw/ -> results.json

A run is ``soar-team <preset> seed=<s> run.dir=<out>/<arm>_s<s> <common overrides> <arm overrides>``; a killed
run resumes from its checkpoint when ``run.py`` is rerun (``soar-team``'s own resume). The analysis: per arm
the primary metric at the fixed read-out step, per seed; mean +- SE (ddof 1); each arm minus its named
baseline paired by seed, two-sided paired t (``soar.stats``). Secondary metrics are reported, never gated.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from soar.stats import mean_se, paired_t  # noqa: E402

PACKED = ("config.yaml", "meta.json", "summary.json", "problems.json")


def protocol(here: Path) -> dict:
    return json.loads((here / "protocol.json").read_text())


def run_name(arm: str, seed: int) -> str:
    return f"{arm}_s{seed}"


def command(proto: dict, arm: str, seed: int, run_dir: Path) -> list[str]:
    team = Path(sys.executable).parent / "soar-team"
    entry = [str(team)] if team.exists() else [sys.executable, "-c", "from soar.cli import team_main; team_main()"]
    return [*entry, proto["preset"], f"seed={seed}", f"run.dir={run_dir}", *proto["common_overrides"],
            *proto["arms"][arm]]


def pack(run_dir: Path, dest: Path) -> Path:
    """``metrics.jsonl`` gzipped and the run's provenance files: what the analysis reads."""
    dest.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "rb") as fin, gzip.GzipFile(dest / "metrics.jsonl.gz", "wb", mtime=0) as fout:
        shutil.copyfileobj(fin, fout)
    for name in PACKED:
        shutil.copyfile(run_dir / name, dest / name)
    return dest


def run_main(here: Path) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where the run folders go")
    ap.add_argument("--raw", default=str(here / "raw"), help="where finished runs are packed")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--status", action="store_true", help="how many runs are finished (no numbers)")
    ap.add_argument("--pilot", action="store_true", help="time one run of each arm on the pilot seed (not analysed)")
    args = ap.parse_args()
    proto, out, raw = protocol(here), Path(args.out).resolve(), Path(args.raw).resolve()
    seeds = [proto["pilot_seed"]] if args.pilot else proto["seeds"]
    jobs = [(arm, s) for s in seeds for arm in proto["arms"]]

    def finished(job) -> bool:
        name = run_name(*job)
        return (raw / name / "summary.json").exists() or (out / name / "summary.json").exists()

    if args.status:
        print(f"{sum(map(finished, jobs))} of {len(jobs)} runs finished")
        return
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()

    def run(job) -> None:
        arm, seed = job
        name = run_name(arm, seed)
        if (raw / name / "summary.json").exists():
            return
        started = time.perf_counter()
        if not (out / name / "summary.json").exists():
            with open(out / f"{name}.log", "a") as log:
                subprocess.run(command(proto, arm, seed, out / name), env=env, cwd=REPO, stdout=log,
                               stderr=subprocess.STDOUT, check=True)
        if not args.pilot:
            pack(out / name, raw / name)
        print(f"done {name} in {time.perf_counter() - started:.0f} s ({time.perf_counter() - t0:.0f} s in all)", flush=True)

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(run, jobs))


def read_rows(folder: Path) -> list[dict]:
    with gzip.open(folder / "metrics.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


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
            rows = read_rows(folder)
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
    args = ap.parse_args()
    result = analyze(protocol(here), Path(args.raw), args.allow_partial)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for arm, a in result["arms"].items():
        p = a["primary"]
        print(f"{arm:>16}: {p['mean']:.4f} +- {p['se'] or 0:.4f} (n {p['n']})" if p["mean"] is not None else f"{arm}: -")
    for name, c in result["comparisons"].items():
        print(f"{name:>34}: {c['mean'] if c['mean'] is not None else float('nan'):+.4f} t {c['t']} p {c['p']}")
