"""A team's GPU memory plan (``soar-estimate --plan`` of a ``team.chain`` config): everything ``soar-team``
holds on its one GPU, summed, from the config and the models' shapes alone (``soar.memory_plan``'s terms and
check; no weights, no GPU).

Held: the base weights; per agent (one shared policy, or one per trained role) its adapter or weights, its
fp32 master copy and AdamW moments (``policy_terms``); a full fine-tuned shared policy's reference copy when
a KL is used; a LoRA on the unembedding (``lm_head``, not a decoder-layer linear); the process coach
(``team.scorer.kind=llm``): its weights (HF) or its own vLLM engine's reservation. Phases (not overlapping):
rollouts (HF's KV cache of ``backend.batch_size`` episodes at the chain's longest prompt), and one agent's
update (agents update one after another). A vLLM engine (the rollouts', or the coach's) is an ``EnginePlan``
on the same GPU, summed with the process (``soar.memory_plan.place``).
The chain's longest sequence: ``prompt_tokens`` plus every policy role's ``max_tokens`` plus a sandbox
tool's output (``team.sandbox.max_output_chars`` / 3 tokens).
"""

from __future__ import annotations

import math

from soar.machine import gpu_capacity_gib
from soar.memory_plan import (
    DTYPE_BYTES,
    PROMPT_TOKENS,
    MemoryPlan,
    RolePlan,
    Term,
    adapter_bytes,
    engine_plan,
    generation_bytes,
    model_shape,
    place,
    policy_terms,
    update_terms,
)
from soar.resolve import resolve_backend
from soar.team.credit import CREDITS
from soar.team.rollout import chain_info


def chain_tokens(team, prompt_tokens: int) -> int:
    """The longest sequence of a chain: the prompt, every policy role's output, a sandbox's output."""
    out = prompt_tokens
    for name in team.chain:
        role = team.roles[name]
        out += role.max_tokens if not role.tool else (math.ceil(team.sandbox.max_output_chars / 3)
                                                      if role.tool == "python_sandbox" else 32)
    return out


def team_plan(cfg, prompt_tokens: int = PROMPT_TOKENS, capacity_gib: float | None = None) -> MemoryPlan:
    s, team = cfg.student, cfg.team
    shape = model_shape(cfg.model.path, cfg.model.trust_remote_code)
    capacity_gib = capacity_gib or gpu_capacity_gib(cfg)
    e = DTYPE_BYTES[cfg.model.dtype]
    weights = shape.params * e
    seq = chain_tokens(team, prompt_tokens)
    agents = 1 if team.sharing == "shared" else len(chain_info(team).trained)
    lora = s.lora.r > 0
    held_opt, grads = policy_terms(shape, s, e, "student")
    held = [Term("base model weights", weights, ("model.path",))]
    per_agent = adapter_bytes(shape, s, e) if lora else (weights if team.sharing == "per_role" else 0)
    if per_agent:
        held.append(Term(f"{agents} agent{'s' if agents > 1 else ''}' {'adapters' if lora else 'weights'}",
                         agents * per_agent, ("team.sharing", "student.lora.r")))
    held += [Term(f"{t.what} x {agents}" if agents > 1 else t.what, agents * t.bytes, t.fields) for t in held_opt]
    if lora and "lm_head" in s.lora.target_modules:
        head = s.lora.r * (shape.hidden + shape.vocab)  # lm_head: peft's LoRA on the unembedding, per agent
        held.append(Term(f"unembedding LoRA (lm_head) x {agents}, with its masters and moments",
                         agents * head * (e + (16 if s.precision == "mixed" and e < 4 else 3 * e)),
                         ("student.lora.target_modules",)))
    needs_kl = s.kl_coef > 0 or (CREDITS[team.credit].needs_kl and team.kl_reward_coef > 0)
    if not lora and needs_kl and team.sharing == "shared":
        held.append(Term("reference copy (full fine-tuning with a KL)", weights, ("student.kl_coef", "team.kl_reward_coef")))
    scorer = team.scorer
    engines = []
    tp = cfg.backend.vllm.tensor_parallel_size
    if scorer.kind == "llm":
        coach_cfg = scorer.model if scorer.model.path else cfg.model
        coach = model_shape(coach_cfg.path, coach_cfg.trust_remote_code)
        ce = DTYPE_BYTES[coach_cfg.dtype]
        if resolve_backend(cfg.backend, "coach") == "vllm":
            engines.append(engine_plan(cfg, "coach's vLLM engine", "soar-team", coach_cfg.path, coach, ce,
                                       seq + scorer.max_tokens, tp))
        else:
            held.append(Term(f"coach weights ({coach_cfg.path}, HF)", coach.params * ce, ("team.scorer.model.path",)))
    phases: dict[str, list[Term]] = {}
    episodes = s.questions_per_step * s.group_size * (2 if CREDITS[team.credit].needs_sibling else 1)
    batch = min(cfg.backend.batch_size, episodes)
    if resolve_backend(cfg.backend, "student") == "hf":
        phases["rollouts (hf)"] = [Term(f"KV cache ({batch} x {seq} tokens)", generation_bytes(shape, e, batch, seq),
                                        ("backend.batch_size",))]
    phases["one agent's update"] = grads + update_terms(shape, s, e, "student", seq)
    if scorer.kind == "llm" and resolve_backend(cfg.backend, "coach") == "hf":
        phases["coach scoring (hf)"] = [Term(f"coach KV cache ({batch} x {seq + scorer.max_tokens} tokens)",
                                             generation_bytes(coach, ce, batch, seq + scorer.max_tokens),
                                             ("backend.batch_size",))]
    driver = RolePlan("soar-team", held, phases)
    if resolve_backend(cfg.backend, "student") == "vllm":
        engines.append(engine_plan(cfg, "vLLM engine", "soar-team", cfg.model.path, shape, e, seq, tp))
    return MemoryPlan("team", [driver], engines, place(cfg, [driver], engines, [], capacity_gib))
