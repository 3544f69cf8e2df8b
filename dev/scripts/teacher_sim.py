"""Can the teacher's RLOO update learn at all? A simulator of the outer loop's teacher side: the loop's own
``TeacherPolicy`` samples g datasets of n pairs and takes its RLOO step, but each dataset's reward is a
synthetic one, the mean of a per-question value read off the world's answer oracle plus Gaussian noise that
stands in for the students' own randomness. A measurement tool (the oracle never enters the loop), minutes
on 2 cores instead of hours, not CI; writes JSON.

    python dev/scripts/teacher_sim.py --out sim.json -- teacher.temperature=0.7 teacher.kl_coef=0.1
    python dev/scripts/teacher_sim.py --noise 2.0 --out sim_g16.json -- teacher.datasets=16 teacher.questions_per_dataset=8

The value of a question is what a whole dataset of its kind adds to a *promoted* student's hard-train gold
log-probability (nats, measured 2026-12-01: retraining the tau=1 gate's promoted student on 32 oracle-answered
sums of each carry count, docs/world.md "After a promotion"): sums without carries undo carrying (-4.6),
7-8 carries help (+0.7), 10-12 carries most (+2.1..+2.5), and a wrong answer costs -7. The
right teacher moves its carry plan towards harder sums and keeps its answers right; per step the JSON has
the true mean value of its pairs, their right-answer fraction, carry count and the share without carries or
with 10 or more. ``--noise`` is the students' noise per dataset in the same units (the loop's measured
within-step spread of dataset rewards: about 1 for n = 32, 2 for n = 8).

``--value-scale`` multiplies the values, to put the simulator in the loop's own reward units and
signal-to-noise: the loop's preset scores gold probability (within-step SD of dataset rewards about 0.025),
and there the datasets' carry bands and right answers explain about 7 % of that variance, far less than
above. Each step's ``explained_frac`` is the share of its rewards' variance that the values carry:

    python dev/scripts/teacher_sim.py --steps 40 --value-scale 0.0075 --noise 0.024 --out calibrated.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

VALUE_BY_CARRIES = {0: -4.6, 1: -2.5, 2: -1.2, 3: -0.3, 4: -0.1, 5: 0.2, 6: 0.4, 7: 0.7, 8: 0.8, 9: 1.5, 10: 2.1,
                    11: 2.3, 12: 2.5}
WRONG_VALUE = -7.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="teacher_sim.json")
    ap.add_argument("--steps", type=int, default=30, help="teacher updates (also the teacher's schedule length)")
    ap.add_argument("--noise", type=float, default=1.0, help="SD of the students' noise on a dataset's reward")
    ap.add_argument("--value-scale", type=float, default=1.0, help="multiplies the per-question values (1: nats)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of experiment=arith (after --)")
    args = ap.parse_args()

    import torch

    import soar
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer, model_context
    from soar.stage import resolve_model_path
    from soar.teachers.update import TeacherPolicy, dataset_advantages
    from soar.worlds.arith import carries_of, oracle_answer, parse_question

    torch.set_num_threads(args.threads)
    overrides = ["experiment=arith", "loop.diversity_model=null", f"loop.steps={args.steps}", *args.overrides]
    cfg = soar.compose(overrides)
    resolve_model_path(cfg)
    model, tok = load_model(cfg.model), load_tokenizer(cfg.model)
    teacher = TeacherPolicy(cfg, model, tok, make_grader(cfg.data.grader), cfg.data.prompt_template,
                            model_context(model, cfg.model))
    noise_rng, digits, history = np.random.default_rng(cfg.seed), cfg.world.digits, []
    for t in range(args.steps):
        t0 = time.perf_counter()
        groups, _ = teacher.sample(t)
        advantages_JK, pairs, values_D, rewards_D = [], [], [], []
        for datasets in groups:
            rewards_K = []
            for dataset in datasets:
                values = []
                for rollout in dataset:
                    q = parse_question(rollout.question)
                    carries = carries_of(*q) if q and q[2] == digits else None
                    right = carries is not None and oracle_answer(rollout.question) == rollout.answer
                    values.append(args.value_scale * (VALUE_BY_CARRIES[carries] if right else WRONG_VALUE))
                    pairs.append((carries if carries is not None else -1, right, values[-1]))
                values_D.append(float(np.mean(values)))
                rewards_K.append(values_D[-1] + args.noise * float(noise_rng.standard_normal()))
            rewards_D += rewards_K
            advantages_JK.append(dataset_advantages(rewards_K))
        stats = teacher.update(groups, advantages_JK)
        carries_P, right_P, value_P = (np.array(x) for x in zip(*pairs))
        row = {"step": t + 1, "true_value": float(value_P.mean()),
               "explained_frac": float(np.var(values_D) / max(np.var(rewards_D), 1e-12)), "right": float(right_P.mean()),
               "carries": float(carries_P[carries_P >= 0].mean()), "no_carry_frac": float((carries_P == 0).mean()),
               "carries_10_plus_frac": float((carries_P >= 10).mean()), "teacher_kl": stats["teacher/kl"],
               "seconds": time.perf_counter() - t0}
        history.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    first, last = history[:5], history[-5:]
    summary = {key: {"first5": float(np.mean([h[key] for h in first])), "last5": float(np.mean([h[key] for h in last]))}
               for key in ("true_value", "right", "carries", "no_carry_frac", "carries_10_plus_frac")}
    summary["right_min"] = min(h["right"] for h in history)
    summary["explained_frac_mean"] = float(np.mean([h["explained_frac"] for h in history]))
    Path(args.out).write_text(json.dumps({"overrides": overrides, "noise": args.noise, "value_scale": args.value_scale,
                                          "summary": summary, "history": history}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
