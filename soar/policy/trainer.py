"""The RLOO policy the students and the teacher share: ``RLOOTrainer`` owns a policy (full model or peft
LoRA), its reference, optimiser and schedule, and takes one policy-gradient step on given rollouts and
advantages (``update``) or, as a student, samples, grades and steps on a batch of questions (``step``).

Per student step: sample ``group_size`` completions per question, grade them with the shaped reward,
RLOO advantages within each group, policy gradient + k3 KL to the reference, AdamW + cosine decay.
The teacher calls ``update`` with its dataset-level advantages (``soar.teachers.update``).

With ``distill`` (``DistillConfig``) and an ``advisor`` (``soar.coach.Advisor``: a coach's advice per
rollout, set by ``soar-rl``), a student step also distils (``soar.policy.distill``): the advice-conditioned
teacher scores the same sampled token ids, and each token's weight gets the reverse-KL term
(``soar.policy.rloo.distill_token_weights``).
``distill.objective=sft`` is the supervised baseline at the same budget (``sft_step``): the advised teacher
samples, and ``update`` takes its correct samples with weight ``distill.coef`` and no advice in the prompt:
the policy-gradient loss with those weights is their negative log-likelihood.
"""

from __future__ import annotations

import hashlib
import time
import warnings

import numpy as np
import torch

from soar.data import render_prompt
from soar.generation import HFGenerator, SamplingParams, correctness
from soar.models import export_policy, save_policy
from soar.policy.distill import Distillation
from soar.policy.rloo import (
    StepResult,
    distill_token_weights,
    pack_completion_values,
    pack_sequences,
    rloo_advantages,
    token_logprobs,
    weighted_rloo_loss,
)
from soar.policy.scores import gold_measures, score
from soar.seeding import derive_seed
from soar.student_rewards import STUDENT_REWARDS
from soar.tokens import encode_prompts


class SyncError(RuntimeError):
    """The engine that sampled the rollouts does not hold the trainer's weights."""


def cosine_schedule(optimizer, policy_cfg, steps: int | None = None):
    """The policy's learning-rate schedule: linear warm-up, then cosine decay to ``min_lr_ratio`` over
    ``steps`` (default ``max_steps``; ``transformers``' ``cosine_with_min_lr``)."""
    from transformers import get_scheduler  # deferred: transformers' optimisation module takes seconds to import

    return get_scheduler("cosine_with_min_lr", optimizer, num_warmup_steps=policy_cfg.warmup_steps,
                         num_training_steps=policy_cfg.max_steps if steps is None else steps,
                         scheduler_specific_kwargs={"min_lr_rate": policy_cfg.min_lr_ratio})


def rollout_metrics(samples_QG, grades, rewards_QG, correct_QG, adv_QG) -> dict:
    """A step's ``student/*`` metrics of its rollouts and their grades (one student's step)."""
    lengths = [len(s.token_ids) for group in samples_QG for s in group]
    return {
        "student/reward_mean": rewards_QG.mean().item(),
        "student/accuracy": correct_QG.mean().item(),
        "student/boxed_frac": float(np.mean([g.boxed for g in grades])),
        "student/partial_credit_frac": float(np.mean([g.partial for g in grades])),
        "student/frac_groups_all_wrong": (correct_QG.sum(-1) == 0).float().mean().item(),
        "student/frac_groups_no_signal": (adv_QG.abs().sum(-1) == 0).float().mean().item(),
        "student/adv_abs_mean": adv_QG.abs().mean().item(),
        "student/completion_tokens_mean": float(np.mean(lengths)),
        "student/rollouts": len(lengths),
        "student/overflow_frac": float(np.mean([s.finish_reason == "length" for g in samples_QG for s in g])),
    }


