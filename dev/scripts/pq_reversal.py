"""Why the frozen teacher's Promotion Questions taught fresh students better than the learning teacher's
on the T = 200 gate (issue 50 §5: SOAR-PQ - Base-T PQ by teacher seed -42.1, +0.2, -21.4 pass@32).
Writes ``dev/results/pq_reversal.json``; the teacher seed is the unit (``soar.stats``).

    python dev/scripts/pq_reversal.py                                  # (a), (b) and (c) from committed data
    nice -n 5 python dev/scripts/pq_reversal.py --train runs/pq_reversal --code <worktree> --parallel 2  # (c) first

(a) **Data quality** of every Promotion Questions set behind the fresh students of the curriculum-mixing
    gates (τ = 0.02 seeds 0-2 and 3-5, T = 200 seeds 3-5; ``dev/results/raw``), through the world's
    answer oracle (a measurement; it never enters the loop): per promoted dataset its wrong-answer share,
    carry mix, stepping-stone share (``world.stepping_carries``) and right answers beyond the stepping
    stones; and the fresh students' accuracy on those questions during the curriculum's synthetic steps.
(b) **Read-out window**: which students the slope rule read around the curriculum switch (its stop step
    within the synthetic-only steps, as ``soar-eval`` ran it then, on every step), Fisher's exact test
    of SOAR-PQ against Base-T PQ, and each seed's SOAR-PQ - Base-T PQ read four ways: as recorded, by
    the slope rule as ``soar-eval`` runs it now (hard-train steps only, ``soar.evaluate``), at the fixed
    step and at the last step.
(c) **Ablation** on the T = 200 gate, fresh students trained now (the current code, whose sampling
    differs from the recorded students': no recorded student is reused), the same student seeds in every
    arm: ``full`` (SOAR-PQ as exported: every promotion's dataset), ``first`` (its first promotion's
    dataset alone: in seeds 4 and 5 exactly Base-T's, in seed 3 7 of Base-T's 8 questions), ``corrected``
    (SOAR-PQ with the oracle's answers; seeds whose SOAR-PQ has a wrong answer) and ``base`` (Base-T PQ,
    where it is not ``first``). Protocol: the recorded students' (40 steps at lr 1e-4, curriculum with 13
    synthetic-only steps, 32 samples on the 145 hard-test problems, fixed step 20) with evaluations every
    ``--eval-every`` steps (20: the fixed and last steps, at two thirds of the CPU time). ``--train``
    runs the missing students (``--parallel`` at a time, resumable) and packs each ``eval.json`` into
    ``dev/results/raw/pq_reversal/``; the analysis reads only the packed files (none yet: ``c_ablation``
    then says it was not run).
(d) **The students one by one**: each PQ-row student's readings, its accuracy on its PQ questions in the
    synthetic-only steps and on hard train after them, whether it never took off (last-step pass@32 below
    ``TOOK_OFF``), and, post hoc and labelled so, SOAR-PQ - Base-T PQ without those students.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # soar, installed or not

from soar.stats import mean_se, paired_t  # noqa: E402

RAW = REPO / "dev" / "results" / "raw"
GATES = {"arith_g16_kl0.001_tau0.02_slr3e-5": "tau 0.02, seeds 0-2",
         "arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345": "tau 0.02, seeds 3-5",
         "arith_horizon200": "T = 200, seeds 3-5"}
"""The gates whose fresh students ran with curriculum mixing (the lr 3e-5 gate's mixed-batch students are
at ~0 in every row and not part of the reversal)."""
ABLATION_GATE = "arith_horizon200"
KEY = "eval/pass@32"
ROWS = ("SOAR-PQ", "Base-T PQ", "Hard-Only")
EVAL = ["experiment=arith", "run.progress=false", "run.threads=1", "eval.steps=40", "eval.warmup_steps=4",
        "eval.curriculum_steps=13", "eval.fixed_step=20", "eval.slope.window=11", "eval.slope.report_steps=20",
        "eval.samples=32", "eval.ks=[1,4,8,16,32]", "eval.method=questions"]
"""The recorded fresh students' soar-eval overrides (methods_horizon's meta.json), less the method's."""


