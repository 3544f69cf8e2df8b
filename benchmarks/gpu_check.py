"""The GPU check (issues 49 §6 and 57 §4): one script, JSON out, at the paper's shape on one H100/H200 in at
most 8 minutes, for a machine with torch, transformers and peft only (no vllm, ray, hydra, omegaconf,
datasets; nothing downloaded: a random-init Llama-3.2-3B-shaped model built from ``LlamaConfig``). With the
project's own ``RLOOTrainer``, ``token_logprobs`` and memory plan it measures (``DEFAULT_PARTS``, in order):

1. ``full_mixed`` / ``lora_bf16``: a full fine-tuning and a LoRA r = 16 (bf16 adapters) inner step, both with
   fp32 master weights and gradient checkpointing (time, peak and reservation against the plan);
2. ``lora_split``: where LoRA's step time goes: reference forward, policy forward, backward, optimiser, for
   full FT and LoRA, and LoRA's forward with its adapters against the base alone;
3. ``layout_students``: the chosen layout's student worker (``LAYOUT``: experiment=paper_math_lora): 2 LoRA
   students trained one after another on one shared baseline, each kept as its adapter: step time, peak
   against the plan's worker;
4. ``driver_and_student``: the chosen layout's GPU 0 in one process: the driver's teacher state and update,
   then a LoRA student's update beside it: peak against the plan's figures;
5. ``sdpa_kernels``: whether the padded training forward/backward runs without SDPA's math kernel (else the
   plan's math-fallback reserve is what it uses);
6. ``logprobs``: one micro-batch through ``token_logprobs`` (the LM head in chunks) and the full-vocabulary
   logits, forward and backward: peak, time, agreement;
7. ``generation``: HF ``generate`` at batch 256 x 512 new tokens (tokens/s, peak).

With ``--parts``: ``full_pure`` (pure bf16), ``lora_fp32`` (peft's fp32 adapters), ``multi_adapter_forward``
(one batch mixing 4 adapters against 4 batches), ``full_mixed_no_checkpointing`` (an H200 only). vLLM cannot
be measured there (the image has no vllm): the JSON says so.

Inner steps: ``questions`` x ``group`` synthetic rollouts of ``prompt_len`` + ``completion_len`` tokens
(default 2 x 32 of 128 + 1024: the paper's sequences, a quarter of its 8 x 32 per step; time scales
with rollouts) at micro-batch 8, one warm-up step then ``steps`` measured. Beside every measured peak
(``torch.cuda.max_memory_allocated``) the reservation (``max_memory_reserved``: the allocator's slack, under
``expandable_segments`` as the stages run) and the memory plan's prediction; a part the plan puts above the
GPU's memory is skipped and says so. JSON is rewritten after every part, so a timeout keeps what finished.

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json          # H100/H200, ~5 min
    bash dev/scripts/gpu_check_on_device.sh                               # the device tool's call
    python benchmarks/gpu_check.py --dry --out /tmp/gpu_check.json    # every part on CPU, tiny (the tests)
"""

from __future__ import annotations

import argparse
import json
import os
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


def reserved_gib(device: str) -> float | None:
    """The allocator's peak reservation: beside ``peak_gib``, what ``soar.memory_plan.FRAGMENTATION`` assumes."""
    return torch.cuda.max_memory_reserved() / GIB if device.startswith("cuda") else None


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
           "reserved_gib": reserved_gib(args.device),
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


