"""Why rewards fall after a promotion: retrain a run's promoted student on datasets its teacher wrote
after the promotion, as written and with the teacher's wrong answers removed or corrected by the
world's answer oracle (a measurement only; the oracle never enters the loop). Writes JSON.

    python scripts/after_promotion.py runs/arith --out benchmarks/results/after_promotion.json

For each of ``--datasets`` datasets from the step dumps after the first promotion, ``--students``
students per variant start from the promoted student and train with the run's inner-loop settings
(K at that promotion); each is scored on all of hard train in the run's reward metric and in
greedy accuracy, against the promoted student itself.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--out", default="after_promotion.json")
    ap.add_argument("--datasets", type=int, default=3)
    ap.add_argument("--students", type=int, default=1)
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

    def score(model, which):
        from soar.generation import HFGenerator

        return float(np.mean(problem_scores(which, model, tok, HFGenerator(model, tok), grader, hard, template,
                                            cfg.student, cfg.inner, 0)))

    base = {m: score(promoted, m) for m in (metric, "accuracy")}
    dumps = sorted(run.glob("steps/step_*.json"))
    after = [json.loads(f.read_text()) for f in dumps if int(f.stem.split("_")[1]) > promotion["step"]]
    rows = []
    for i, dump in enumerate(after[: args.datasets]):
        questions = dump["datasets"][0]["questions"]
        right = [q for q in questions if oracle(q["question"]) == q["answer"]]
        variants = {"as_written": questions, "wrong_removed": right,
                    "wrong_corrected": [{**q, "answer": oracle(q["question"])} for q in questions]}
        row = {"step": dump["step"], "answer_correct_frac": len(right) / len(questions)}
        for name, qs in variants.items():
            probs = [Problem(f"d{i}/{j}", q["question"], q["answer"]) for j, q in enumerate(qs)]
            gains = []
            for j in range(args.students):
                res = train_student(promoted, tok, grader, probs, student_cfg, template, derive_seed(0, "after", i, j))
                gains.append({m: score(res.trainer.model, m) - base[m] for m in base})
            row[name] = {m: float(np.mean([g[m] for g in gains])) for m in base}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {name: {m: float(np.mean([r[name][m] for r in rows])) for m in base}
               for name in ("as_written", "wrong_removed", "wrong_corrected")}
    report = {"run": str(run), "promotion": promotion["promotion"], "reward_metric": metric,
              "promoted_student": base, "datasets": rows, "mean_gain": summary}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
