"""The GPU check (issue 49 §6): one script, JSON out, at the paper's shape on one H100/H200 in at most
8 minutes, for a machine with torch, transformers and peft only (no vllm, ray, hydra, omegaconf,
datasets; nothing downloaded: a random-init Llama-3.2-3B-shaped model built from ``LlamaConfig``).
With the project's own ``RLOOTrainer`` and ``token_logprobs`` it measures:

1. ``generation``: HF ``generate`` at batch 256 x 1024 new tokens (sequences/s, tokens/s, peak);
2. ``full_mixed`` / ``full_pure``: a full fine-tuning inner step with fp32 master weights (the default,
   ``precision=mixed``) against pure bf16 (time, peak memory);
3. ``lora_fp32`` / ``lora_bf16``: a LoRA r=16 inner step with fp32 adapters (peft's autocast) and with
   bf16 adapters (their fp32 masters);
4. ``logprobs``: one micro-batch of 8 x (prompt + completion) through ``token_logprobs`` (the LM head
   in chunks) and through the full-vocabulary logits, forward and backward: peak, time, agreement;
5. ``multi_adapter_forward``: one batch mixing 4 peft adapters against 4 single-adapter batches.

Inner steps: ``questions`` x ``group`` synthetic rollouts of ``prompt_len`` + ``completion_len`` tokens
(default 2 x 32 of 128 + 1024: the paper's sequences, a quarter of its 8 x 32 per step; time scales
with rollouts) at micro-batch 8 with gradient checkpointing (the documented layouts'), forward/backward
and optimiser, one warm-up step then ``steps`` measured. Beside every measured peak
(``torch.cuda.max_memory_allocated``) the memory plan's prediction (``soar.memory_plan``); a part the
plan puts above the GPU's memory is skipped and says so (``full_mixed_no_checkpointing`` runs on an
H200 only). JSON is rewritten after every part, so a timeout keeps what finished.

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json                       # H100/H200, ~5 min
    bash dev/scripts/gpu_check_on_device.sh                                            # the device tool's call
    python benchmarks/gpu_check.py --shape tiny --device cpu --dtype float32 ...   # the CPU smoke (tests)
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
               num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=True,
               max_position_embeddings=4096),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True, max_position_embeddings=2048),
}
"""Llama-3.2-3B's shape (its config.json) and a tiny one for the CPU smoke test."""

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GIB = 2**30


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / GIB if device.startswith("cuda") else None


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def gpu_gib(device: str) -> float | None:
    return torch.cuda.get_device_properties(0).total_memory / GIB if device.startswith("cuda") else None


def llama_config(args):
    from transformers import LlamaConfig

    return LlamaConfig(**SHAPES[args.shape], pad_token_id=0, eos_token_id=1)


def new_model(args):
    """A random-init model of the shape, built directly in ``args.dtype`` on ``args.device``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(args.device):
        return AutoModelForCausalLM.from_config(llama_config(args), dtype=getattr(torch, args.dtype))


def student_config(args, lora: str | None, precision: str = "mixed", checkpointing: bool = True):
    from soar.config import LoraConfig, StudentConfig

    r = args.lora_r if lora else 0
    return StudentConfig(questions_per_step=args.questions, group_size=args.group, lr=1e-5 if not lora else 1e-4,
                         kl_coef=0.001, max_steps=args.steps + 1, micro_batch_size=args.micro_batch, max_grad_norm=1.0,
                         skip_zero_adv=False, precision=precision, gradient_checkpointing=checkpointing,
                         lora=LoraConfig(r=r, alpha=2 * max(r, 1), target_modules=args.lora_targets.split(","),
                                         autocast_adapter_dtype=lora == "fp32"))


def planned_step_gib(args, cfg) -> float:
    """The memory plan's peak of one inner step: the policy and (full FT) a reference copy, the
    optimiser's held terms, then the update's gradients, activations and log-prob chunk."""
    from soar.memory_plan import DTYPE_BYTES, adapter_bytes, model_shape, policy_terms, update_terms

    shape, e = model_shape(llama_config(args)), DTYPE_BYTES[args.dtype]
    seq = args.prompt_len + args.completion_len
    weights = shape.params * e * (2 if cfg.lora.r == 0 else 1) + adapter_bytes(shape, cfg, e)
    held, grads = policy_terms(shape, cfg, e, "student")
    return (weights + sum(t.bytes for t in held + grads + update_terms(shape, cfg, e, "student", seq))) / GIB


def rollouts(args):
    vocab, n = SHAPES[args.shape]["vocab_size"], args.questions * args.group
    gen = torch.Generator().manual_seed(0)
    prompt = [torch.randint(2, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(n)]
    completion = [torch.randint(2, vocab, (args.completion_len,), generator=gen).tolist() for _ in range(n)]
    return prompt, completion, torch.randn(n, generator=gen)


def inner_step(args, lora: str | None = None, precision: str = "mixed", checkpointing: bool = True) -> dict:
    """``RLOOTrainer.update`` on synthetic rollouts: forward/backward + optimiser, as a student's step."""
    from soar.policy.trainer import RLOOTrainer

    cfg = student_config(args, lora, precision, checkpointing)
    planned = planned_step_gib(args, cfg)
    capacity = gpu_gib(args.device)
    if capacity is not None and planned > capacity:
        return {"skipped": f"planned {planned:.1f} GiB > {capacity:.1f} GiB on this GPU", "planned_peak_gib": planned}
    reset_peak(args.device)
    model = new_model(args)
    ref = new_model(args) if not lora else None
    trainer = RLOOTrainer(model, SimpleNamespace(pad_token_id=0), None, cfg, "{question}", 0, ref_model=ref)
    prompt, completion, adv = rollouts(args)
    adv = adv.to(args.device)
    times = []
    for _ in range(args.steps + 1):  # the first step pays allocator and kernel warm-up
        sync(args.device)
        t0 = time.perf_counter()
        stats = trainer.update(prompt, completion, adv)
        sync(args.device)
        times.append({"total_s": time.perf_counter() - t0, "forward_backward_s": stats["forward_backward_s"],
                      "optimizer_s": stats["optimizer_s"]})
    steady = times[1:]
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    out = {"lora_r": cfg.lora.r, "precision": precision, "gradient_checkpointing": checkpointing,
           "trainable_params": sum(p.numel() for p in trainable),
           "trainable_dtypes": sorted({str(p.dtype) for p in trainable}),
           "optimizer_dtypes": sorted({str(p.dtype) for p in trainer.params}),
           "rollouts": len(completion), "tokens_per_step": len(completion) * (args.prompt_len + args.completion_len),
           "micro_batch": args.micro_batch, "peak_gib": peak_gib(args.device), "planned_peak_gib": planned,
           **{k: sum(t[k] for t in steady) / len(steady) for k in steady[0]}, "steps": times}
    del trainer, model, ref
    return out


