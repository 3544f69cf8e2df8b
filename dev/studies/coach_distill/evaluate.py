"""One model's scores in the coach-distillation study (dev/studies/coach_distill/PROTOCOL.md), written as JSON:

    python dev/studies/coach_distill/evaluate.py --model DIR|base --hard-test HARD/hard_test.jsonl --seed S \
        --out FILE [--advice] [--hard-samples 32] [--easy-carries 0 2 4 6 --easy-count 128 --easy-samples 8]

- ``hard``: on each held-out hard problem, ``--hard-samples`` samples at T = 1 (the student's prompt, or with
  ``--advice`` the distillation teacher's: the world coach's advice, through the leak check, before it);
  ``mean_acc`` (the primary metric: the mean over problems of the fraction correct) and ``pass@k`` for
  k = ``--hard-samples`` (any of them correct);
- ``easy``: the same without advice on ``--easy-count`` easier sums (fewer carries: ``--easy-carries``, drawn by
  the world from ``--seed``), ``--easy-samples`` each: forgetting.

The sampling seeds derive from ``--seed`` alone, so every arm of a seed is scored on the same draws.
``base`` is the world model the preset loads (the untrained student; with ``--advice``, the ceiling).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import soar
from soar.coach import Advisor, WorldCoach
from soar.data import load_problem_records
from soar.evaluate import pass_at_k_means
from soar.generation import HFGenerator, correctness_request, grade_correctness
from soar.grading import make_grader
from soar.models import load_model, load_tokenizer, set_threads
from soar.seeding import derive_seed
from soar.stage import resolve_model_path
from soar.worlds.arith import family_problems
from soar.worlds.base import configured_world


def scores(generator, grader, problems, prompts, params) -> dict:
    frac = grade_correctness(grader, problems, generator.generate(prompts, params))
    counts = [round(f * params.n) for f in frac]
    return {"mean_acc": float(np.mean(frac)), **{k.replace("eval/", ""): v for k, v in
                                                 pass_at_k_means(counts, params.n, [params.n]).items()},
            "problems": len(problems), "samples": params.n, "per_problem": frac}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a soar-rl final/ folder, or base")
    ap.add_argument("--hard-test", type=Path, required=True)
    ap.add_argument("--easy-carries", type=int, nargs="*", default=[])
    ap.add_argument("--easy-count", type=int, default=128)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--advice", action="store_true", help="the world coach's advice in the prompt (the ceiling)")
    ap.add_argument("--hard-samples", type=int, default=32)
    ap.add_argument("--easy-samples", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    set_threads(1)
    cfg = soar.compose(["experiment=distill_arith", f"data.path={args.hard_test}", f"seed={args.seed}",
                        *([] if args.model == "base" else [f"model.path={args.model}"])])
    resolve_model_path(cfg)
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model).eval()
    generator, grader = HFGenerator(model, tok, batch_size=1024), make_grader(cfg.data.grader)
    max_tokens = cfg.student.eval_max_tokens or cfg.student.max_tokens
    out = {"model": args.model if args.model == "base" else str(Path(args.model).resolve()), "seed": args.seed,
           "advice": args.advice, "max_tokens": max_tokens}

    hard = load_problem_records(cfg.data, args.hard_test)
    prompts, params = correctness_request(hard, cfg.data.prompt_template, max_tokens, tuple(cfg.student.stop),
                                          args.hard_samples, derive_seed(args.seed, "study_eval", "hard"))
    if args.advice:  # the distillation teacher's view: the coach's advice (None: refused) before the prompt
        advised, metrics = Advisor(cfg, WorldCoach(cfg), None).before_attempts(hard, prompts, 0)
        out["coach"] = metrics
        prompts = [a if a is not None else p for a, p in zip(advised, prompts)]
    out["hard"] = scores(generator, grader, hard, prompts, params)
    if args.easy_carries and not args.advice:
        wcfg = configured_world(cfg).config(cfg)
        easy = family_problems(wcfg, args.easy_carries, args.easy_count, derive_seed(args.seed, "study_easy"), "easy")
        prompts, params = correctness_request(easy, cfg.data.prompt_template, max_tokens, tuple(cfg.student.stop),
                                              args.easy_samples, derive_seed(args.seed, "study_eval", "easy"))
        out["easy"] = scores(generator, grader, easy, prompts, params)
        frac, carries = out["easy"]["per_problem"], [p.meta["carries"] for p in easy]
        out["easy"]["questions"] = [p.to_dict() for p in easy]
        out["easy"]["by_carries"] = {str(c): float(np.mean([f for f, k in zip(frac, carries) if k == c]))
                                     for c in sorted(set(carries))}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(args.out)
    print(json.dumps({k: {m: v[m] for m in ("mean_acc", f"pass@{v['samples']}")} for k, v in out.items()
                      if isinstance(v, dict) and "mean_acc" in v}))


if __name__ == "__main__":
    main()