def timed(device: str, fn):
    """(fn's result, its seconds), the GPU synchronised on both sides."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def step_split(trainer, prompt, completion, adv, device: str, micro_batch: int) -> dict:
    """One inner step of ``trainer`` the way ``RLOOTrainer.update`` takes it, timed piece by piece: the
    reference forward, the policy forward, backward (with checkpointing's recompute and the fp32 masters'
    gradient hooks), and the optimiser (clipping, AdamW on the masters, their copy into the model)."""
    from soar.policy.rloo import pack_sequences, token_logprobs, weighted_rloo_loss

    parts = {"reference_s": 0.0, "forward_s": 0.0, "backward_s": 0.0}
    n = len(completion)
    for start in range(0, n, micro_batch):
        sl = slice(start, start + micro_batch)
        ids, attn, mask = (t.to(device) for t in pack_sequences(prompt[sl], completion[sl], 0))
        ref, dt = timed(device, lambda: trainer.reference_logprobs(ids, attn))
        parts["reference_s"] += dt
        logp, dt = timed(device, lambda: token_logprobs(trainer.model, ids, attn, 1.0))
        parts["forward_s"] += dt
        loss = weighted_rloo_loss(logp, ref, adv[sl][:, None] * mask, mask, trainer.cfg.kl_coef, n)[0]
        _, dt = timed(device, loss.backward)
        parts["backward_s"] += dt

    def optimise():
        torch.nn.utils.clip_grad_norm_(trainer.params, trainer.cfg.max_grad_norm)
        trainer.optimizer.step()
        if trainer.master is not None:
            trainer.master.copy_to_model()
        trainer.optimizer.zero_grad(set_to_none=True)

    parts["optimizer_s"] = timed(device, optimise)[1]
    parts["total_s"] = sum(parts.values())
    return parts


def lora_split(args) -> dict:
    """Where LoRA's step time goes: the same inner step (fp32 masters, gradient checkpointing, micro-batch
    ``micro_batch``) split into reference forward, policy forward, backward and optimiser, with full
    fine-tuning (its reference a second copy) and with LoRA (bf16 adapters; its reference the base with the
    adapters off), after one warm-up step each; and LoRA's forward against the same forward with its
    adapters disabled (what the adapter layers add)."""
    from soar.policy.rloo import pack_sequences, token_logprobs
    from soar.policy.trainer import RLOOTrainer

    prompt, completion, adv = rollouts(args)
    adv = adv.to(args.device)
    out = {"micro_batch": args.micro_batch, "rollouts": len(completion),
           "tokens_per_step": len(completion) * (args.prompt_len + args.completion_len)}
    for kind in ("full", "lora"):
        reset_peak(args.device)
        cfg = student_config(args, "bf16" if kind == "lora" else None)
        model = new_model(args)
        trainer = RLOOTrainer(model, SimpleNamespace(pad_token_id=0), None, cfg, "{question}", 0,
                              ref_model=None if kind == "lora" else new_model(args))
        trainer.update(prompt, completion, adv)  # warm-up: kernels, the allocator, AdamW's state
        out[kind] = step_split(trainer, prompt, completion, adv, args.device, args.micro_batch)
        out[kind]["peak_gib"], out[kind]["reserved_gib"] = peak_gib(args.device), reserved_gib(args.device)
        if kind == "lora":
            policy = trainer.model
            ids, attn, _ = (t.to(args.device) for t in pack_sequences(prompt[:args.micro_batch],
                                                                      completion[:args.micro_batch], 0))

            def forward():
                return token_logprobs(policy, ids, attn, 1.0)

            with torch.no_grad():
                timed(args.device, forward)  # warm-up
                out["adapter_forward_s"] = timed(args.device, forward)[1]
                with policy.disable_adapter():
                    out["base_forward_s"] = timed(args.device, forward)[1]
        trainer = model = policy = None  # freed before the next kind
    out["lora_over_full"] = {k: out["lora"][k] / out["full"][k] for k in out["full"]
                             if k.endswith("_s") and out["full"][k] > 0}
    return out


LAYOUT = {"preset": "experiment=paper_math_lora", "students_per_gpu": 2, "micro_batch": 4, "lora_r": 16,
          "lora_alpha": 32, "teacher_micro_batch": 8, "teacher_prompt": 160, "teacher_tokens": 512}
"""The chosen layout's sizes (conf/experiment/paper_math_lora.yaml; tests/test_gpu_check.py checks they are
its): each GPU trains 2 LoRA students one after another beside the baseline, at micro-batch 4; the
driver's GPU also holds the teacher (full FT, micro-batch 8, its prompt and 512-token completions)."""


def layout_config(args):
    """The chosen layout as the schema's dataclasses (the GPU image has no Hydra to compose the preset)."""
    from soar.config import LoraConfig, SoarConfig

    cfg = SoarConfig()
    s, t = cfg.student, cfg.teacher
    s.questions_per_step, s.group_size, s.max_tokens = args.questions, args.group, args.completion_len
    s.micro_batch_size, s.gradient_checkpointing, s.lr = args.layout_micro_batch, True, 1e-4
    s.lora = LoraConfig(r=LAYOUT["lora_r"], alpha=LAYOUT["lora_alpha"], target_modules=args.lora_targets.split(","))
    t.micro_batch_size, t.gradient_checkpointing, t.max_tokens = args.layout_teacher_micro_batch, True, args.teacher_tokens
    t.prompt = "." * (3 * (args.teacher_prompt - 1))  # as many tokens as the measured teacher prompt, by the plan's count
    cfg.model.dtype = args.dtype
    cfg.backend.name = cfg.backend.student = cfg.backend.eval = cfg.backend.teacher = "hf"
    cfg.resources.num_workers, cfg.resources.gpus_per_student = 8, 1
    return cfg