def read_gz_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_gz_json(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def stepping_carries(gate: str) -> list[int]:
    from omegaconf import OmegaConf

    with gzip.open(RAW / gate / "grounded_s0" / "config.yaml.gz" if (RAW / gate / "grounded_s0").exists()
                   else next((RAW / gate).glob("grounded_s*/config.yaml.gz")), "rt") as fh:
        return list(OmegaConf.create(fh.read()).world.stepping_carries)


def quality(rows: list[dict], stepping: list[int]) -> dict:
    """Oracle statistics of a set of (question, answer) rows."""
    from soar.worlds.arith import carries_of, oracle_answer, parse_question

    carries = [carries_of(*parse_question(r["question"])) for r in rows]
    right = [oracle_answer(r["question"]) == r["answer"] for r in rows]
    return {"questions": len(rows), "wrong": int(len(rows) - sum(right)), "wrong_share": 1 - float(np.mean(right)),
            "carries_mean": float(np.mean(carries)), "carries": carries,
            "carries_of_wrong": [c for c, ok in zip(carries, right) if not ok],
            "stepping_share": float(np.mean([c in stepping for c in carries])),
            "right_beyond_stepping_share": float(np.mean([c > max(stepping) and ok for c, ok in zip(carries, right)]))}


def pq_sets(gate: str) -> dict[str, dict]:
    """Per run of a gate: its PQ set's oracle statistics, whole and per promoted dataset."""
    stepping, out = stepping_carries(gate), {}
    for run in sorted(p for p in (RAW / gate).glob("*_s*") if (p / "pq.jsonl.gz").exists()):
        pq = read_gz_jsonl(run / "pq.jsonl.gz")
        if not pq:
            continue
        out[run.name] = {"all": quality(pq, stepping),
                         "datasets": [{"promotion": p, "step": next(r["step"] for r in pq if r["promotion"] == p),
                                       **quality([r for r in pq if r["promotion"] == p], stepping)}
                                      for p in sorted({r["promotion"] for r in pq})]}
    return out


def students(gate: str) -> list[dict]:
    """A gate's recorded fresh students (eval.json), with their teacher seed."""
    out = []
    for d in sorted((RAW / gate / "fresh").glob("*/eval.json.gz")):
        e = read_gz_json(d)
        if "evals" in e:  # training rows only
            out.append({**e, "teacher_seed": e["seed"] // 100})
    return out


def readings(e: dict) -> dict[str, float]:
    """A fresh student's pass@32 read four ways: as recorded (the slope rule over every step, as soar-eval
    ran it then), by the slope rule as soar-eval runs it now (hard-train steps only), at the fixed step
    and at the last step."""
    from soar.evaluate import slope_rule, window_mean

    sr = e["slope"]
    first = e["curriculum_steps"] + 1 if e.get("mixing") == "curriculum" else 1
    rule = slope_rule(e["train_reward"], sr["window"], sr["threshold"], sr["fallback_step"], first)
    return {"recorded": e["selected"][KEY], "slope_rule_now": window_mean(e["evals"], rule.stop_step, sr["report_steps"],
                                                                          e["steps"])[KEY],
            "fixed_step": e["fixed"][KEY], "last_step": e["final"][KEY]}


def row_by_seed(studs: list[dict], label: str) -> dict[int, dict[str, float]]:
    by: dict[int, list[dict]] = {}
    for e in studs:
        if e["label"] == label:
            by.setdefault(e["teacher_seed"], []).append(readings(e))
    return {s: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} for s, rs in sorted(by.items())}


def compare(a: dict[int, dict], b: dict[int, dict]) -> dict:
    """a minus b per teacher seed, in points, each reading; paired t over the seeds (two-sided)."""
    common = sorted(set(a) & set(b))
    out = {}
    for k in (a[common[0]] if common else {}):
        d = {s: 100 * (a[s][k] - b[s][k]) for s in common}
        out[k] = {"per_seed": d, "test": paired_t(list(d.values()))}
    return out


# ---- (d) the students one by one ---------------------------------------------------------------
TOOK_OFF = 0.05
"""pass@32 at the last step below which a fresh student never took off: the base student fails every hard
problem, so a student at ~0 after 40 steps learned nothing usable (as Hard-Only's students mostly do)."""


def per_student(gate: str) -> dict:
    """Each PQ-row student of a gate: its readings, its accuracy on the PQ questions in the synthetic-only
    steps and on hard train after them; which never took off; and SOAR-PQ - Base-T PQ per teacher seed
    without the students that never took off (a post-hoc reading, labelled as such)."""
    rows, took_off = {}, {}
    for e in students(gate):
        if e["label"] not in ROWS:
            continue
        c = e["curriculum_steps"]
        r = {**readings(e), "synthetic_train_accuracy": float(np.mean(e["train_accuracy"][:c])),
             "hard_train_accuracy_after": float(np.mean(e["train_accuracy"][c:])),
             "stop_step": e["slope_rule"]["stop_step"], "read_in_synthetic_steps": e["slope_rule"]["stop_step"] <= c,
             "took_off": e["final"][KEY] >= TOOK_OFF}
        rows.setdefault(e["label"], {})[f"{e['teacher_seed']}/{e['seed']}"] = r
        took_off.setdefault(e["label"], [0, 0])
        took_off[e["label"]][0] += not r["took_off"]
        took_off[e["label"]][1] += 1
    kept = {}
    for label in ("SOAR-PQ", "Base-T PQ"):
        by: dict[int, list[float]] = {}
        for key, r in rows.get(label, {}).items():
            if r["took_off"]:
                by.setdefault(int(key.split("/")[0]), []).append(r["recorded"])
        kept[label] = {s: float(np.mean(v)) for s, v in sorted(by.items())}
    common = sorted(set(kept["SOAR-PQ"]) & set(kept["Base-T PQ"]))
    diffs = {s: 100 * (kept["SOAR-PQ"][s] - kept["Base-T PQ"][s]) for s in common}
    return {"students": rows, "never_took_off": {k: {"students": v[1], "never_took_off": v[0]} for k, v in took_off.items()},
            "soar_minus_base_recorded_without_students_that_never_took_off_post_hoc": {
                "per_seed": diffs, "test": paired_t(list(diffs.values()))}}


# ---- (c) the ablation's students ---------------------------------------------------------------
def arms(gate: str = ABLATION_GATE) -> dict[str, list[dict]]:
    """``<arm>_s<teacher seed>``: the questions of each ablation arm."""
    from soar.worlds.arith import oracle_answer

    out = {}
    for run in sorted((RAW / gate).glob("grounded_s*")):
        s = int(run.name.split("_s")[1])
        pq = read_gz_jsonl(run / "pq.jsonl.gz")
        base = read_gz_jsonl(RAW / gate / f"base_s{s}" / "pq.jsonl.gz")
        first = [r for r in pq if r["promotion"] == 1]
        out[f"full_s{s}"] = pq
        out[f"first_s{s}"] = first
        if any(oracle_answer(r["question"]) != r["answer"] for r in pq):
            out[f"corrected_s{s}"] = [{**r, "answer": oracle_answer(r["question"])} for r in pq]
        if [r["question"] for r in base] != [r["question"] for r in first]:
            out[f"base_s{s}"] = base
    return out


def queue(arm_sets: dict, students_per_arm: int) -> list[tuple[str, int]]:
    """(arm, student seed), round by round (student j of every arm before student j + 1), the seeds with the
    largest reversal first, so that a queue stopped early stays balanced."""
    order = {3: 0, 5: 1, 4: 2}
    names = sorted(arm_sets, key=lambda a: (a.startswith("base"), order.get(int(a.split("_s")[1]), 9), a))
    return [(a, int(a.split("_s")[1]) * 100 + j) for j in range(students_per_arm) for a in names]


def train(out: Path, students_per_arm: int, eval_every: int, code: Path, parallel: int) -> None:
    """Run the missing ablation students (soar-eval of ``code``, one thread each, ``parallel`` at a time),
    packing each eval.json."""
    from concurrent.futures import ThreadPoolExecutor

    arm_sets = arms()
    hard = out / "hard_set"
    hard.mkdir(parents=True, exist_ok=True)
    for name in ("hard_train.jsonl", "hard_test.jsonl"):
        (hard / name).write_bytes(gzip.open(RAW / ABLATION_GATE / "hard_set" / f"{name}.gz").read())
    for arm, rows in arm_sets.items():
        path = out / "questions" / f"{arm}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({k: r[k] for k in ("id", "question", "answer")}) + "\n" for r in rows))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(code)}
    resolve = ("import soar; from soar.stage import resolve_model_path; "
               "cfg = soar.compose(['experiment=arith']); resolve_model_path(cfg); print(cfg.model.path)")
    model_path = subprocess.run([sys.executable, "-c", resolve], env=env, cwd=code, capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]  # the code's own world model

    def student(job) -> None:
        arm, k = job
        packed = RAW / "pq_reversal" / f"{arm}_k{k}" / "eval.json.gz"
        if packed.exists():
            return
        run_dir = out / "eval" / f"{arm}_k{k}"
        if not (run_dir / "eval.json").exists():
            args = [sys.executable, "-c", "import sys; from soar.cli import eval_main as m; sys.argv[0] = 'soar-eval'; m()",
                    *EVAL, f"eval.eval_every={eval_every}", f"model.path={model_path}", f"loop.hard_set={hard}",
                    f"eval.questions={out / 'questions' / f'{arm}.jsonl'}", f"seed={k}", f"eval.label={arm}",
                    f"run.dir={run_dir}"]
            with open(out / f"eval_{arm}_k{k}.log", "a") as log:
                subprocess.run(args, env=env, cwd=code, stdout=log, stderr=subprocess.STDOUT, check=True)
        packed.parent.mkdir(parents=True, exist_ok=True)
        with gzip.GzipFile(packed, "wb", mtime=0) as fh:
            fh.write((run_dir / "eval.json").read_bytes())
        print(f"done {arm} k {k}", flush=True)

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(student, queue(arm_sets, students_per_arm)))


def ablation() -> dict:
    """Per arm (one teacher seed each), each reading's mean over its students; arms compared per teacher
    seed over the student seeds both have (one student seed is one sampling stream in every arm), and over
    teacher seeds (the unit) by a paired t of those per-seed means."""
    found: dict[str, dict[int, dict]] = {}
    for path in sorted((RAW / "pq_reversal").glob("*_k*/eval.json.gz")):
        arm, k = path.parent.name.rsplit("_k", 1)
        e = read_gz_json(path)
        found.setdefault(arm, {})[int(k)] = {
            "fixed_step": e["fixed"][KEY], "last_step": e["final"][KEY], "slope_rule_now": e["selected"][KEY],
            "synthetic_train_accuracy": float(np.mean(e["train_accuracy"][:e["curriculum_steps"]])),
            "stop_step": e["slope_rule"]["stop_step"]}
    if not found:
        return {}

    def arm(name: str, s: int) -> dict | None:
        if name == "base" and f"base_s{s}" not in found:
            name = "first"  # Base-T PQ is `first` in the seeds where the two are the same questions
        return found.get(f"{name}_s{s}")

    readings_ = ("fixed_step", "last_step", "slope_rule_now")
    contrasts = {}
    for a, b in (("full", "first"), ("corrected", "first"), ("full", "corrected"), ("full", "base"), ("first", "base")):
        per_seed, per_student = {}, {}
        for s in (3, 4, 5):
            fa, fb = arm(a, s), arm(b, s)
            if not fa or not fb or fa is fb:
                continue
            ks = sorted(set(fa) & set(fb))
            per_student[s] = {key: [100 * (fa[k][key] - fb[k][key]) for k in ks] for key in readings_}
            per_seed[s] = {key: float(np.mean(v)) for key, v in per_student[s].items()}
        if per_seed:
            contrasts[f"{a} - {b}"] = {
                "per_teacher_seed_points": per_seed, "per_student_points": per_student,
                "over_teacher_seeds": {key: paired_t([v[key] for v in per_seed.values()]) for key in readings_},
                "pooled_students_not_independent_across_arms_of_a_seed": {
                    key: mean_se([x for v in per_student.values() for x in v[key]]) for key in readings_}}
    return {"students": {name: {str(k): v for k, v in sorted(ks.items())} for name, ks in sorted(found.items())},
            "by_arm": {name: {key: mean_se([v[key] for v in ks.values()])
                              for key in (*readings_, "synthetic_train_accuracy")} for name, ks in sorted(found.items())},
            "contrasts": contrasts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "dev" / "results" / "pq_reversal.json"))
    ap.add_argument("--train", help="a work folder: run the ablation's missing students there first")
    ap.add_argument("--students", type=int, default=4, help="fresh students per ablation arm")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--code", default=str(REPO), help="the checkout whose soar-eval trains the students (a worktree "
                                                       "of a fixed commit for a long run)")
    ap.add_argument("--parallel", type=int, default=1, help="students trained side by side (one thread each)")
    ap.add_argument("--status", action="store_true", help="how many of (c)'s students are packed (no numbers)")
    args = ap.parse_args()
    if args.status:
        jobs = queue(arms(), args.students)
        done = sum((RAW / "pq_reversal" / f"{arm}_k{k}" / "eval.json.gz").exists() for arm, k in jobs)
        print(f"{done} of {len(jobs)} ablation students packed")
        return
    if args.train:
        train(Path(args.train).resolve(), args.students, args.eval_every, Path(args.code).resolve(), args.parallel)
    from scipy import stats

    report: dict = {"unit": "the teacher seed (a gate's run pair); pass@32 in points; SE ddof 1"}
    # (a) data quality, and the students' accuracy on those questions in the synthetic-only steps
    quality_by_gate, switch, table = {}, {label: [0, 0] for label in ROWS}, {}
    for gate, what in GATES.items():
        sets, studs = pq_sets(gate), students(gate)
        syn = {}
        for e in studs:
            if e["label"] in ("SOAR-PQ", "Base-T PQ"):
                syn.setdefault(e["label"], {}).setdefault(e["teacher_seed"], []).append(
                    float(np.mean(e["train_accuracy"][:e["curriculum_steps"]])))
        quality_by_gate[gate] = {"what": what, "pq_sets": sets,
                                 "synthetic_train_accuracy": {lab: {s: float(np.mean(v)) for s, v in sorted(d.items())}
                                                              for lab, d in syn.items()}}
        # (b) read-out: the slope rule's stop step within the synthetic-only steps
        for e in studs:
            if e["label"] in switch:
                switch[e["label"]][0] += e["slope_rule"]["stop_step"] <= e["curriculum_steps"]
                switch[e["label"]][1] += 1
        rows = {label: row_by_seed(studs, label) for label in ROWS}
        table[gate] = {"what": what, "rows": rows,
                       "SOAR-PQ - Base-T PQ": compare(rows["SOAR-PQ"], rows["Base-T PQ"]),
                       "SOAR-PQ - Hard-Only": compare(rows["SOAR-PQ"], rows["Hard-Only"]),
                       "Base-T PQ - Hard-Only": compare(rows["Base-T PQ"], rows["Hard-Only"])}
    report["a_data_quality"] = quality_by_gate
    # one row per teacher seed: the PQ sets' wrong answers against the reversal
    per_teacher = []
    for gate in GATES:
        sets, rev = quality_by_gate[gate]["pq_sets"], table[gate]["SOAR-PQ - Base-T PQ"]
        for s in sorted(rev["recorded"]["per_seed"]):
            per_teacher.append({"gate": gate, "seed": s,
                                **{f"{who}_{k}": sets[f"{run}_s{s}"]["all"][k] for who, run in (("soar_pq", "grounded"),
                                                                                                  ("base_pq", "base"))
                                   for k in ("questions", "wrong", "carries_mean")},
                                **{f"soar_minus_base_{k}": v["per_seed"][s] for k, v in rev.items()}})
    report["a_per_teacher_seed"] = per_teacher
    odds, p = stats.fisher_exact([[switch["SOAR-PQ"][0], switch["SOAR-PQ"][1] - switch["SOAR-PQ"][0]],
                                  [switch["Base-T PQ"][0], switch["Base-T PQ"][1] - switch["Base-T PQ"][0]]])
    report["b_readout"] = {"read_around_the_switch": {k: {"students": v[1], "stop_step_in_synthetic_steps": v[0]}
                                                       for k, v in switch.items()},
                           "fisher_exact_two_sided_p": float(p), "by_gate": table}
    report["c_ablation"] = ablation() or {
        "not_run": "no ablation students are packed (dev/results/raw/pq_reversal/): 4 arms x 3 teacher seeds x a few "
                   "students at ~9 min each on the 2 shared cores did not fit beside the confirmation runs; "
                   "`--train DIR` runs them (resumable)"}
    report["d_per_student"] = {gate: per_student(gate) for gate in GATES}
    nto = {lab: [0, 0] for lab in ROWS}
    for g in report["d_per_student"].values():
        for lab, v in g["never_took_off"].items():
            nto[lab][0] += v["never_took_off"]
            nto[lab][1] += v["students"]
    odds, p_nto = stats.fisher_exact([[nto["SOAR-PQ"][0], nto["SOAR-PQ"][1] - nto["SOAR-PQ"][0]],
                                      [nto["Base-T PQ"][0], nto["Base-T PQ"][1] - nto["Base-T PQ"][0]]])
    report["d_never_took_off_all_gates"] = {**{k: {"students": v[1], "never_took_off": v[0]} for k, v in nto.items()},
                                            "fisher_exact_two_sided_p_soar_pq_vs_base_t_pq": float(p_nto)}
    Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(json.dumps({"read_around_the_switch": report["b_readout"]["read_around_the_switch"], "fisher_p": p}, indent=1))
    for gate in GATES:
        print(gate, {k: {s: round(x, 1) for s, x in v["per_seed"].items()}
                     for k, v in table[gate]["SOAR-PQ - Base-T PQ"].items()})
    print("never took off:", report["d_never_took_off_all_gates"])
    for gate in GATES:
        print(gate, "without them (post hoc):", {s: round(x, 1) for s, x in report["d_per_student"][gate][
            "soar_minus_base_recorded_without_students_that_never_took_off_post_hoc"]["per_seed"].items()})
    print("wrote", args.out)


if __name__ == "__main__":
    main()
