"""The GPU check: one script, JSON out, for a machine with torch, transformers and peft only (no
vllm, ray, hydra, omegaconf; nothing downloaded). On a random-init Llama-3.2-3B-shaped model (built
from ``LlamaConfig``) it measures, with the project's own ``RLOOTrainer``:

1. inner-step time and peak memory, full fine-tuning vs LoRA, on synthetic rollouts of the paper's
   shape (questions x group samples, prompt + completion tokens; forward/backward + optimiser);
2. HF ``generate`` throughput (sequences/s, tokens/s) at a fixed completion length;
3. peft multi-adapter forward: one mixed batch over 4 adapters (``adapter_names=``) vs 4 batches.

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json                     # H100/H200, ~5 min
    python benchmarks/gpu_check.py --questions 8 --lora-variants all,all_bf16,attn,attn_bf16 \
        --out $OUT/gpu_check_lora.json                                            # LoRA's slowness, ~6 min
    python benchmarks/gpu_check.py --shape tiny --device cpu --out /tmp/gpu.json  # the CPU smoke (CI)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

SHAPES = {
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=4096),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True, max_position_embeddings=512),
}
"""Llama-3.2-3B's shape (its config.json) and a tiny one for the CPU smoke test."""


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_gb(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def new_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(LlamaConfig(**SHAPES[args.shape], pad_token_id=0, eos_token_id=1))
    return model.to(dtype=getattr(torch, args.dtype))


LORA_VARIANTS = {
    # name: (target modules, dropout, peft autocast_adapter_dtype). "all" is soar's default (student.lora.*).
    "all": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 0.0, True),
    "all_bf16": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 0.0, False),
    "attn": (["q_proj", "k_proj", "v_proj", "o_proj"], 0.0, True),
    "attn_bf16": (["q_proj", "k_proj", "v_proj", "o_proj"], 0.0, False),
    "all_dropout": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 0.05, True),
}
"""LoRA settings to time against full fine-tuning (``--lora-variants``): suspects of LoRA's 1.29x."""


def inner_step(args, lora_r: int, variant: str = "all") -> dict:
    """``RLOOTrainer.update`` on random rollouts: the student's forward/backward + optimiser step."""
    from soar.config import LoraConfig, StudentConfig
    from soar.students.trainer import RLOOTrainer

    reset_peak(args.device)
    cfg = StudentConfig(questions_per_step=args.questions, group_size=args.group, lr=1e-5 if lora_r == 0 else 1e-4,
                        kl_coef=0.001, max_steps=args.steps + 1, micro_batch_size=args.micro_batch,
                        max_grad_norm=1.0, skip_zero_adv=False,
                        lora=LoraConfig(r=lora_r, alpha=2 * max(lora_r, 1), target_modules=LORA_VARIANTS[variant][0],
                                        dropout=LORA_VARIANTS[variant][1],
                                        autocast_adapter_dtype=LORA_VARIANTS[variant][2]))
    model = new_model(args)
    ref = new_model(args) if lora_r == 0 else None
    trainer = RLOOTrainer(model, SimpleNamespace(pad_token_id=0), None, cfg, "{question}", 0, ref_model=ref)
    vocab, n = SHAPES[args.shape]["vocab_size"], args.questions * args.group
    gen = torch.Generator().manual_seed(0)
    prompt = [torch.randint(2, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(n)]
    completion = [torch.randint(2, vocab, (args.completion_len,), generator=gen).tolist() for _ in range(n)]
    adv = torch.randn(n, generator=gen).to(args.device)
    times = []
    for _ in range(args.steps + 1):  # the first step pays allocator and kernel warm-up
        sync(args.device)
        t0 = time.perf_counter()
        stats = trainer.update(prompt, completion, adv)
        sync(args.device)
        times.append({"total_s": time.perf_counter() - t0, "forward_backward_s": stats["forward_backward_s"],
                      "optimizer_s": stats["optimizer_s"]})
    steady = times[1:]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    dtypes = sorted({str(p.dtype) for p in trainer.model.parameters() if p.requires_grad})
    out = {"lora_r": lora_r, "lora_variant": variant if lora_r else None, "trainable_dtypes": dtypes,
           "trainable_params": trainable, "peak_gb": peak_gb(args.device),
           "tokens_per_step": n * (args.prompt_len + args.completion_len),
           **{k: sum(t[k] for t in steady) / len(steady) for k in steady[0]}, "steps": times}
    del trainer, model, ref
    return out


@torch.no_grad()
def generation(args) -> dict:
    """HF ``generate`` throughput at a forced completion length (EOS suppressed by ``min_new_tokens``)."""
    reset_peak(args.device)
    model = new_model(args).eval()
    vocab = SHAPES[args.shape]["vocab_size"]
    ids = torch.randint(2, vocab, (args.gen_batch, args.prompt_len), generator=torch.Generator().manual_seed(1))
    ids = ids.to(args.device)
    runs = []
    for _ in range(2):  # warm-up, then measured
        sync(args.device)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_k=0, max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens, pad_token_id=0)
        sync(args.device)
        runs.append(time.perf_counter() - t0)
    new_tokens = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"batch": args.gen_batch, "new_tokens_per_seq": args.gen_tokens, "seconds": runs[-1],
            "sequences_per_s": args.gen_batch / runs[-1], "tokens_per_s": new_tokens / runs[-1],
            "peak_gb": peak_gb(args.device)}