def planned_roles(args) -> dict:
    """The memory plan's driver and student worker of the chosen layout at this run's sizes: held terms and
    each update phase (GiB, torch's allocation, no slack)."""
    from soar.machine import GIB
    from soar.memory_plan import model_shape, plan

    memory = plan(layout_config(args), shape=model_shape(llama_config(args)), prompt_tokens=args.prompt_len,
                  capacity_gib=gpu_gib(args.device) or 79.0)
    out = {}
    for role, phase in (("driver", "teacher update"), ("student worker", "student update")):
        r = memory.role(role)
        out[role] = {"held_gib": sum(t.bytes for t in r.held) / GIB,
                     "update_gib": sum(t.bytes for t in r.phases[phase]) / GIB}
    return out


def lora_student(baseline, args):
    from soar.policy.trainer import RLOOTrainer
    from soar.students.trainer import sharing_copy

    cfg = layout_config(args).student
    cfg.max_steps, cfg.skip_zero_adv, cfg.kl_coef = args.steps + 1, False, 0.001
    return RLOOTrainer(sharing_copy(baseline), SimpleNamespace(pad_token_id=0), None, cfg, "{question}", 0)


def layout_students(args) -> dict:
    """The chosen layout's student worker: ``students_per_gpu`` LoRA students trained one after another on
    one bf16 baseline they share (``sharing_copy``), each then kept as its adapter for the promotion
    decision, at the layout's micro-batch with checkpointing and fp32 masters: step times, peak and
    reservation against the plan's worker (its held terms and its student update)."""
    prompt, completion, adv = rollouts(args)
    adv = adv.to(args.device)
    reset_peak(args.device)
    baseline = new_model(args).requires_grad_(False)
    kept, steps = [], []
    for _ in range(LAYOUT["students_per_gpu"]):
        trainer = lora_student(baseline, args)
        for _ in range(args.steps + 1):
            stats, dt = timed(args.device, lambda: trainer.update(prompt, completion, adv))
            steps.append({"total_s": dt, "forward_backward_s": stats["forward_backward_s"],
                          "optimizer_s": stats["optimizer_s"]})
        trainer.keep_policy_only()
        kept.append(trainer)
    planned = planned_roles(args)["student worker"]
    return {"students": len(kept), "micro_batch": args.layout_micro_batch, "lora_r": LAYOUT["lora_r"],
            "steps": steps, "step_s": sum(x["total_s"] for x in steps[1:]) / max(len(steps) - 1, 1),
            "peak_gib": peak_gib(args.device), "reserved_gib": reserved_gib(args.device),
            "planned_peak_gib": planned["held_gib"] + planned["update_gib"], "planned": planned}


def driver_and_student(args) -> dict:
    """The chosen layout's GPU 0 in one process: the driver's state (the baseline, the teacher with its
    reference copy, fp32 masters and AdamW moments) and one teacher update at the teacher's shape, then a
    LoRA student of the worker beside it and its update. Peak and reservation against the plan: the driver
    held plus the larger of its teacher update and the worker's peak (what one process holding both
    reaches; the plan itself sums the two processes' peaks, each with slack and context)."""
    from soar.policy.trainer import RLOOTrainer

    reset_peak(args.device)
    driver_baseline = new_model(args).requires_grad_(False)  # the driver's baseline student, held throughout
    tcfg = layout_config(args).teacher
    tcfg.max_steps, tcfg.warmup_steps, tcfg.skip_zero_adv = args.steps + 1, 0, False
    teacher = RLOOTrainer(new_model(args), SimpleNamespace(pad_token_id=0), None, tcfg, "{question}", 0,
                          ref_model=new_model(args), role="teacher")
    vocab, n = SHAPES[args.shape]["vocab_size"], 4 * 64 if args.shape == "3b" else 8  # g x n pairs
    gen = torch.Generator().manual_seed(4)
    t_prompt = [torch.randint(2, vocab, (args.teacher_prompt,), generator=gen).tolist() for _ in range(n)]
    t_completion = [torch.randint(2, vocab, (args.teacher_tokens,), generator=gen).tolist() for _ in range(n)]
    t_adv = torch.randn(n, generator=gen).to(args.device)
    out = {"teacher_sequences": n, "teacher_tokens": args.teacher_prompt + args.teacher_tokens}
    out["teacher_update_s"] = [timed(args.device, lambda: teacher.update(t_prompt, t_completion, t_adv))[1]
                               for _ in range(2)]
    out["driver_peak_gib"] = peak_gib(args.device)
    prompt, completion, adv = rollouts(args)
    student = lora_student(new_model(args).requires_grad_(False), args)  # the worker's own baseline: its own process
    out["student_update_s"] = [timed(args.device, lambda: student.update(prompt, completion, adv.to(args.device)))[1]
                               for _ in range(2)]
    out["peak_gib"], out["reserved_gib"] = peak_gib(args.device), reserved_gib(args.device)
    planned = planned_roles(args)
    d, w = planned["driver"], planned["student worker"]
    out["planned"] = planned
    out["planned_peak_gib"] = d["held_gib"] + max(d["update_gib"], w["held_gib"] + w["update_gib"])
    out["planned_sum_of_peaks_gib"] = d["held_gib"] + d["update_gib"] + w["held_gib"] + w["update_gib"]
    del driver_baseline
    return out


