"""Generation throughput, vllm vs hf, on the default world model; writes JSON with machine info.

    python benchmarks/generation.py                      # default world (built if missing)
    python benchmarks/generation.py --out benchmarks/results/generation.json --problems 50 --k 128

Workloads, each timed for both backends on the same prompts:
- ``filter``: fail@k-shaped, ``--problems`` hard-set candidates x ``--k`` samples through
  ``soar.filters.failk.run_filter`` (generation + grading + manifest): problems/s, samples/s;
- ``generate_failk``: the same sampling alone: sequences/s, tokens/s;
- ``teacher``: the teacher prompt x ``--teacher-samples`` completions (stop at ``</answer>``);
- ``lora``: ``generate_failk`` with a rank-8 LoRA adapter (vllm: ``LoRARequest``; hf: peft);
- ``weight_push``: seconds for one full-weight sync into the engine (vllm only).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import tempfile
import time
from pathlib import Path


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=50)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--teacher-samples", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/generation.json")
    args = ap.parse_args()

    import torch

    import soar
    from soar.data import load_problems, render_prompt
    from soar.filters.failk import run_filter
    from soar.generation import SamplingParams, make_generator
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.run import package_versions
    from soar.stage import resolve_model_path
    from soar.worlds.base import build_pool_hook

    torch.set_num_threads(args.threads)
    cfg = soar.compose(["experiment=arith", "backend=vllm", "backend.vllm.dtype=float32", "backend.vllm.kv_cache_gb=2",
                        "backend.vllm.enable_lora=true", "backend.vllm.max_lora_rank=8", f"filter.k={args.k}",
                        "run.progress=false"])
    resolve_model_path(cfg)
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model)
    work = Path(tempfile.mkdtemp(prefix="soar-bench-"))
    problems = load_problems(cfg.data, str(build_pool_hook(cfg, work / "pool")))[: args.problems]
    prompts = [render_prompt(cfg.data.prompt_template, p.question) for p in problems]
    failk = SamplingParams(n=args.k, temperature=1.0, max_tokens=cfg.filter.max_tokens, seed=1)
    teacher = SamplingParams(n=args.teacher_samples, temperature=1.0, max_tokens=cfg.teacher.max_tokens, seed=2,
                             stop=tuple(cfg.teacher.stop) or ("</answer>",))

    from peft import LoraConfig, get_peft_model

    lora_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                                 init_lora_weights=False))
    results = {}
    for backend in ("hf", "vllm"):
        cfg.backend.filter = cfg.backend.eval = backend
        row = {}
        (work / f"filter_{backend}").mkdir()
        gen, start_s = timed(lambda: make_generator(cfg, "filter", model, tok, pristine=True))
        if backend == "vllm":
            _, first_s = timed(lambda: gen.generate(prompts[:1], SamplingParams(greedy=True, max_tokens=4)))
            row["engine_start_s"] = start_s + first_s
        summary, s = timed(lambda: run_filter(problems, gen, make_grader(cfg.data.grader), cfg, work / f"filter_{backend}",
                                              {"model": "bench"}, progress=False))
        row["filter"] = {"seconds": s, "problems_per_s": len(problems) / s, "samples_per_s": len(problems) * args.k / s,
                         "hard": summary["hard"]}
        for name, ps, batch in (("generate_failk", failk, prompts), ("teacher", teacher, [cfg.teacher.prompt])):
            outs, s = timed(lambda: gen.generate(batch, ps))
            n_tok = sum(len(x.token_ids) for g in outs for x in g)
            row[name] = {"seconds": s, "sequences_per_s": len(batch) * ps.n / s, "tokens_per_s": n_tok / s,
                         "mean_tokens": n_tok / (len(batch) * ps.n)}
        gen = make_generator(cfg, "eval", lora_model, tok)
        gen.generate(prompts[:1], SamplingParams(greedy=True, max_tokens=4))  # adapter load / push outside the timing
        outs, s = timed(lambda: gen.generate(prompts, failk))
        row["lora"] = {"seconds": s, "sequences_per_s": len(prompts) * args.k / s,
                       "slowdown_vs_base": s / row["generate_failk"]["seconds"]}
        if backend == "vllm":
            gen.sync_weights(model)
            _, s = timed(lambda: gen.generate(prompts[:1], SamplingParams(greedy=True, max_tokens=4)))
            row["weight_push_s"] = s
        results[backend] = row
        print(backend, json.dumps(row, indent=1))
    ratios = {w: results["vllm"][w]["seconds"] and results["hf"][w]["seconds"] / results["vllm"][w]["seconds"]
              for w in ("filter", "generate_failk", "teacher", "lora")}
    out = {"benchmark": "generation", "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                                   "threads": args.threads},
           "versions": package_versions(), "config": {**vars(args), "model": cfg.model.path,
                                                      "filter_max_tokens": cfg.filter.max_tokens,
                                                      "teacher_max_tokens": cfg.teacher.max_tokens},
           "results": results, "speedup_vllm_over_hf": ratios}
    print("speed-up vllm/hf:", {k: round(v, 2) for k, v in ratios.items()})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