@torch.no_grad()
def generation(args) -> dict:
    """HF ``generate`` at ``gen_batch`` x ``gen_tokens`` new tokens (EOS suppressed by ``min_new_tokens``),
    after a short warm-up call."""
    from soar.memory_plan import DTYPE_BYTES, generation_bytes, model_shape

    shape, e = model_shape(llama_config(args)), DTYPE_BYTES[args.dtype]
    planned = (shape.params * e + generation_bytes(shape, e, args.gen_batch, args.prompt_len + args.gen_tokens)) / GIB
    reset_peak(args.device)
    model = new_model(args).eval()
    vocab = SHAPES[args.shape]["vocab_size"]
    ids = torch.randint(2, vocab, (args.gen_batch, args.prompt_len), generator=torch.Generator().manual_seed(1))
    ids = ids.to(args.device)
    runs = []
    for tokens in (min(16, args.gen_tokens), args.gen_tokens):  # warm-up, then measured
        sync(args.device)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_k=0, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0)
        sync(args.device)
        runs.append(time.perf_counter() - t0)
    new_tokens = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"batch": args.gen_batch, "new_tokens_per_seq": args.gen_tokens, "seconds": runs[-1],
            "sequences_per_s": args.gen_batch / runs[-1], "tokens_per_s": new_tokens / runs[-1],
            "peak_gib": peak_gib(args.device), "planned_peak_gib": planned}


def logprobs(args) -> dict:
    """One micro-batch through ``token_logprobs`` (chunked LM head) and ``full_token_logprobs``, forward
    and backward: peak memory above the model, time, and the largest gap of values and gradients."""
    from soar.memory_plan import DTYPE_BYTES, activation_bytes, logits_chunk_bytes, model_shape
    from soar.policy.rloo import full_token_logprobs, token_logprobs

    shape, e = model_shape(llama_config(args)), DTYPE_BYTES[args.dtype]
    seq = args.prompt_len + args.completion_len
    model = new_model(args)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(2, shape.vocab, (args.micro_batch, seq), generator=torch.Generator().manual_seed(3))
    ids, attn = ids.to(args.device), torch.ones_like(ids).to(args.device)
    head = model.get_output_embeddings().weight
    out = {"micro_batch": args.micro_batch, "tokens": seq, "full_logits_fp32_gib": args.micro_batch * seq * shape.vocab
           * 4 / GIB}
    results = {}
    for name, fn in (("chunked", token_logprobs), ("full", full_token_logprobs)):
        model.zero_grad(set_to_none=True)
        reset_peak(args.device)
        base = torch.cuda.memory_allocated() / GIB if args.device.startswith("cuda") else None
        try:
            for _ in range(2):  # warm-up, then measured
                model.zero_grad(set_to_none=True)
                sync(args.device)
                t0 = time.perf_counter()
                values = fn(model, ids, attn, temperature=1.0)
                values.float().sum().backward()
                sync(args.device)
                seconds = time.perf_counter() - t0
            results[name] = (values.detach().float(), head.grad.detach().float().clone())
            peak = peak_gib(args.device)
            out[name] = {"seconds": seconds, "peak_gib": peak, "above_model_gib": None if peak is None else peak - base}
        except torch.cuda.OutOfMemoryError as exc:
            out[name] = {"error": f"OutOfMemoryError: {str(exc)[:300]}"}
    # the plan above the weights: the model's bf16 gradients, activations, and the logits: one chunk, or
    # (the full path) the head's output, fp32 logits, their log-softmax and its gradient for every position
    above = activation_bytes(shape, e, args.micro_batch, seq, checkpointing=True) + shape.params * e
    out["planned_above_model_gib"] = {"chunked": (above + logits_chunk_bytes(shape, e, args.micro_batch, seq)) / GIB,
                                      "full": (above + args.micro_batch * seq * shape.vocab * (e + 12)) / GIB}
    if len(results) == 2:
        (cv, cg), (fv, fg) = results["chunked"], results["full"]
        out["max_abs_logprob_gap"] = (cv - fv).abs().max().item()
        out["head_grad_rel_gap"] = ((cg - fg).norm() / fg.norm()).item()
    return out


