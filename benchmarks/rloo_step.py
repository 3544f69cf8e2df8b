"""Seconds per RLOO student step split into sample / sync / grade / forward-backward / optimiser
on a world model, full fine-tuning vs LoRA, with rollouts from HF or a vLLM engine (``--backend
vllm``: the sync is the weight or adapter push). Writes JSON with machine info.

    python benchmarks/rloo_step.py --model ~/.cache/soar/worlds/arith-XXXX --out benchmarks/results/rloo_step.json
    python benchmarks/rloo_step.py --model ~/.cache/soar/worlds/arith-XXXX --backend vllm \
        --out benchmarks/results/rloo_step_vllm.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

PARTS = ("sample", "sync", "grade", "train", "forward_backward", "optimizer")
"""Trainer timings (``time/*_s``): sample includes sync; train is forward_backward + optimizer + packing."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="HF folder of a world model")
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="where student rollouts are sampled")
    ap.add_argument("--out", default="benchmarks/results/rloo_step.json")
    args = ap.parse_args()

    import soar
    from soar.generation import make_generator
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.policy.trainer import RLOOTrainer
    from soar.run import package_versions
    from soar.students.trainer import batch_indices
    from soar.worlds.arith import family_problems
    from soar.worlds.base import configured_world

    torch.set_num_threads(args.threads)
    results = {}
    for name, extra in (("full", ["student.lora.r=0", "student.lr=1e-4"]),
                        ("lora_r8", ["student.lora.r=8", "student.lr=1e-3"])):
        cfg = soar.compose(["experiment=arith", f"student.questions_per_step={args.questions}",
                            f"student.group_size={args.group}", f"model.path={args.model}",
                            f"backend.student={args.backend}", "backend.vllm.enable_lora=true", "backend.vllm.kv_cache_gb=1",
                            "backend.vllm.dtype=float32", *extra])
        problems = family_problems(configured_world(cfg).config(cfg), list(cfg.world.stepping_carries), 256, 0, "bench")
        t0 = time.perf_counter()
        model, tok = load_model(cfg.model), load_tokenizer(cfg.model)
        load_s = time.perf_counter() - t0
        ref = load_model(cfg.model) if cfg.student.lora.r == 0 else None
        trainer = RLOOTrainer(model, tok, make_grader("integer"), cfg.student, cfg.data.prompt_template, 0, ref_model=ref,
                              generator=make_generator(cfg, "student", None, tok))
        rows = []
        for step in range(args.steps):
            batch = [problems[i] for i in batch_indices(len(problems), step, args.questions, 0)]
            t = time.perf_counter()
            m = trainer.step(batch).metrics
            rows.append({"total_s": time.perf_counter() - t, **{f"{k}_s": m[f"time/{k}_s"] for k in PARTS},
                         "skipped": m["student/skipped_zero_adv"]})
        steady = rows[1:]  # the first step pays one-off costs
        results[name] = {"model_load_s": load_s, **{k: float(np.mean([r[k] for r in steady])) for k in
                                                     ("total_s", *(f"{p}_s" for p in PARTS))},
                         "skipped_steps": int(sum(r["skipped"] for r in rows)), "steps": rows}
        print(name, {k: round(v, 3) for k, v in results[name].items() if isinstance(v, float)})
    out = {"benchmark": "rloo_step", "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                                 "threads": args.threads}, "versions": package_versions(),
           "config": vars(args), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
