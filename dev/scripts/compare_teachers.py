"""The world-selection gate: Grounded-T against Base-T in the loop itself, paired by seed, for one
candidate world (a set of overrides). A long run (hours on 2 cores, minutes on a 16-core GPU host),
not CI; writes ``gate.json`` and, with ``--name``, ``dev/results/world_gate_<name>.json``.

    python dev/scripts/compare_teachers.py --out runs/gate --name arith --seeds 0 1 2
    python dev/scripts/compare_teachers.py --out runs/gate_plan --name plan -- world.teacher_carries=plan ...
    python dev/scripts/compare_teachers.py --out runs/gate --parallel 6 --threads 2    # a 16-core host

One fail@k hard set is built first and shared by every run (``loop.hard_set``). For each seed it
runs ``soar-train experiment=arith`` (``--experiment``) as Grounded-T; as Base-T, the same loop with a frozen teacher
(``teacher.frozen=true``: it promotes by the same rule, so both are measured against comparably
strong students); and as Base-T without promotion (``base_fixed``: the base student throughout),
``--parallel`` runs at a time with ``--threads`` threads each. Runs
resume from their checkpoints, so a killed gate (or one continued with a larger ``loop.steps``)
picks up where it stopped; ``--analyse-only`` rebuilds the report from the run folders. A continued
run is the same run only where the teacher's schedule does not follow ``loop.steps`` (``experiment=arith``
fixes ``teacher.max_steps: 200``; with ``${loop.steps}`` the cosine is stretched mid-run).

Reported per seed: the mean step reward over the last third of the steps, Grounded-T minus
Base-T; promotions and the step rewards after each one; and, through the world's answer oracle
(measured on the step dumps, never fed to the loop), the trajectories of the teacher's
answer-correct fraction, its stepping-stone-like fraction (questions with a carry count in
``world.stepping_carries``) and its correct stepping-stone-like fraction. The gate passes when
Grounded-T's last-third mean beats Base-T's in at least 2 of 3 seeds (a majority) and the pooled
paired difference (every last-third step of every seed, Grounded-T minus Base-T at the same seed
and step) exceeds 2 standard errors. ``seeds_promotions_differ`` lists the seeds whose two runs were
promoted a different number of times: their last thirds compare rewards against baselines of
different strength, which ``dev/scripts/after_promotion.py GT_RUN --against BT_RUN`` removes (both
teachers' datasets trained from the same promoted student).
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

import numpy as np
from frontier import mean_se  # dev/scripts/frontier.py: run as a script, scripts/ is on sys.path

RESULTS = Path(__file__).resolve().parents[1] / "results"  # dev/results
VARIANTS = {"grounded": [], "base": ["teacher.frozen=true"],
            "base_fixed": ["teacher.frozen=true", "promotion.enabled=false"]}
"""Grounded-T; Base-T, the same loop with a frozen teacher (it promotes by the same rule, so its
rewards are measured against students as strong as Grounded-T's); and Base-T against the base
student throughout (no promotion)."""


def cli(name: str) -> list[str]:
    """A soar console script, or the same entry point through this Python where it is not installed
    (a GPU host that runs soar from a ``PYTHONPATH``)."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    entry = {"soar-train": "train_main", "soar-filter": "filter_main", "soar-world": "world_main"}[name]
    return [sys.executable, "-c", f"import sys; from soar.cli import {entry}; sys.argv[0] = {name!r}; {entry}()"]


def sh(args: list[str], log: Path, threads: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "a") as fh:
        res = subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({res.returncode}); see {log}")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def teacher_trajectory(run_dir: Path, stepping: list[int]) -> dict[str, list[float]]:
    """Per outer step, from the step dumps: the teacher's answer-correct, stepping-stone-like and
    correct stepping-stone-like fractions of its valid pairs, the fraction both harder than the
    stepping stones and answered right (what can still teach a promoted student, docs/world.md "After
    a promotion"), and their mean carry count."""
    from soar.worlds.arith import carries_of, oracle_answer, parse_question

    out = {"answer_correct_frac": [], "s_like_frac": [], "s_like_correct_frac": [], "beyond_s_correct_frac": [],
           "carries_mean": []}
    for f in sorted((run_dir / "steps").glob("step_*.json")):
        rows = []
        for d in json.loads(f.read_text())["datasets"]:
            for q in d["questions"]:
                parsed = parse_question(q["question"])
                carries = carries_of(*parsed) if parsed else None
                rows.append((carries, oracle_answer(q["question"]) == q["answer"]))
        out["answer_correct_frac"].append(float(np.mean([ok for _, ok in rows])))
        out["s_like_frac"].append(float(np.mean([c in stepping for c, _ in rows])))
        out["s_like_correct_frac"].append(float(np.mean([c in stepping and ok for c, ok in rows])))
        out["beyond_s_correct_frac"].append(float(np.mean([c is not None and c > max(stepping) and ok
                                                           for c, ok in rows])))
        out["carries_mean"].append(float(np.mean([c for c, _ in rows if c is not None] or [np.nan])))
    return out


def reward_follows_answers(run_dir: Path) -> dict:
    """How the grounded reward points the teacher at right answers: over every step dump, each dataset's
    reward and right-answer fraction (oracle), both minus their step's mean (what RLOO's advantages see),
    pooled into Pearson r and the slope (reward units per unit of right-answer fraction)."""
    from soar.worlds.arith import oracle_answer

    right_D, reward_D = [], []
    for f in sorted((run_dir / "steps").glob("step_*.json")):
        datasets = json.loads(f.read_text())["datasets"]
        right = np.array([np.mean([oracle_answer(q["question"]) == q["answer"] for q in d["questions"]]) for d in datasets])
        reward = np.array([d["reward"] for d in datasets])
        right_D += list(right - right.mean())
        reward_D += list(reward - reward.mean())
    x, y = np.array(right_D), np.array(reward_D)
    spread = float(x @ x) > 0 and float(y @ y) > 0
    return {"r": float(x @ y / np.sqrt((x @ x) * (y @ y))) if spread else None,
            "slope": float(x @ y / (x @ x)) if float(x @ x) > 0 else None, "datasets": len(x),
            "right_frac_sd_within_step": float(x.std()) if len(x) else None}


def last_third(xs: list[float]) -> list[float]:
    return xs[len(xs) - len(xs) // 3:] if len(xs) >= 3 else xs


def summarise(run_dir: Path, stepping: list[int]) -> dict:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    rewards = [r["teacher/reward_mean"] for r in rows]
    promotions = read_jsonl(run_dir / "promotions.jsonl")
    bounds = [p["step"] for p in promotions] + [len(rewards)]
    return {"steps": len(rows), "rewards": rewards, "reward_mean": float(np.mean(rewards)) if rewards else None,
            "last_third_mean": float(np.mean(last_third(rewards))) if rewards else None,
            "moving_average": [r["promotion/moving_average"] for r in rows],
            "promotions": len(promotions),
            "promotion_records": [{k: p[k] for k in ("promotion", "step", "dataset_reward", "moving_average",
                                                     "hard_train_acc", "hard_test_acc")} for p in promotions],
            "rewards_after_promotion": [rewards[a:b] for a, b in zip(bounds, bounds[1:])],
            "teacher_updates_skipped": int(sum(r.get("teacher/skipped_zero_adv", 0) for r in rows)),
            "teacher": teacher_trajectory(run_dir, stepping),
            "reward_vs_right_answers": reward_follows_answers(run_dir),
            "seconds_per_step": float(np.mean([r.get("time/phases_s", r.get("time/step_s")) for r in rows]))
            if rows else None}


def gate(runs: dict, seeds: list[int], base: str = "base") -> dict:
    """Grounded-T minus ``base`` over the last third, per seed and pooled over (seed, step) pairs."""
    per_seed, pooled = {}, []
    for s in seeds:
        gt, bt = runs[f"grounded_s{s}"]["rewards"], runs[f"{base}_s{s}"]["rewards"]
        n = min(len(gt), len(bt))
        if n == 0:
            continue
        gt_l, bt_l = last_third(gt[:n]), last_third(bt[:n])
        per_seed[s] = float(np.mean(gt_l) - np.mean(bt_l))
        pooled += [a - b for a, b in zip(gt_l, bt_l)]
    pooled_paired = mean_se(pooled)
    mean, se = pooled_paired["mean"], pooled_paired["se"]
    pooled_paired["z"] = mean / se if se else None
    promotions = {s: runs[f"grounded_s{s}"]["promotions"] for s in seeds}
    base_promotions = {s: runs[f"{base}_s{s}"]["promotions"] for s in seeds}
    wins = sum(d > 0 for d in per_seed.values())
    return {"gt_minus_bt_last_third": per_seed,
            "pooled_paired": pooled_paired,
            "seed_level": mean_se(list(per_seed.values())),
            "seeds_grounded_beats_base": int(wins), "promotions": promotions, "base_promotions": base_promotions,
            # a last third where the two runs were promoted a different number of times compares rewards
            # against baselines of different strength: read those seeds with after_promotion.py --against
            "seeds_promotions_differ": [s for s in seeds if promotions[s] != base_promotions[s]],
            "seeds_with_promotion": int(sum(p > 0 for p in promotions.values())),
            "passes_reward_gate": bool(wins * 3 >= 2 * len(seeds) and se is not None and mean > 2 * se),
            "passes_promotion_gate": bool(sum(p > 0 for p in promotions.values()) * 3 >= 2 * len(seeds))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/gate")
    ap.add_argument("--name", help="also write dev/results/world_gate_<name>.json")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--experiment", default="arith", help="the preset the overrides apply to")
    ap.add_argument("--steps", type=int, default=40, help="outer steps per run (loop.steps)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--analyse-only", action="store_true", help="only rebuild the report from the run folders")
    ap.add_argument("overrides", nargs="*", help="the candidate world: Hydra overrides for every run (after --)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    common = [f"experiment={args.experiment}", "run.progress=false", "loop.diversity_model=null", *args.overrides]

    import soar
    from soar.stage import resolve_model_path

    cfg = soar.compose(common)
    resolve_model_path(cfg)  # the cached or packaged world model (pretrained here if neither)
    model = cfg.model.path
    hard = out / "hard_set"
    if not (hard / "summary.json").exists():
        sh([*cli("soar-world"), "problems", f"run.dir={out / 'problems'}", *common], out / "prepare.log", args.threads)
        sh([*cli("soar-filter"), f"model.path={model}", f"data.path={out / 'problems' / 'pool.jsonl'}",
            f"run.dir={hard}", *common], out / "prepare.log", args.parallel * args.threads)
    jobs = [(v, s) for s in args.seeds for v in args.variants]  # seed by seed: a seed's pair runs side by side

    def run(job):
        v, s = job
        sh([*cli("soar-train"), f"seed={s}", f"model.path={model}", f"loop.hard_set={hard}", f"loop.steps={args.steps}",
            f"run.dir={out / f'{v}_s{s}'}", f"run.threads={args.threads}", *common, *VARIANTS[v]],
           out / f"{v}_s{s}.log", args.threads)
        print(f"done {v} seed {s} ({time.perf_counter() - t0:.0f}s)", flush=True)

    if not args.analyse_only:
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(run, jobs))

    stepping = list(cfg.world.stepping_carries)
    runs = {f"{v}_s{s}": summarise(out / f"{v}_s{s}", stepping) for v, s in jobs}
    report = {"name": args.name, "overrides": args.overrides, "seeds": args.seeds, "steps": args.steps,
              "model": model, "hard_set": str(hard),
              "hard_set_size": json.loads((hard / "summary.json").read_text()).get("hard"),
              "reward_metric": cfg.inner.reward_metric, "tau": cfg.promotion.tau,
              **(gate(runs, args.seeds) if {"grounded", "base"} <= set(args.variants) else {}),
              **({"against_base_fixed": gate(runs, args.seeds, "base_fixed")}
                 if {"grounded", "base_fixed"} <= set(args.variants) else {}),
              "runs": runs, "seconds": time.perf_counter() - t0}
    (out / "gate.json").write_text(json.dumps(report, indent=2))
    if args.name:
        (RESULTS / f"world_gate_{args.name}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
