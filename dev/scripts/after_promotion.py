"""Why rewards fall after a promotion: retrain a run's promoted student on datasets its teacher wrote
after the promotion, as written and with the teacher's wrong answers removed or corrected by the
world's answer oracle (a measurement only; the oracle never enters the loop). Writes JSON.

    python dev/scripts/after_promotion.py runs/arith --out dev/results/after_promotion.json

For each of ``--datasets`` datasets from the step dumps after the first promotion, ``--students``
students per variant start from the promoted student and train with the run's inner-loop settings
(K at that promotion); each is scored on all of hard train in the run's reward metric and in
greedy accuracy, against the promoted student itself; ``<metric>_unsolved`` is the reward metric's gain
on the hard-train questions the promoted student still fails greedily.

With ``--carries 0 7,8 12`` the same students also train on sums the world generates with those carry
counts and the oracle's answers, one dataset of the run's size per group: what a promoted student can
still learn from, whoever writes it. With ``--students`` >= 2 the report gives, per metric, the share of
the as-written gains' variance that belongs to the dataset rather than to the student's seed (``icc``).

With ``--replay`` the promoted dataset itself is retrained with ``--students`` new seeds, from the model
it was promoted over (the base model: selection luck, the promoted student's gain against its dataset's
typical one) and from the promoted student (what more of the best data does to it): why every later
dataset can score below 0 although its questions still teach.

With ``--against OTHER_RUN`` the same students also train on OTHER_RUN's dataset of the same step,
as written, with the same seeds: two teachers' datasets scored against one promoted student. With
Base-T as OTHER_RUN (its frozen teacher is the untrained one) this is the paired comparison the
loop's own rewards cannot make once only one of the two runs has promoted:

    python dev/scripts/after_promotion.py runs/gate/grounded_s0 --against runs/gate/base_s0 \
        --variants as_written --datasets 12 --out after_promotion_s0.json

``--from-step 28 --datasets 13`` takes the steps of a 40-step gate's last third instead of the first ones
after the promotion, ``--promotion 2`` starts from the run's second promoted student (and its steps after
that promotion; the loop's baseline there) instead of the first, and ``--dataset-index 0 1`` two of each
step's datasets (a row each).
``--start typical`` starts each student from a typical student of the promoted dataset instead (the
replay's from-base student of the same index; its scores are ``start_students`` in the report): how much
of the dip is the promoted student's selection luck. ``--start base`` starts from the base model the
promotion was promoted over: where the same datasets take a student that has not learnt the promoted
one (start plus gain, against the typical students' start plus gain: whether learning adds up).
``--student max_steps=8 lr=5e-5`` trains every student here with other inner-loop settings (the replay's
from-base students keep K as the promoted one was trained, unless ``max_steps`` is set): what K's growth
or the step size adds to the dip, and what the step size costs before a promotion.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # soar.stats, installed or not

from soar.stats import icc, mean_se  # noqa: E402

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
    ap.add_argument("--dataset-index", type=int, nargs="+", default=[0], help="which of a step's g datasets (a row each)")
    ap.add_argument("--promotion", type=int, default=1,
                    help="start from the run's Nth promoted student (--replay and --start typical|base need 1)")
    ap.add_argument("--from-step", type=int, default=0,
                    help="only step dumps from this step on (e.g. the gate's last third), still after the promotion")
    ap.add_argument("--carries", nargs="*", default=[],
                    help="carry-count groups (e.g. 0 7,8 12): oracle-answered world sums, one dataset each")
    ap.add_argument("--replay", action="store_true",
                    help="also retrain the promoted dataset from the base model and from the promoted student")
    ap.add_argument("--start", choices=("promoted", "typical", "base"), default="promoted",
                    help="what each student starts from: the promoted student; (typical) a student retrained "
                         "from the base model on the promoted dataset with the replay's seeds, one per student; "
                         "or the base model the promotion was promoted over")
    ap.add_argument("--student", nargs="*", default=[], metavar="KEY=VALUE",
                    help="inner-loop settings for every student trained here (e.g. max_steps=8 lr=5e-5: "
                         "what K's growth or the step size does to the dip)")
    args = ap.parse_args()

    from omegaconf import OmegaConf

    from soar.data import Problem
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.policy.scores import problem_scores
    from soar.run import plural
    from soar.seeding import derive_seed
    from soar.students.trainer import train_student
    from soar.worlds.base import answer_oracle_hook

    run = Path(args.run_dir)
    cfg = OmegaConf.load(run / "config.yaml")
    promotions = (run / "promotions.jsonl").read_text().splitlines()
    if not 1 <= args.promotion <= len(promotions):
        raise SystemExit(f"--promotion {args.promotion}: {run / 'promotions.jsonl'} has "
                         f"{plural(len(promotions), 'promotion')}")
    promotion = json.loads(promotions[args.promotion - 1])
    oracle = answer_oracle_hook(cfg)  # "world" (newer runs) or a dotted path
    mcfg = OmegaConf.merge(cfg.model, {"path": str(run / promotion["path"])})
    promoted, tok, grader = load_model(mcfg), load_tokenizer(mcfg), make_grader(cfg.data.grader)
    hard = [Problem(r["id"], r["question"], r["answer"]) for r in
            map(json.loads, (Path(cfg.loop.hard_set or run / "hard_set") / "hard_train.jsonl").read_text().splitlines())]
    template, metric = cfg.data.prompt_template, cfg.inner.reward_metric
    unknown = object()
    for item in args.student:  # a misspelt key would otherwise train with the run's settings, silently
        if "=" not in item or OmegaConf.select(cfg.student, item.split("=", 1)[0], default=unknown) is unknown:
            raise SystemExit(f"--student {item}: not KEY=VALUE with KEY a student setting of {run / 'config.yaml'}")
    overrides = OmegaConf.from_dotlist(args.student)
    student_cfg = OmegaConf.merge(cfg.student, {"max_steps": min(promotion["inner_steps"] + cfg.inner.steps_per_promotion,
                                                                 cfg.inner.max_steps)}, overrides)

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
    first = max(promotion["step"], args.from_step - 1)
    after = step_dumps(run, first)
    against = step_dumps(Path(args.against), first) if args.against else {}
    rows = []

    def gains_on(qs: list[dict], i: int, start=None, start_Q=None, label="after") -> dict:
        """Mean gain per metric over ``--students`` students trained from ``start`` (default: each student's
        start, as ``--start`` chose), and each student's (``per_student``)."""
        probs = [Problem(f"d{i}/{j}", q["question"], q["answer"]) for j, q in enumerate(qs)]
        gains = []
        for j in range(args.students):  # the same seeds for every variant and for the other run: paired
            model, model_Q = (start, start_Q) if start is not None else starts[j]
            res = train_student(model, tok, grader, probs, student_cfg, template, derive_seed(0, label, i, j))
            gains.append(means({m: score(res.trainer.model, m) - model_Q[m] for m in model_Q}))
        return summarise(gains)

    def summarise(gains: list[dict]) -> dict:
        return {**{m: float(np.mean([g[m] for g in gains])) for m in base}, "per_student": gains}

    # The first promotion's base model and its dataset retrained from it: built once, for --replay and --start.
    retrained = args.students if args.replay or args.start == "typical" else 0
    first_promo = (from_base(run, cfg, promotion, overrides, score, base_Q, retrained, tok, grader, template)
                   if args.replay or args.start != "promoted" else None)
    starts = [(promoted, base_Q)] * args.students
    if args.start == "typical":
        starts = first_promo["students"]
    elif args.start == "base":
        starts = [(first_promo["model"], first_promo["Q"])] * args.students
    report_start = {"start": args.start, "start_students": [means(q) for _, q in starts]}

    steps = [step for step in after if not args.against or step in against][: args.datasets]
    if not steps:
        raise SystemExit(f"no step dump after the promotion at step {promotion['step']} in {run}"
                         + (f" and {args.against}" if args.against else ""))
    for i, (step, d) in enumerate((step, d) for step in steps for d in args.dataset_index):
        questions = after[step]["datasets"][d]["questions"]
        right = [q for q in questions if oracle(q["question"]) == q["answer"]]
        variants = {"as_written": questions, "wrong_removed": right,
                    "wrong_corrected": [{**q, "answer": oracle(q["question"])} for q in questions]}
        row = {"step": step, "dataset": d, "answer_correct_frac": len(right) / len(questions)}
        row.update({name: gains_on(variants[name], i) for name in args.variants})
        if args.against:
            other = against[step]["datasets"][d]["questions"]
            row["against"] = {"answer_correct_frac": float(np.mean([oracle(q["question"]) == q["answer"] for q in other])),
                              "as_written": gains_on(other, i)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    size = len(after[steps[0]]["datasets"][0]["questions"])
    carry_rows = []
    for group in args.carries:
        from soar.worlds.arith import generate_problems  # the arithmetic world's own sums

        counts = [int(c) for c in group.split(",")]
        sums = [p for c in counts for p in generate_problems(cfg.world.digits, c, -(-size // len(counts)),
                                                            derive_seed(0, "after_carries", c), "after")][:size]
        carry_rows.append({"carries": counts, **gains_on([{"question": p.question, "answer": p.answer} for p in sums],
                                                          len(rows) + len(carry_rows))})
        print(json.dumps(carry_rows[-1]), flush=True)
    summary = {name: {m: float(np.mean([r[name][m] for r in rows])) for m in base} for name in args.variants}
    report = {"run": str(run), "promotion": promotion["promotion"], "promotion_step": promotion["step"],
              "reward_metric": metric, "unsolved_questions": int(unsolved_Q.sum()), "student_steps": student_cfg.max_steps,
              "student_overrides": args.student,
              "dataset_index": args.dataset_index, "promoted_student": base, **report_start, "datasets": rows,
              "mean_gain": summary,
              "carry_datasets": carry_rows}
    if args.students > 1 and "as_written" in args.variants:
        report["icc"] = {m: icc([[g[m] for g in r["as_written"]["per_student"]] for r in rows]) for m in base}
    if args.replay:
        report["replay"] = replay(first_promo, promoted, base_Q, means, summarise, gains_on)
        print(json.dumps(report["replay"]), flush=True)
    if args.against:
        report["against"] = {
            "run": args.against,
            "mean_gain": {m: float(np.mean([r["against"]["as_written"][m] for r in rows])) for m in base},
            "as_written_minus_against": {m: mean_se([r["as_written"][m] - r["against"]["as_written"][m] for r in rows])
                                         for m in base} if "as_written" in args.variants else None}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({**summary, **{k: report[k] for k in ("against", "icc") if k in report}}, indent=1))


def from_base(run: Path, cfg, promotion: dict, overrides, score, promoted_Q: dict, students: int, tok, grader,
              template) -> dict:
    """The model the run's first promotion was promoted over (the base model), its scores, the promoted
    dataset, and ``students`` typical students of that dataset: each retrained from the base model with new
    seeds (K as the promoted one was trained), standalone, with its scores. Later datasets trained from these
    measure the dip without the promoted student's selection luck."""
    from omegaconf import OmegaConf

    from soar.data import Problem
    from soar.models import load_model
    from soar.seeding import derive_seed
    from soar.students.trainer import train_student

    if promotion["promotion"] != 1:
        raise SystemExit("--replay and --start typical|base measure the first promotion (over the base model)")
    dataset = [q for q in map(json.loads, (run / "pq.jsonl").read_text().splitlines()) if q["promotion"] == 1]
    base_model = load_model(cfg.model)
    as_trained = OmegaConf.merge(cfg.student, {"max_steps": promotion["inner_steps"]}, overrides)
    probs = [Problem(f"d0/{j}", q["question"], q["answer"]) for j, q in enumerate(dataset)]
    trained = []
    for j in range(students):
        model = train_student(base_model, tok, grader, probs, as_trained, template,
                              derive_seed(0, "replay_base", 0, j)).trainer.export_model()  # LoRA merged
        trained.append((model, {m: score(model, m) for m in promoted_Q}))
    return {"model": base_model, "Q": {m: score(base_model, m) for m in promoted_Q}, "dataset": dataset,
            "students": trained}


def replay(first_promo: dict, promoted, promoted_Q: dict, means, summarise, gains_on) -> dict:
    """The promoted dataset retrained with new seeds from the base model (K as it was trained) and from the
    promoted student (K after the promotion): the promoted student's own gain against the typical one."""
    base_Q = first_promo["Q"]
    return {"promoted_gain": {m: v - b for (m, v), b in zip(means(promoted_Q).items(), means(base_Q).values())},
            "from_base": summarise([means({m: Q[m] - base_Q[m] for m in base_Q}) for _, Q in first_promo["students"]]),
            "from_promoted": gains_on(first_promo["dataset"], 0, promoted, promoted_Q, label="replay_promoted")}


if __name__ == "__main__":
    main()
