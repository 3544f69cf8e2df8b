"""Why rewards fall after a promotion: retrain a run's promoted student on datasets its teacher wrote
after the promotion, as written and with the teacher's wrong answers removed or corrected by the
world's answer oracle (a measurement only; the oracle never enters the loop). Writes JSON.

    python scripts/after_promotion.py runs/arith --out benchmarks/results/after_promotion.json

For each of ``--datasets`` datasets from the step dumps after the first promotion, ``--students``
students per variant start from the promoted student and train with the run's inner-loop settings
(K at that promotion); each is scored on all of hard train in the run's reward metric and in
greedy accuracy, against the promoted student itself; ``<metric>_unsolved`` is the reward metric's gain
on the hard-train questions the promoted student still fails greedily.

With ``--against OTHER_RUN`` the same students also train on OTHER_RUN's dataset of the same step,
as written, with the same seeds: two teachers' datasets scored against one promoted student. With
Base-T as OTHER_RUN (its frozen teacher is the untrained one) this is the paired comparison the
loop's own rewards cannot make once only one of the two runs has promoted:

    python scripts/after_promotion.py runs/gate/grounded_s0 --against runs/gate/base_s0 \
        --variants as_written --datasets 12 --out after_promotion_s0.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from frontier import mean_se  # scripts/frontier.py: run as a script, scripts/ is on sys.path

VARIANTS = ("as_written", "wrong_removed", "wrong_corrected")


def step_dumps(run: Path, after_step: int) -> dict[int, dict]:
    """The run's step dumps after ``after_step``, by step."""
    dumps = {int(f.stem.split("_")[1]): f for f in run.glob("steps/step_*.json")}
    return {step: json.loads(dumps[step].read_text()) for step in sorted(dumps) if step > after_step}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--out", default="after_promotion.json")
    ap.add_argument("--datasets", type=int, default=3)
    ap.add_argument("--students", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--against", help="another run whose same-step datasets are scored the same way (as written)")
    ap.add_argument("--dataset-index", type=int, default=0, help="which of a step's g datasets")
    args = ap.parse_args()

    from omegaconf import OmegaConf

    from soar.data import Problem
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.seeding import derive_seed
    from soar.students.trainer import problem_scores, train_student
    from soar.worlds.base import resolve_hook

    run = Path(args.run_dir)
    cfg = OmegaConf.load(run / "config.yaml")
    promotion = json.loads((run / "promotions.jsonl").read_text().splitlines()[0])
    oracle = resolve_hook(cfg, "loop.answer_oracle")  # "world" (newer runs) or a dotted path
    mcfg = OmegaConf.merge(cfg.model, {"path": str(run / promotion["path"])})
    promoted, tok, grader = load_model(mcfg), load_tokenizer(mcfg), make_grader(cfg.data.grader)
    hard = [Problem(r["id"], r["question"], r["answer"]) for r in
            map(json.loads, (Path(cfg.loop.hard_set or run / "hard_set") / "hard_train.jsonl").read_text().splitlines())]
    template, metric = cfg.data.prompt_template, cfg.inner.reward_metric
    student_cfg = OmegaConf.merge(cfg.student, {"max_steps": min(promotion["inner_steps"] + cfg.inner.steps_per_promotion,
                                                                 cfg.inner.max_steps)})

    def score(model, which) -> np.ndarray:
        from soar.generation import HFGenerator

        return np.asarray(problem_scores(which, model, tok, HFGenerator(model, tok), grader, hard, template,
                                         cfg.student, cfg.inner, 0))

    base_Q = {m: score(promoted, m) for m in (metric, "accuracy")}
    # Rewards can only recover on what the promoted student still fails: the gain there, apart
    # (absent when it fails nothing).
    unsolved_Q = base_Q["accuracy"] == 0

    def means(score_Q: dict) -> dict:
        out = {m: float(v.mean()) for m, v in score_Q.items()}
        if unsolved_Q.any():
            out[f"{metric}_unsolved"] = float(score_Q[metric][unsolved_Q].mean())
        return out

    base = means(base_Q)
    after = step_dumps(run, promotion["step"])
    against = step_dumps(Path(args.against), promotion["step"]) if args.against else {}
    rows = []

    def gains_on(qs: list[dict], i: int) -> dict:
        probs = [Problem(f"d{i}/{j}", q["question"], q["answer"]) for j, q in enumerate(qs)]
        gains = []
        for j in range(args.students):  # the same seeds for every variant and for the other run: paired
            res = train_student(promoted, tok, grader, probs, student_cfg, template, derive_seed(0, "after", i, j))
            gains.append(means({m: score(res.trainer.model, m) - base_Q[m] for m in base_Q}))
        return {m: float(np.mean([g[m] for g in gains])) for m in base}

    steps = [step for step in after if not args.against or step in against][: args.datasets]
    if not steps:
        raise SystemExit(f"no step dump after the promotion at step {promotion['step']} in {run}"
                         + (f" and {args.against}" if args.against else ""))
    for i, step in enumerate(steps):
        questions = after[step]["datasets"][args.dataset_index]["questions"]
        right = [q for q in questions if oracle(q["question"]) == q["answer"]]
        variants = {"as_written": questions, "wrong_removed": right,
                    "wrong_corrected": [{**q, "answer": oracle(q["question"])} for q in questions]}
        row = {"step": step, "answer_correct_frac": len(right) / len(questions)}
        row.update({name: gains_on(variants[name], i) for name in args.variants})
        if args.against:
            other = against[step]["datasets"][args.dataset_index]["questions"]
            row["against"] = {"answer_correct_frac": float(np.mean([oracle(q["question"]) == q["answer"] for q in other])),
                              "as_written": gains_on(other, i)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {name: {m: float(np.mean([r[name][m] for r in rows])) for m in base} for name in args.variants}
    report = {"run": str(run), "promotion": promotion["promotion"], "promotion_step": promotion["step"],
              "reward_metric": metric, "unsolved_questions": int(unsolved_Q.sum()), "student_steps": student_cfg.max_steps,
              "dataset_index": args.dataset_index, "promoted_student": base, "datasets": rows, "mean_gain": summary}
    if args.against:
        report["against"] = {
            "run": args.against,
            "mean_gain": {m: float(np.mean([r["against"]["as_written"][m] for r in rows])) for m in base},
            "as_written_minus_against": {m: mean_se([r["as_written"][m] - r["against"]["as_written"][m] for r in rows])
                                         for m in base} if "as_written" in args.variants else None}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({**summary, **({"against": report["against"]} if args.against else {})}, indent=1))


if __name__ == "__main__":
    main()