@torch.no_grad()
def multi_adapter_forward(args, adapters: int = 4) -> dict:
    """One forward over a batch mixing ``adapters`` LoRA adapters vs one forward per adapter."""
    from peft import LoraConfig, get_peft_model

    reset_peak(args.device)
    lora = dict(r=16, lora_alpha=32, target_modules=TARGETS, init_lora_weights=False)
    model = get_peft_model(new_model(args), LoraConfig(**lora), adapter_name="a0")
    for i in range(1, adapters):
        model.add_adapter(f"a{i}", LoraConfig(**lora))
    model = model.to(dtype=getattr(torch, args.dtype)).eval()
    per = max(args.gen_batch // (4 * adapters), 1)
    vocab = SHAPES[args.shape]["vocab_size"]
    ids = torch.randint(2, vocab, (per * adapters, args.prompt_len + args.completion_len),
                        generator=torch.Generator().manual_seed(2)).to(args.device)
    names = [f"a{i}" for i in range(adapters) for _ in range(per)]

    def mixed():
        return model(input_ids=ids, adapter_names=names, logits_to_keep=1).logits

    def separate():
        outs = []
        for i in range(adapters):
            model.set_adapter(f"a{i}")
            outs.append(model(input_ids=ids[i * per:(i + 1) * per], logits_to_keep=1).logits)
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
            "max_abs_logit_gap": gap.item(), "peak_gib": peak_gib(args.device)}


PARTS = {
    "generation": generation,
    "full_mixed": lambda args: inner_step(args),
    "full_pure": lambda args: inner_step(args, precision="pure"),
    "lora_fp32": lambda args: inner_step(args, lora="fp32"),
    "lora_bf16": lambda args: inner_step(args, lora="bf16"),
    "logprobs": logprobs,
    "multi_adapter_forward": multi_adapter_forward,
    "full_mixed_no_checkpointing": lambda args: inner_step(args, checkpointing=False),
}
"""Each part on its own (``--parts``), in this order; one failure (e.g. out of memory) keeps the others."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="3b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--questions", type=int, default=2, help="questions per step (paper: 8)")
    ap.add_argument("--group", type=int, default=32, help="samples per question (paper: 32)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--completion-len", type=int, default=1024, help="paper: up to 1024")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2, help="measured steps after one warm-up step")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-targets", default=",".join(TARGETS), help="modules with adapters (e.g. attention only: "
                    "q_proj,k_proj,v_proj,o_proj)")
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--gen-tokens", type=int, default=1024)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--out", default="gpu_check.json")
    args = ap.parse_args()

    import transformers

    info = {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__, "device": args.device,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
            "gpu_gib": gpu_gib(args.device)}
    try:
        import peft

        info["peft"] = peft.__version__
    except ImportError:
        info["peft"] = None
    result = {"benchmark": "gpu_check", "machine": info, "config": vars(args), "shape": SHAPES[args.shape]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            result[name] = PARTS[name](args)
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON, the run goes on
            result[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-2000:]}
        result[name]["wall_s"] = time.perf_counter() - t0
        result["wall_s"] = time.perf_counter() - t_start
        out.write_text(json.dumps(result, indent=2))  # after every part: a timeout keeps what finished
        print(name, {k: v for k, v in result[name].items() if not isinstance(v, (list, dict))}, flush=True)
    steps = {n: result[n] for n in ("full_mixed", "full_pure", "lora_fp32", "lora_bf16") if "total_s" in result.get(n, {})}
    if "full_pure" in steps:
        result["over_full_pure"] = {n: {"step_time": r["total_s"] / steps["full_pure"]["total_s"],
                                        "peak": (r["peak_gib"] / steps["full_pure"]["peak_gib"]
                                                 if steps["full_pure"]["peak_gib"] else None)} for n, r in steps.items()}
    out.write_text(json.dumps(result, indent=2))
    print("wrote", out, f"in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