def sdpa_kernels(args) -> dict:
    """Whether the training forward and backward (a right-padded micro-batch, so transformers passes SDPA a
    mask) run with SDPA's math kernel disabled: if not, the plan's math-fallback reserve is what they use."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from soar.policy.rloo import pack_sequences, token_logprobs

    model = new_model(args)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    prompt, completion, _ = rollouts(args)
    completion = [c[: len(c) // 2] if i % 2 else c for i, c in enumerate(completion)]  # padding in every batch
    ids, attn, _ = (t.to(args.device) for t in pack_sequences(prompt[:args.micro_batch], completion[:args.micro_batch], 0))
    out = {}
    for name, backends in (("fused_only", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]),
                           ("efficient_only", [SDPBackend.EFFICIENT_ATTENTION])):
        try:
            with sdpa_kernel(backends):
                token_logprobs(model, ids, attn, 1.0).float().sum().backward()
            out[name] = "runs"
        except (RuntimeError, NotImplementedError) as exc:  # "No available kernel" and the like
            out[name] = f"refused: {' '.join(str(exc).split())[:300]}"
        model.zero_grad(set_to_none=True)
    out["math_fallback_needed"] = out["fused_only"] != "runs"
    return out


PARTS = {
    "full_mixed": lambda args: inner_step(args),
    "lora_bf16": lambda args: inner_step(args, lora="bf16"),
    "lora_split": lora_split,
    "layout_students": layout_students,
    "driver_and_student": driver_and_student,
    "sdpa_kernels": sdpa_kernels,
    "logprobs": logprobs,
    "generation": generation,
    "full_pure": lambda args: inner_step(args, precision="pure"),
    "lora_fp32": lambda args: inner_step(args, lora="fp32"),
    "multi_adapter_forward": multi_adapter_forward,
    "full_mixed_no_checkpointing": lambda args: inner_step(args, checkpointing=False),
}
"""Each part on its own (``--parts``), in this order; one failure (e.g. out of memory) keeps the others."""
DEFAULT_PARTS = ("full_mixed", "lora_bf16", "lora_split", "layout_students", "driver_and_student", "sdpa_kernels",
                 "logprobs", "generation")
"""What the 8-minute device run measures (the cost table's inputs first); the rest with ``--parts``."""
DRY = {"shape": "tiny", "device": "cpu", "dtype": "bfloat16", "questions": 1, "group": 4, "prompt_len": 8,
       "completion_len": 16, "micro_batch": 2, "layout_micro_batch": 2, "layout_teacher_micro_batch": 2, "steps": 1,
       "gen_batch": 8, "gen_tokens": 8, "teacher_prompt": 8, "teacher_tokens": 12}
"""``--dry``: every part end to end on CPU with a tiny model in bf16 (the test's smoke run)."""


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
    ap.add_argument("--gen-tokens", type=int, default=512)
    ap.add_argument("--layout-micro-batch", type=int, default=LAYOUT["micro_batch"],
                    help="the chosen layout's student micro-batch (experiment=paper_math_lora)")
    ap.add_argument("--layout-teacher-micro-batch", type=int, default=LAYOUT["teacher_micro_batch"])
    ap.add_argument("--teacher-prompt", type=int, default=LAYOUT["teacher_prompt"])
    ap.add_argument("--teacher-tokens", type=int, default=LAYOUT["teacher_tokens"])
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--dry", action="store_true", help="every part on CPU with a tiny bf16 model (" +
                    ", ".join(f"{k}={v}" for k, v in DRY.items()) + "), for the tests")
    ap.add_argument("--out", default="gpu_check.json")
    args = ap.parse_args()
    if args.dry:
        for key, value in DRY.items():
            setattr(args, key, value)
    from soar.machine import use_expandable_segments

    use_expandable_segments()  # as the stages run (the plan's slack assumes it); before the first CUDA allocation

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
    result = {"benchmark": "gpu_check", "machine": info, "config": vars(args), "shape": SHAPES[args.shape],
              "layout": LAYOUT, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
              "vllm": "not measured: the device image has no vllm (its throughput is an assumed input of the cost)"}
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