def grade_rollouts(grader, problems, samples_QG, reward: str = "shaped") -> tuple[list, torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """Grades, rewards (Q, G) by ``reward`` (``soar.student_rewards.STUDENT_REWARDS``), correctness (Q, G) and RLOO
    advantages (Q, G) of one step's rollouts."""
    group_size = len(samples_QG[0])
    grades = grader.grade_batch([s.text for group in samples_QG for s in group],
                                [p.answer for p in problems for _ in range(group_size)])
    reward_of = STUDENT_REWARDS[reward]
    rewards_QG = torch.tensor([reward_of(g) for g in grades], dtype=torch.float32).view(len(problems), -1)
    correct_QG = torch.tensor([g.correct for g in grades], dtype=torch.float32).view(len(problems), -1)
    return grades, rewards_QG, correct_QG, rloo_advantages(rewards_QG)
class MasterWeights:
    """Mixed precision (``precision=mixed``): fp32 master copies of a model's low-precision (bf16/fp16)
    trainable weights. The model computes in its own dtype; each parameter's gradient is added into
    its master's fp32 gradient as soon as backward has accumulated it (and freed), so micro-batches
    accumulate in fp32 and no second low-precision gradient copy stays alive; AdamW steps the
    masters, and ``copy_to_model`` rounds them back into the model. fp32 trainable weights are
    updated in place as before: for an fp32 model (or peft's fp32 adapters) this is a no-op.
    Why: at lr 1e-5 most AdamW updates of a bf16 weight are below half its rounding step and vanish
    (measured on a bf16 ``RLOOTrainer``, 10 steps: 15.6 % of linear and 0 % of norm weights moved,
    16 % of the fp32 run's total update; ``tests/test_precision.py``)."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.pairs = [(p, torch.nn.Parameter(p.detach().float().clone())) for p in params if p.dtype != torch.float32]
        low = {id(p) for p, _ in self.pairs}
        self.optimizer_params = [m for _, m in self.pairs] + [p for p in params if id(p) not in low]
        self.hooks = [p.register_post_accumulate_grad_hook(self._accumulate(m)) for p, m in self.pairs]

    @staticmethod
    def _accumulate(master: torch.nn.Parameter):
        def hook(param: torch.Tensor) -> None:
            if master.grad is None:
                master.grad = param.grad.float()
            else:
                master.grad.add_(param.grad)
            param.grad = None
        return hook

    @torch.no_grad()
    def copy_to_model(self) -> None:
        for p, m in self.pairs:
            p.copy_(m)

    def by_param(self) -> dict[int, torch.nn.Parameter]:
        """``id`` of a model parameter -> its master copy."""
        return {id(p): m for p, m in self.pairs}

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks, self.pairs = [], []


def non_finite_loss(role: str, updates: int, lr: float, which: str = "") -> str:
    """What a non-finite loss says: whose, in which of its updates (1-based), and what to change. An
    update's loss comes from the weights the earlier updates left: after some at too high a
    ``{role}.lr`` they diverged; in the first, the model itself gives non-finite log-probs."""
    if updates == 0:
        return (f"non-finite {role} loss in its first update{which}, before any weight change: the model's "
                "log-probs are not finite; check model.path and model.dtype")
    return (f"non-finite {role} loss in its update {updates + 1}{which}, after {updates} at {role}.lr={lr:g}: its "
            f"weights diverged; lower {role}.lr")


class RLOOTrainer(Distillation):
    """Owns a policy (full model or peft LoRA), its reference, optimiser and schedule. ``policy_cfg`` is the
    role's ``PolicyConfig``: ``cfg.student`` for a student, ``cfg.teacher`` for the teacher."""

    def __init__(self, model, tokenizer, grader, policy_cfg, prompt_template: str, seed: int,
                 ref_model=None, batch_size: int = 256, role: str = "student", generator=None, distill=None,
                 advisor=None):
        self.cfg, self.tokenizer, self.grader, self.role = policy_cfg, tokenizer, grader, role
        self.distill, self.advisor = distill, advisor
        """``DistillConfig`` and ``advisor(problems, prompts, samples_QG, grades, step) -> (teacher prompt text
        or None per rollout, metrics)``: the rollouts' advice-conditioned prompts (None: not distilled)."""
        self.template, self.seed = prompt_template, seed
        if policy_cfg.lora.r > 0:
            from peft import LoraConfig, get_peft_model  # deferred: only LoRA policies need peft

            torch.manual_seed(derive_seed(seed, "lora_init"))
            lora = policy_cfg.lora
            model = get_peft_model(model, LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
                autocast_adapter_dtype=lora.autocast_adapter_dtype)
            ref_model = None  # the reference is the same weights with the adapter disabled
        elif ref_model is not None:
            ref_model.eval().requires_grad_(False)
        if policy_cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model, self.ref_model = model, ref_model
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.master = MasterWeights(params) if policy_cfg.precision == "mixed" else None
        self.params = self.master.optimizer_params if self.master is not None else params
        """What AdamW updates: the fp32 master copies (and any fp32 trainable weights) or the model's own."""
        self.optimizer = torch.optim.AdamW(self.params, lr=policy_cfg.lr, betas=tuple(policy_cfg.adam_betas),
                                           weight_decay=policy_cfg.weight_decay)
        self.scheduler = cosine_schedule(self.optimizer, policy_cfg)
        # Rollouts: the given generator (e.g. a shared vLLM one) re-targeted at this policy, or HF.
        self.batch_size = batch_size
        self.generator = generator or HFGenerator(self.model, tokenizer, batch_size=batch_size)
        self.step_count = 0
        self.version = 0  # bumps on every optimiser step; keys the evaluation cache
        self._eval_cache: dict[tuple[int, str], list[bool]] = {}

    def keep_policy_only(self) -> None:
        """Free what a trained student no longer needs (optimiser state, schedule, full-FT reference copy,
        evaluation cache): the promotion decision and the step dump read only its policy, as the Ray
        workers keep only ``self.model``. Kept until the step ends, these were ~3 more model copies
        per student (x g*r = 16 at paper size)."""
        if self.master is not None:
            self.master.remove()
        self.optimizer = self.scheduler = self.ref_model = self.master = self.params = None
        self._eval_cache = {}

    def sampler(self, generator=None):
        """``generator`` (default: the rollout one), pointed at this policy's current weights; a
        generator may be shared by many trainers (e.g. one vLLM engine for all students)."""
        generator = generator or self.generator
        generator.sync_weights(self.model)
        return generator

    # ---- one RLOO step ------------------------------------------------------------------------
    def rollout_request(self, problems) -> tuple[list[str], SamplingParams]:
        """The prompts and sampling parameters of this step's rollouts."""
        cfg = self.cfg
        prompts = [render_prompt(self.template, p.question) for p in problems]
        return prompts, SamplingParams(n=cfg.group_size, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                       seed=derive_seed(self.seed, "rollout", self.step_count), stop=tuple(cfg.stop),
                                       logprobs=self.checks_sync)

    def step(self, problems, samples_QG=None, sample_s: float = 0.0) -> StepResult:
        """Sample (or take ``samples_QG``, generated elsewhere from ``rollout_request`` in
        ``sample_s`` seconds, e.g. batched with other students), grade, update."""
        if self.distill is not None and self.distill.objective == "sft":
            return self.sft_step(problems)
        cfg, t0 = self.cfg, time.perf_counter()
        prompts, params = self.rollout_request(problems)
        if samples_QG is None:
            samples_QG = self.sampler().generate(prompts, params)
        else:
            t0 -= sample_s
        t_sample = time.perf_counter()
        grades, rewards_QG, correct_QG, adv_QG = grade_rollouts(self.grader, problems, samples_QG, cfg.reward)
        t_grade = t_advice = time.perf_counter()

        advice_metrics, advised_prompt_ids = {}, None
        if self.advisor is not None:
            advised_texts, advice_metrics = self.advisor(problems, prompts, samples_QG, grades, self.step_count)
            advised_prompt_ids = [None if t is None else encode_prompts(self.tokenizer, [t])[0] for t in advised_texts]
        t_advice = time.perf_counter()

        prompt_ids = encode_prompts(self.tokenizer, prompts)  # the ids the rollouts were conditioned on
        train_stats = self.update([prompt_ids[q] for q in range(len(problems)) for _ in range(cfg.group_size)],
                                  [s.token_ids for group in samples_QG for s in group], adv_QG.flatten(),
                                  [s.logprobs for group in samples_QG for s in group] if self.checks_sync else None,
                                  advised_prompt_ids)
        skipped, lr = train_stats["skipped"], train_stats["lr"]
        t_train = time.perf_counter()

        metrics = {
            **rollout_metrics(samples_QG, grades, rewards_QG, correct_QG, adv_QG),
            "student/skipped_zero_adv": int(skipped),
            "student/lr": lr,
            "student/pg_loss": train_stats["pg_loss"],
            "student/kl": train_stats["kl"],
            "student/grad_norm": train_stats["grad_norm"],
            **({"student/sync_logprob_gap": train_stats["sync_logprob_gap"]} if "sync_logprob_gap" in train_stats else {}),
            **({"distill/kl": train_stats["distill_kl"], "distill/advised_frac": train_stats["advised_frac"],
                **advice_metrics, "time/advice_s": t_advice - t_grade} if self.advisor is not None else {}),
            "time/sample_s": t_sample - t0,  # includes time/sync_s
            "time/sync_s": getattr(self.generator, "last_sync_s", 0.0),  # weight push into an engine
            "time/grade_s": t_grade - t_sample,
            "time/train_s": t_train - t_advice,  # forward_backward + optimizer + packing
            "time/forward_backward_s": train_stats["forward_backward_s"],
            "time/optimizer_s": train_stats["optimizer_s"],
        }
        return StepResult(metrics, rewards_QG, skipped)

    @property
    def checks_sync(self) -> bool:
        """Rollouts come from an engine holding a copy of the weights: compare its log-probs."""
        return self.cfg.sync_tolerance is not None and not isinstance(self.generator, HFGenerator)

    def update(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], adv_B: torch.Tensor,
               sampled_logprobs: list[list[float]] | None = None,
               advised_prompt_ids: list[list[int] | None] | None = None,
               token_adv: list[list[float]] | None = None) -> dict:
        """One policy-gradient step on given rollouts and advantages (students: per-question RLOO;
        the teacher: its dataset's A_k on every rollout). Skips the optimiser step when every
        advantage is 0 and ``skip_zero_adv`` and no rollout is distilled; the schedule advances either
        way. With the engine's ``sampled_logprobs``, a mean per-token gap above ``sync_tolerance``
        raises ``SyncError``. ``advised_prompt_ids``: per rollout, the advice-conditioned prompt the
        distillation teacher scores the same completion under (None: that rollout is not distilled).
        ``token_adv``: per rollout, one advantage per completion token, in place of ``adv_B``'s one per rollout
        (a team's per-token credit, ``soar.team.credit``)."""
        advised = advised_prompt_ids is not None and any(t is not None for t in advised_prompt_ids)
        zero = bool((adv_B == 0).all()) if token_adv is None else all(x == 0 for v in token_adv for x in v)
        skipped = self.cfg.skip_zero_adv and zero and not advised
        stats = {"pg_loss": 0.0, "kl": 0.0, "grad_norm": 0.0, "distill_kl": 0.0,
                 "advised_frac": 0.0 if advised_prompt_ids is None else
                 sum(t is not None for t in advised_prompt_ids) / max(len(advised_prompt_ids), 1)}
        t0 = time.perf_counter()
        if not skipped:
            stats = self.accumulate_gradients(prompt_ids, completion_ids, adv_B, sampled_logprobs, advised_prompt_ids,
                                              token_adv)
        t_backward = time.perf_counter()
        if not skipped:
            self.optimizer.step()
            if self.master is not None:
                self.master.copy_to_model()
            self.version += 1
        stats.update(forward_backward_s=t_backward - t0, optimizer_s=time.perf_counter() - t_backward)
        self.optimizer.zero_grad(set_to_none=True)
        stats.update(skipped=skipped, lr=self.scheduler.get_last_lr()[0])
        with warnings.catch_warnings():  # a skipped first step calls the scheduler before the optimiser, on purpose
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()
        self.step_count += 1
        return stats

    def accumulate_gradients(self, prompt_ids, completion_ids, adv_B: torch.Tensor, sampled_logprobs=None,
                             advised_prompt_ids=None, token_adv=None) -> dict:
        """Forward/backward in micro-batches; the loss is normalised by a whole-batch constant so
        the accumulated gradient equals the full-batch gradient whatever ``micro_batch_size`` is.
        The sync check reuses the forward pass the loss needs anyway. With ``advised_prompt_ids``, each
        distilled rollout's tokens also weigh ``distill_token_weights`` and the RLOO advantages
        ``distill.rl_coef``."""
        cfg, n = self.cfg, len(completion_ids)
        n_tokens = sum(len(c) for c in completion_ids)
        normaliser = float(n if cfg.loss_norm == "sequence" else max(n_tokens, 1))
        pg_total, kl_total, sync_gap = 0.0, 0.0, 0.0
        distill_total, advised_tokens = 0.0, 0
        rl_coef = self.distill.rl_coef if advised_prompt_ids is not None else 1.0
        self.model.train()
        device = self.model.device
        for start in range(0, n, cfg.micro_batch_size):
            sl = slice(start, start + cfg.micro_batch_size)
            ids, attn, mask = (t.to(device) for t in pack_sequences(prompt_ids[sl], completion_ids[sl],
                                                                    self.tokenizer.pad_token_id))
            ref_logp = self.reference_logprobs(ids, attn) if cfg.kl_coef > 0 else None
            # The policy is the one sampled: softmax(logits / temperature) (the KL's reference likewise).
            logp, raw_logp = token_logprobs(self.model, ids, attn, cfg.temperature, raw=True)
            if sampled_logprobs is not None:  # engines return T = 1 log-probs of the sampled tokens
                engine = pack_completion_values(prompt_ids[sl], sampled_logprobs[sl], ids.shape[1]).to(device)
                sync_gap += ((raw_logp - engine).abs() * mask).sum().item()
            if token_adv is None:
                pg_weight = rl_coef * adv_B[sl].to(device)[:, None] * mask
            else:
                pg_weight = rl_coef * pack_completion_values(prompt_ids[sl], token_adv[sl], ids.shape[1]).to(device) * mask
            if advised_prompt_ids is not None:
                distill_teacher_logp, advised_mask = self.distill_teacher_logprobs(
                    advised_prompt_ids[sl], completion_ids[sl], prompt_ids[sl], ids.shape[1])
                distill_teacher_logp, advised_mask = distill_teacher_logp.to(device), advised_mask.to(device)
                pg_weight = pg_weight + distill_token_weights(logp, distill_teacher_logp, advised_mask, self.distill.coef)
                distill_total += ((logp.detach() - distill_teacher_logp) * advised_mask).sum().item()
                advised_tokens += int(advised_mask.sum().item())
            loss, pg, kl_sum = weighted_rloo_loss(logp, ref_logp, pg_weight, mask, cfg.kl_coef, normaliser)
            if not torch.isfinite(loss):
                raise FloatingPointError(non_finite_loss(self.role, self.step_count, cfg.lr))
            loss.backward()
            pg_total += pg.item()
            kl_total += kl_sum.item()
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm).item()
        stats = {"pg_loss": pg_total, "kl": kl_total / max(n_tokens, 1), "grad_norm": grad_norm}
        if advised_prompt_ids is not None:
            stats["distill_kl"] = distill_total / max(advised_tokens, 1)  # mean log pi - log pi_teacher per token
            stats["advised_frac"] = sum(t is not None for t in advised_prompt_ids) / max(n, 1)
        if sampled_logprobs is not None:
            stats["sync_logprob_gap"] = sync_gap / max(n_tokens, 1)
            if stats["sync_logprob_gap"] > cfg.sync_tolerance:
                raise SyncError(f"{self.role} step {self.step_count}: the engine's log-probs of its sampled tokens differ "
                                f"from the trainer's by {stats['sync_logprob_gap']:.4g} per token (> {self.role}."
                                f"sync_tolerance={cfg.sync_tolerance}): the engine is serving stale weights")
        return stats

    @torch.no_grad()
    def reference_logprobs(self, ids, attn):
        if self.ref_model is not None:
            return token_logprobs(self.ref_model, ids, attn, self.cfg.temperature)
        if self.cfg.lora.r > 0:
            with self.model.disable_adapter():
                return token_logprobs(self.model, ids, attn, self.cfg.temperature)
        raise ValueError("kl_coef > 0 and a frozen distillation teacher need a reference model (full fine-tuning) or LoRA")

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, problems, max_tokens: int | None = None, samples: int = 0, seed: int = 0, generator=None,
                 metric: str = "accuracy", gold_completion: str = "", temperature: float = 1.0) -> list[float]:
        """Per problem: correctness (``metric`` accuracy: greedy, or mean over ``samples`` samples at
        ``temperature``) or a gold metric's score (``soar.policy.scores.REWARD_METRICS``), cached per model version;
        ``generator`` (the eval role's) serves the current weights, else the rollout generator."""
        key_src = "\x00".join(f"{p.id}\x01{p.question}\x01{p.answer}" for p in problems)
        settings = f"{max_tokens}\x02{samples}\x02{seed}\x02{temperature}\x02{metric}{gold_completion}"
        key = (self.version, hashlib.sha256(f"{settings}\x02{key_src}".encode()).hexdigest())
        if key not in self._eval_cache:
            self._eval_cache[key] = score(metric, gold_measures(
                self.model, self.tokenizer, problems, self.template, gold_completion,
                lambda: correctness(self.sampler(generator), self.grader, problems, self.template,
                                    max_tokens or self.cfg.max_tokens, tuple(self.cfg.stop), samples, seed, temperature)))
        return self._eval_cache[key]

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The trainable weights (their fp32 master copies under mixed precision, so a resume continues
        from exactly the weights AdamW holds, not their bf16 rounding), optimiser, schedule, counters."""
        master = self.master.by_param() if self.master is not None else {}
        trainable = {k: master.get(id(v), v).detach().clone() for k, v in self.model.named_parameters() if v.requires_grad}
        return {"trainable": trainable, "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "step": self.step_count, "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        named = dict(self.model.named_parameters())
        master = self.master.by_param() if self.master is not None else {}
        with torch.no_grad():
            for k, v in state["trainable"].items():
                named[k].copy_(v)  # the model's dtype: the rounding of the master copy
                if id(named[k]) in master:
                    master[id(named[k])].copy_(v)  # fp32 as saved (a checkpoint without master copies: the weights)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step_count, self.version = state["step"], state["version"]

    def export_model(self):
        """A standalone copy of the current policy (LoRA merged into a copy of the base)."""
        return export_policy(self.model)

    def save_pretrained(self, out_dir) -> None:
        """HF-format model (LoRA merged into a copy) plus the adapter itself when LoRA was used."""
        save_policy(self.model, self.tokenizer, out_dir)
