"""Grounded-T vs Base-T over seeds in the embedded world, tau calibration, and the promoted students
on the hard test split. A long run (tens of minutes on 2 cores), not CI; writes ``compare.json``.

    python scripts/compare_teachers.py --out runs/compare --seeds 0 1 2
    python scripts/compare_teachers.py --out runs/compare --seeds 0 1 2 -- loop.steps=20 inner.replicates=1

One fail@128 hard set is built first and shared by every run (``loop.hard_set``). For each seed it
runs ``soar-train experiment=arith`` twice: Grounded-T, and Base-T (``teacher.frozen=true
promotion.enabled=false``), two runs at a time with one thread each. Reported per run: the
3-step moving average (MA3) of the step reward (mean and max over steps), promotions, and each
promoted student's greedy accuracy on hard-test against the base model's (difference in binomial
standard errors). tau = the 95th percentile of MA3 over the Base-T runs' steps.
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


def sh(args: list[str], log: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "a") as fh:
        res = subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({res.returncode}); see {log}")


def ma3(xs) -> list[float]:
    return [float(np.mean(xs[i - 2:i + 1])) for i in range(2, len(xs))]


def summarise(run_dir: Path, n_test: int, base_test_acc: float) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["teacher/reward_mean"] for r in rows]
    promotions = [json.loads(line) for line in (run_dir / "promotions.jsonl").read_text().splitlines() if line]
    out = {"steps": len(rows), "reward_mean": float(np.mean(rewards)), "ma3": ma3(rewards),
           "ma3_mean": float(np.mean(ma3(rewards))), "ma3_max": float(np.max(ma3(rewards))),
           "promotions": len(promotions), "promotion_steps": [p["step"] for p in promotions],
           "answer_correct_frac": [r.get("teacher/answer_correct_frac") for r in rows],
           "seconds_per_step": float(np.mean([r["time/step_s"] for r in rows]))}
    if promotions:
        best = max(promotions, key=lambda p: p["hard_train_acc"])  # PS: best hard-train accuracy
        p1, p0 = best["hard_test_acc"], base_test_acc
        se = float(np.sqrt(p1 * (1 - p1) / n_test + p0 * (1 - p0) / n_test)) or float("nan")
        out["promoted_student"] = {"promotion": best["promotion"], "hard_train_acc": best["hard_train_acc"],
                                   "hard_test_acc": p1, "base_hard_test_acc": p0, "diff_in_se": (p1 - p0) / se}
    return out


def reward_signal(run_dirs: list[Path], stepping: list[int], rng_seed: int = 0) -> dict:
    """Criterion 6 of the world: over the untrained teacher's datasets, the correlation between a
    dataset's S-like fraction (questions with a stepping-stone carry count; also: with a correct
    answer) and its grounded reward, with a bootstrap 95 % interval."""
    from soar.worlds.arith import carries_of, oracle_answer, parse_question

    rows = []
    for run_dir in run_dirs:
        for f in sorted((run_dir / "steps").glob("step_*.json")):
            for d in json.loads(f.read_text())["datasets"]:
                s_like, s_correct = [], []
                for q in d["questions"]:
                    parsed = parse_question(q["question"])
                    c = carries_of(*parsed) if parsed else -1
                    s_like.append(c in stepping)
                    s_correct.append(c in stepping and oracle_answer(q["question"]) == q["answer"])
                rows.append((float(np.mean(s_like)), float(np.mean(s_correct)), d["reward"]))
    arr = np.array(rows)
    rng = np.random.default_rng(rng_seed)
    out = {"datasets": len(rows), "reward_mean": float(arr[:, 2].mean()), "reward_nonzero_frac": float((arr[:, 2] != 0).mean())}
    for name, col in (("s_frac", 0), ("s_correct_frac", 1)):
        x, y = arr[:, col], arr[:, 2]
        if x.std() == 0 or y.std() == 0:
            out[name] = {"correlation": None, "why": "no variance"}
            continue
        boots = []
        for _ in range(2000):
            idx = rng.integers(0, len(x), len(x))
            if x[idx].std() > 0 and y[idx].std() > 0:
                boots.append(np.corrcoef(x[idx], y[idx])[0, 1])
        out[name] = {"correlation": float(np.corrcoef(x, y)[0, 1]), "bootstrap_ci95": [float(np.percentile(boots, 2.5)),
                                                                                        float(np.percentile(boots, 97.5))]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/compare")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--analyse-only", action="store_true", help="only rebuild compare.json from finished runs")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every soar-train run (after --)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    t0 = time.perf_counter()

    model = subprocess.run([str(bin_dir / "soar-world"), "pretrain", "run.progress=false", *args.overrides],  # cached
                           capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    hard = out / "hard_set"
    if not (hard / "summary.json").exists():
        sh([str(bin_dir / "soar-world"), "problems", f"run.dir={out / 'problems'}", *args.overrides], out / "prepare.log")
        sh([str(bin_dir / "soar-filter"), "experiment=arith", f"model.path={model}",
            f"data.path={out / 'problems' / 'pool.jsonl'}", f"run.dir={hard}", "run.progress=false", *args.overrides],
           out / "prepare.log")
    n_test = sum(1 for _ in open(hard / "hard_test.jsonl"))

    variants = {"grounded": [], "base": ["teacher.frozen=true", "promotion.enabled=false"]}
    jobs = [(v, s) for s in args.seeds for v in variants]

    def run(job):
        v, s = job
        run_dir = out / f"{v}_s{s}"
        sh([str(bin_dir / "soar-train"), "experiment=arith", f"seed={s}", f"model.path={model}",
            f"loop.hard_set={hard}", f"run.dir={run_dir}", "run.threads=1", "run.progress=false",
            *variants[v], *args.overrides], out / f"{v}_s{s}.log")
        print(f"done {v} seed {s} ({time.perf_counter() - t0:.0f}s)", flush=True)
        return job

    if not args.analyse_only:
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(run, jobs))

    # The base model's greedy hard-test accuracy (0 up to greedy/sampling differences).
    import soar
    from soar.data import load_problems
    from soar.generation import HFGenerator
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from students.trainer import correctness

    cfg = soar.compose(["experiment=arith", f"model.path={model}", *args.overrides])
    base = load_model(cfg.model)
    test = load_problems(cfg.data, str(hard / "hard_test.jsonl"))
    base_test_acc = float(np.mean(correctness(HFGenerator(base, load_tokenizer(cfg.model)), make_grader(cfg.data.grader),
                                              test, cfg.data.prompt_template, cfg.student.max_tokens)))
    runs = {f"{v}_s{s}": summarise(out / f"{v}_s{s}", n_test, base_test_acc) for v, s in jobs}
    base_ma = [x for s in args.seeds for x in runs[f"base_s{s}"]["ma3"]]
    report = {
        "overrides": args.overrides, "seeds": args.seeds, "model": model, "hard_set": str(hard), "n_test": n_test,
        "base_hard_test_acc": base_test_acc, "tau_p95_base_ma3": float(np.percentile(base_ma, 95)),
        "grounded_beats_base_ma3_mean": {s: runs[f"grounded_s{s}"]["ma3_mean"] > runs[f"base_s{s}"]["ma3_mean"]
                                         for s in args.seeds},
        "seeds_with_promotion": sum(runs[f"grounded_s{s}"]["promotions"] > 0 for s in args.seeds),
        "reward_signal_base_teacher": reward_signal([out / f"base_s{s}" for s in args.seeds],
                                                    list(cfg.world.stepping_carries)),
        "runs": runs, "seconds": time.perf_counter() - t0}
    (out / "compare.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))
    for name, r in runs.items():
        print(name, {k: r[k] for k in ("ma3_mean", "ma3_max", "promotions", "promotion_steps")},
              r.get("promoted_student"))


if __name__ == "__main__":
    main()
