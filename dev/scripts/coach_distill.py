"""Issue 53 B in the embedded world: coach-guided on-policy context distillation on the fail@128 hard set.

Questions: (1) can the advice-conditioned model solve hard problems (pass@32 on hard test, with the
world coach's advice in its teacher prompt, against the same model without it)? (2) does distilling it
move the policy without advice? Arms, each a fresh copy of the world model trained with the same soar-rl
recipe (``experiment=distill_arith``: 8 questions x 8 samples, lr 1e-4, ``--steps`` steps), then scored
without advice by pass@32 on hard test:

- ``distill``: hard train, world coach, reverse KL to the frozen advice-conditioned model + RLOO;
- ``hard_only``: hard train, RLOO only (``distill.coach=null``);
- ``pq``: SOAR's Promotion Questions of a Grounded-T run (``--pq-run``) together with hard train, RLOO only.

Seeds are the unit (each seed: its own training seed and pass@32 sampling seed); mean +- SE (ddof 1),
paired t against each baseline. Writes raw per-seed numbers to ``--out``.

    nice -n 10 python dev/scripts/coach_distill.py --hard-set dev/confirm/hard_set --pq-run runs/gt_s0 \\
        --seeds 0 1 2 --steps 10 --work /tmp/coach_distill --out dev/results/coach_distill.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats as sps

import soar
from soar.data import load_problems, render_prompt, write_jsonl
from soar.generation import HFGenerator, SamplingParams
from soar.grading import make_grader
from soar.models import load_model, load_tokenizer
from soar.seeding import derive_seed
from soar.stage import resolve_model_path
from soar.worlds.arith import carry_advice


def pass_at_k(model_dir: str, problems, template: str, advice_template: str | None, seed: int, k: int = 32) -> dict:
    """pass@k (n = k samples at T = 1, so pass@k = any correct) and mean sampled accuracy on ``problems``
    (trained arms also get ``greedy``, soar-rl's final greedy accuracy on the same problems);
    with ``advice_template``, each prompt carries the world coach's advice (the teacher's view)."""
    cfg = soar.compose(["experiment=distill_arith", f"model.path={model_dir}"])
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model).eval()
    prompts = [render_prompt(template, p.question) for p in problems]
    if advice_template is not None:
        prompts = [advice_template.replace("{advice}", carry_advice(p.question, p.answer)).replace("{prompt}", q)
                   for p, q in zip(problems, prompts)]
    outs = HFGenerator(model, tok, batch_size=1024).generate(
        prompts, SamplingParams(n=k, temperature=1.0, max_tokens=24, seed=derive_seed(seed, "pass_at_k")))
    grader = make_grader("integer")
    grades = grader.grade_batch([s.text for o in outs for s in o], [p.answer for p in problems for _ in range(k)])
    correct = np.array([g.correct for g in grades], dtype=float).reshape(len(problems), k)
    return {"pass@32": float((correct.sum(1) > 0).mean()), "mean_acc": float(correct.mean())}


def train_arm(arm: str, seed: int, data: Path, hard_test: Path, steps: int, work: Path) -> str:
    overrides = ["experiment=distill_arith", f"seed={seed}", f"data.path={data}", f"data.eval_path={hard_test}",
                 f"student.max_steps={steps}", f"student.save_every={steps}", "run.threads=1", "run.progress=false",
                 "run.loggers=[jsonl]", f"run.dir={work / f'{arm}_s{seed}'}"]
    if arm != "distill":
        overrides.append("distill.coach=null")
    summary = soar.train_rl(soar.compose(overrides))
    return summary["final_dir"]


def compare(a: list[float], b: list[float]) -> dict:
    d = np.array(a) - np.array(b)
    out = {"mean": float(d.mean()), "n": len(d)}
    if len(d) > 1:
        out["se"] = float(d.std(ddof=1) / np.sqrt(len(d)))
        if d.std(ddof=1) > 0:
            t = sps.ttest_1samp(d, 0.0)
            out.update(t=float(t.statistic), p=float(t.pvalue), df=len(d) - 1)
    return out


def summarise(xs: list[float]) -> dict:
    return {"mean": float(np.mean(xs)), "se": float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else None,
            "n": len(xs), "per_seed": xs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hard-set", type=Path, required=True)
    ap.add_argument("--pq-run", type=Path, default=None, help="a soar-train run dir with pq.jsonl (its PQ arm)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--arms", nargs="+", default=["distill", "hard_only", "pq"])
    ap.add_argument("--base-seeds", type=int, nargs="*", default=None,
                    help="seeds of the untrained model's pass@32 with and without advice (default: --seeds); "
                         "they run after every trained arm")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)

    cfg = soar.compose(["experiment=distill_arith", f"data.path={args.hard_set / 'hard_train.jsonl'}"])
    resolve_model_path(cfg)
    base, template, advice_template = cfg.model.path, cfg.data.prompt_template, cfg.distill.advice_template
    data_cfg = cfg.data
    hard_test = load_problems(data_cfg, str(args.hard_set / "hard_test.jsonl"))
    train_files = {"distill": args.hard_set / "hard_train.jsonl", "hard_only": args.hard_set / "hard_train.jsonl"}
    pq_size = None
    if "pq" in args.arms:
        pq = [json.loads(line) for line in (args.pq_run / "pq.jsonl").read_text().splitlines() if line.strip()]
        hard_train = [json.loads(line) for line in (args.hard_set / "hard_train.jsonl").read_text().splitlines()]
        pq_size = len(pq)
        rows = [{"id": f"pq/{i}", "question": r["question"], "answer": r["answer"]} for i, r in enumerate(pq)]
        rows += [{"id": r["id"], "question": r["question"], "answer": r["answer"]} for r in hard_train]
        train_files["pq"] = args.work / "pq_and_hard_train.jsonl"
        write_jsonl(train_files["pq"], rows)

    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out.update({"hard_set": str(args.hard_set), "hard_test_problems": len(hard_test), "steps": args.steps,
                "seeds": args.seeds, "pq_run": str(args.pq_run) if args.pq_run else None, "pq_questions": pq_size,
                "recipe": "soar-rl experiment=distill_arith (8 questions x 8 samples, lr 1e-4, full fine-tuning)"})
    raw = out.setdefault("raw", {})
    for seed in args.seeds:
        for arm in args.arms:
            key = f"{arm}/s{seed}"
            if key in raw:
                continue
            t0 = time.time()
            final = train_arm(arm, seed, train_files[arm], args.hard_set / "hard_test.jsonl", args.steps, args.work)
            raw[key] = pass_at_k(final, hard_test, template, None, seed)
            raw[key]["seconds"] = time.time() - t0
            print(key, raw[key], flush=True)
            args.out.write_text(json.dumps(out, indent=1))
    for seed in args.seeds:
        for arm in args.arms:  # greedy accuracy on hard test, from soar-rl's own final evaluation
            metrics = args.work / f"{arm}_s{seed}" / "metrics.jsonl"
            if f"{arm}/s{seed}" in raw and metrics.exists():
                rows_m = [json.loads(line) for line in metrics.read_text().splitlines()]
                raw[f"{arm}/s{seed}"]["greedy"] = rows_m[-1]["eval/accuracy"]
    for seed in args.seeds if args.base_seeds is None else args.base_seeds:
        for view, tmpl in (("base_no_advice", None), ("base_with_advice", advice_template)):
            key = f"{view}/s{seed}"
            if key not in raw:
                t0 = time.time()
                raw[key] = pass_at_k(base, hard_test, template, tmpl, seed)
                raw[key]["seconds"] = time.time() - t0
                print(key, raw[key], flush=True)
                args.out.write_text(json.dumps(out, indent=1))

    rows = {}
    all_seeds = sorted(set(args.seeds) | set(args.base_seeds or []))
    for name in ["base_no_advice", "base_with_advice", *args.arms]:
        seeds = [s for s in all_seeds if f"{name}/s{s}" in raw]
        if seeds:
            rows[name] = {"seeds": seeds, **{m: summarise([raw[f"{name}/s{s}"][m] for s in seeds])
                                           for m in ("pass@32", "mean_acc")}}
    out["rows"] = rows
    diffs = {}
    for a, b in (("base_with_advice", "base_no_advice"), ("distill", "base_no_advice"), ("distill", "hard_only"),
                 ("distill", "pq"), ("pq", "hard_only"), ("hard_only", "base_no_advice")):
        seeds = [s for s in all_seeds if f"{a}/s{s}" in raw and f"{b}/s{s}" in raw]
        if seeds:
            diffs[f"{a}-{b}"] = {m: compare([raw[f"{a}/s{s}"][m] for s in seeds], [raw[f"{b}/s{s}"][m] for s in seeds])
                                 for m in ("pass@32", "mean_acc")}
    out["differences"] = diffs
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({"rows": {k: {m: (v[m]["mean"], v[m]["se"]) for m in ("pass@32", "mean_acc")} for k, v in rows.items()},
                      "differences": diffs}, indent=1))


if __name__ == "__main__":
    main()