@torch.no_grad()
def multi_adapter_forward(args, adapters: int = 4) -> dict:
    """One forward over a batch mixing ``adapters`` LoRA adapters vs one forward per adapter."""
    from peft import LoraConfig, get_peft_model

    reset_peak(args.device)
    lora = dict(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"], init_lora_weights=False)
    model = get_peft_model(new_model(args), LoraConfig(**lora), adapter_name="a0")
    for i in range(1, adapters):
        model.add_adapter(f"a{i}", LoraConfig(**lora))
    model = model.to(dtype=getattr(torch, args.dtype)).eval()
    per = max(args.gen_batch // adapters, 1)
    vocab = SHAPES[args.shape]["vocab_size"]
    ids = torch.randint(2, vocab, (per * adapters, args.prompt_len + args.completion_len),
                        generator=torch.Generator().manual_seed(2)).to(args.device)
    names = [f"a{i}" for i in range(adapters) for _ in range(per)]

    def mixed():
        return model(input_ids=ids, adapter_names=names).logits

    def separate():
        outs = []
        for i in range(adapters):
            model.set_adapter(f"a{i}")
            outs.append(model(input_ids=ids[i * per:(i + 1) * per]).logits)
        return torch.cat(outs)

    timings = {}
    for name, fn in (("mixed_batch", mixed), ("one_batch_per_adapter", separate)):
        fn()  # warm-up
        sync(args.device)
        t0 = time.perf_counter()
        logits = fn()
        sync(args.device)
        timings[name] = {"seconds": time.perf_counter() - t0}
        timings[name]["last_logits"] = logits[:, -1].float()
    gap = (timings["mixed_batch"].pop("last_logits") - timings["one_batch_per_adapter"].pop("last_logits")).abs().max()
    return {"adapters": adapters, "rows": per * adapters, "tokens_per_row": ids.shape[1], **timings,
            "mixed_over_separate": timings["mixed_batch"]["seconds"] / timings["one_batch_per_adapter"]["seconds"],
            "max_abs_logit_gap": gap.item(), "peak_gb": peak_gb(args.device)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="3b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--questions", type=int, default=2, help="questions per step (paper: 8)")
    ap.add_argument("--group", type=int, default=32, help="samples per question (paper: 32)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--completion-len", type=int, default=512, help="paper: up to 1024")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2, help="measured steps after one warm-up step")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-variants", default="all",
                    help=f"comma-separated LoRA settings to time ({', '.join(LORA_VARIANTS)}); the first is "
                         "inner_step_lora, the others inner_step_lora_<name>")
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--out", default="gpu_check.json")
    args = ap.parse_args()

    import transformers

    info = {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__, "device": args.device,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}
    try:
        import peft

        info["peft"] = peft.__version__
    except ImportError:
        info["peft"] = None
    result = {"benchmark": "gpu_check", "machine": info, "config": vars(args), "shape": SHAPES[args.shape]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = {"inner_step_full": lambda: inner_step(args, 0), "inner_step_lora": lambda: inner_step(args, args.lora_r),
             "generation": lambda: generation(args), "multi_adapter_forward": lambda: multi_adapter_forward(args)}
    variants = args.lora_variants.split(",")
    parts["inner_step_lora"] = lambda: inner_step(args, args.lora_r, variants[0])
    for name in variants[1:]:
        parts[f"inner_step_lora_{name}"] = lambda name=name: inner_step(args, args.lora_r, name)
    for name, fn in parts.items():  # each part on its own: one failure (e.g. OOM) keeps the others
        t0 = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON, the run goes on
            result[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        result[name]["wall_s"] = time.perf_counter() - t0
        out.write_text(json.dumps(result, indent=2))  # after every part: a timeout keeps what finished
        print(name, {k: v for k, v in result[name].items() if not isinstance(v, (list, dict))}, flush=True)
    if "error" not in result["inner_step_full"] and "error" not in result["inner_step_lora"]:
        full, lora = result["inner_step_full"], result["inner_step_lora"]
        result["lora_over_full"] = {"step_time": lora["total_s"] / full["total_s"],
                                    "peak_memory": (lora["peak_gb"] / full["peak_gb"]) if full["peak_gb"] else None}
        for name in variants[1:]:
            other = result[f"inner_step_lora_{name}"]
            if "error" not in other:
                result["lora_over_full"][name] = other["total_s"] / full["total_s"]
    out.write_text(json.dumps(result, indent=2))
    print("wrote", out)


if __name__ == "__main__":
    main()
