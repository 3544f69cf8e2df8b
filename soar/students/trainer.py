"""Single-student RLOO trainer: the paper's student recipe (§1.3), usable on its own.

    soar-rl model.path=PATH data=custom data.path=train.jsonl data.grader=integer \
        student.max_steps=20 run.name=my_rl

Per step: pick ``questions_per_step`` questions (shuffled per epoch from the seed, without
replacement, wrapping), sample ``group_size`` completions each, grade with the shaped reward,
RLOO advantages within each group, policy gradient + k3 KL to the reference, AdamW + cosine decay.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import logging
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from soar.data import load_problems, render_prompt
from soar.generation import HFGenerator, SamplingParams, correctness, correctness_request, grade_correctness  # noqa: F401
from soar.grading import make_grader
from soar.models import export_policy, is_peft, load_model, load_trainer_state, save_policy  # noqa: F401  (is_peft: re-exported)
from soar.run import MetricsLogger
from soar.seeding import derive_seed
from soar.stage import setup_stage
from soar.students.rloo import pack_completion_values, pack_sequences, rloo_advantages, rloo_loss, token_logprobs
from soar.tokens import encode_prompts

log = logging.getLogger("soar.students")


def batch_indices(n_items: int, step: int, per_step: int, seed: int) -> list[int]:
    """Indices for ``step``: epochs of seeded permutations, read without replacement, wrapping."""
    out = []
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, offset = divmod(pos, n_items)
        perm = np.random.default_rng(derive_seed(seed, "batch_order", epoch)).permutation(n_items)
        out.append(int(perm[offset]))
    return out


def gold_completion_ids(tokenizer, problems, gold_template: str) -> list[list[int]]:
    """Each problem's gold completion (``gold_template`` with ``{answer}`` filled in) as token ids."""
    return [tokenizer(gold_template.replace("{answer}", p.answer), add_special_tokens=False).input_ids for p in problems]


@torch.no_grad()
def gold_logprobs(model, tokenizer, problems, template: str, gold_template: str, batch_size: int = 256) -> list[float]:
    """Per problem: log p(gold completion | prompt), summed over the gold completion's tokens, where
    the gold completion is ``gold_template`` with ``{answer}`` filled in (e.g. ``\\boxed{{answer}}``).
    exp() of it is the probability that one T=1 sample starts with exactly the gold answer: the
    expected sampled accuracy without sampling noise, and non-zero where greedy accuracy is 0."""
    prompt_ids = encode_prompts(tokenizer, [render_prompt(template, p.question) for p in problems])  # BOS as sampled
    gold_ids = gold_completion_ids(tokenizer, problems, gold_template)
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(problems), batch_size):
        sl = slice(start, start + batch_size)
        ids, attn, mask = (t.to(model.device) for t in pack_sequences(prompt_ids[sl], gold_ids[sl], tokenizer.pad_token_id))
        out += (token_logprobs(model, ids, attn) * mask).sum(-1).tolist()
    model.train(was_training)
    return out


GOLD_METRICS = ("gold_prob", "gold_logprob")
"""``inner.reward_metric`` values scored from log p(gold completion) instead of generated answers."""


def gold_scores(model, tokenizer, problems, template: str, metric: str, gold_completion: str) -> list[float]:
    """Per problem, from ``gold_logprobs``: ``gold_prob``, its exp (the probability that a T=1 sample
    starts with the gold answer: the expected sampled correctness, exact and without sampling noise);
    ``gold_logprob``, the log-probability itself (nats; still graded where that probability is ~0)."""
    logprobs = gold_logprobs(model, tokenizer, problems, template, gold_completion)
    return np.exp(logprobs).tolist() if metric == "gold_prob" else logprobs


def problem_scores(metric: str, model, tokenizer, generator, grader, problems, template: str, student_cfg, inner_cfg,
                   seed: int) -> list[float]:
    """Per problem, in ``metric``'s units: correctness for ``accuracy`` (greedy, or the mean over
    ``inner_cfg.accuracy_samples`` samples from ``generator``, pointed at ``model``), else a
    ``GOLD_METRICS`` score (``gold_scores``)."""
    if metric in GOLD_METRICS:
        return gold_scores(model, tokenizer, problems, template, metric, inner_cfg.gold_completion)
    generator.sync_weights(model)
    return correctness(generator, grader, problems, template, student_cfg.eval_max_tokens or student_cfg.max_tokens,
                       tuple(student_cfg.stop), inner_cfg.accuracy_samples, seed)


@dataclass
class StepResult:
    metrics: dict
    rewards_QG: torch.Tensor
    skipped: bool


class SyncError(RuntimeError):
    """The engine that sampled the rollouts does not hold the trainer's weights."""


def cosine_schedule(optimizer, policy_cfg, steps: int | None = None):
    """The policy's learning-rate schedule: linear warm-up, then cosine decay to ``min_lr_ratio`` over
    ``steps`` (default ``max_steps``; ``transformers``' ``cosine_with_min_lr``)."""
    from transformers import get_scheduler

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


def grade_rollouts(grader, problems, samples_QG) -> tuple[list, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grades, shaped rewards (Q, G), correctness (Q, G) and RLOO advantages (Q, G) of one step's rollouts."""
    group_size = len(samples_QG[0])
    grades = grader.grade_batch([s.text for group in samples_QG for s in group],
                                [p.answer for p in problems for _ in range(group_size)])
    rewards_QG = torch.tensor([g.reward for g in grades], dtype=torch.float32).view(len(problems), -1)
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


class RLOOTrainer:
    """Owns a policy (full model or peft LoRA), its reference, optimiser and schedule."""

    def __init__(self, model, tokenizer, grader, student_cfg, prompt_template: str, seed: int,
                 ref_model=None, batch_size: int = 256, role: str = "student", generator=None):
        self.cfg, self.tokenizer, self.grader, self.role = student_cfg, tokenizer, grader, role
        self.template, self.seed = prompt_template, seed
        if student_cfg.lora.r > 0:
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(derive_seed(seed, "lora_init"))
            lora = student_cfg.lora
            model = get_peft_model(model, LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
                autocast_adapter_dtype=lora.autocast_adapter_dtype)
            ref_model = None  # the reference is the same weights with the adapter disabled
        elif ref_model is not None:
            ref_model.eval().requires_grad_(False)
        if student_cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model, self.ref_model = model, ref_model
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.master = MasterWeights(params) if student_cfg.precision == "mixed" else None
        self.params = self.master.optimizer_params if self.master is not None else params
        """What AdamW updates: the fp32 master copies (and any fp32 trainable weights) or the model's own."""
        self.optimizer = torch.optim.AdamW(self.params, lr=student_cfg.lr, betas=tuple(student_cfg.adam_betas),
                                           weight_decay=student_cfg.weight_decay)
        self.scheduler = cosine_schedule(self.optimizer, student_cfg)
        # Rollouts: the given generator (e.g. a shared vLLM one) re-targeted at this policy, or HF.
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
        cfg, t0 = self.cfg, time.perf_counter()
        prompts, params = self.rollout_request(problems)
        if samples_QG is None:
            samples_QG = self.sampler().generate(prompts, params)
        else:
            t0 -= sample_s
        t_sample = time.perf_counter()
        grades, rewards_QG, correct_QG, adv_QG = grade_rollouts(self.grader, problems, samples_QG)
        t_grade = time.perf_counter()

        prompt_ids = encode_prompts(self.tokenizer, prompts)  # the ids the rollouts were conditioned on
        train_stats = self.update([prompt_ids[q] for q in range(len(problems)) for _ in range(cfg.group_size)],
                                  [s.token_ids for group in samples_QG for s in group], adv_QG.flatten(),
                                  [s.logprobs for group in samples_QG for s in group] if self.checks_sync else None)
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
            "time/sample_s": t_sample - t0,  # includes time/sync_s
            "time/sync_s": getattr(self.generator, "last_sync_s", 0.0),  # weight push into an engine
            "time/grade_s": t_grade - t_sample,
            "time/train_s": t_train - t_grade,  # forward_backward + optimizer + packing
            "time/forward_backward_s": train_stats["forward_backward_s"],
            "time/optimizer_s": train_stats["optimizer_s"],
        }
        return StepResult(metrics, rewards_QG, skipped)

    @property
    def checks_sync(self) -> bool:
        """Rollouts come from an engine holding a copy of the weights: compare its log-probs."""
        return self.cfg.sync_tolerance is not None and not isinstance(self.generator, HFGenerator)

    def update(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], adv_B: torch.Tensor,
               sampled_logprobs: list[list[float]] | None = None) -> dict:
        """One policy-gradient step on given rollouts and advantages (students: per-question RLOO;
        the teacher: its dataset's A_k on every rollout). Skips the optimiser step when every
        advantage is 0 and ``skip_zero_adv``; the schedule advances either way. With the engine's
        ``sampled_logprobs``, a mean per-token gap above ``sync_tolerance`` raises ``SyncError``."""
        skipped = self.cfg.skip_zero_adv and bool((adv_B == 0).all())
        stats = {"pg_loss": 0.0, "kl": 0.0, "grad_norm": 0.0}
        t0 = time.perf_counter()
        if not skipped:
            stats = self.accumulate_gradients(prompt_ids, completion_ids, adv_B, sampled_logprobs)
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

    def accumulate_gradients(self, prompt_ids, completion_ids, adv_B: torch.Tensor, sampled_logprobs=None) -> dict:
        """Forward/backward in micro-batches; the loss is normalised by a whole-batch constant so
        the accumulated gradient equals the full-batch gradient whatever ``micro_batch_size`` is.
        The sync check reuses the forward pass the loss needs anyway."""
        cfg, n = self.cfg, len(completion_ids)
        n_tokens = sum(len(c) for c in completion_ids)
        normaliser = float(n if cfg.loss_norm == "sequence" else max(n_tokens, 1))
        pg_total, kl_total, sync_gap = 0.0, 0.0, 0.0
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
            loss, pg, kl_sum = rloo_loss(logp, ref_logp, mask, adv_B[sl].to(device), cfg.kl_coef, normaliser)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite {self.role} loss at its step {self.step_count}")
            loss.backward()
            pg_total += pg.item()
            kl_total += kl_sum.item()
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm).item()
        stats = {"pg_loss": pg_total, "kl": kl_total / max(n_tokens, 1), "grad_norm": grad_norm}
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
        raise ValueError("kl_coef > 0 needs a reference model (full fine-tuning) or LoRA")

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, problems, max_tokens: int | None = None, samples: int = 0, seed: int = 0,
                 generator=None, metric: str = "accuracy", gold_completion: str = "") -> list[float]:
        """Per problem: correctness (``metric`` accuracy: greedy, or mean over ``samples`` samples) or a
        ``GOLD_METRICS`` score (``gold_scores``), cached per model version; ``generator`` (the eval
        role's) serves the current weights, else the rollout generator."""
        key_src = "\x00".join(f"{p.id}\x01{p.question}\x01{p.answer}" for p in problems)
        key = (self.version, hashlib.sha256(f"{max_tokens}\x02{samples}\x02{seed}\x02{metric}{gold_completion}\x02{key_src}"
                                            .encode()).hexdigest())
        if key not in self._eval_cache:
            if metric in GOLD_METRICS:
                self._eval_cache[key] = gold_scores(self.model, self.tokenizer, problems, self.template, metric,
                                                    gold_completion)
            else:
                self._eval_cache[key] = correctness(self.sampler(generator), self.grader, problems, self.template,
                                                    max_tokens or self.cfg.max_tokens, tuple(self.cfg.stop), samples, seed)
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


@dataclass
class StudentResult:
    correct: dict[str, list[float]]
    """Score per problem of each evaluation set after training: correctness (greedy: 0/1), or the
    ``GOLD_METRICS`` score the run's ``inner.reward_metric`` asks for."""
    accuracy: dict[str, float]
    """Mean of ``correct`` per evaluation set."""
    history: list[dict]
    """Per-step trainer metrics."""
    trainer: "RLOOTrainer"
    """The trained student (kept until the caller decides, e.g. promotion); with the Ray pool a
    ``soar.students.pool.RemoteStudent`` standing in for it (same ``sampler``/``export_model``/``save_pretrained``)."""
    worker: dict | None = None
    """Where it ran: ``pid``, ``node_id``, ``worker`` (pool slot; None in-process), ``attempts``."""


def sharing_copy(baseline):
    """A copy of ``baseline``'s modules holding the *same* weight tensors (parameters and buffers),
    for a LoRA student: peft wraps the copy's layers with the student's adapter and freezes the shared
    base, so the g*r students of a step (and those kept until the promotion decision) hold one base
    between them plus an adapter each, instead of a deep copy each (~6.4 GB per student at 3B in
    bf16). Only adapters may train on it; a student is exported by merging into a deep copy
    (``export_policy``), never into the shared base. The baseline's parameters are left frozen."""
    memo = {id(t): t for t in itertools.chain(baseline.parameters(), baseline.buffers())}
    return copy.deepcopy(baseline, memo)


def train_student(baseline, tokenizer, grader, problems, student_cfg, prompt_template: str, seed: int,
                  eval_sets: dict | None = None, eval_samples: int = 0, batch_size: int = 256,
                  rollout_generator=None, eval_generator=None, metric: str = "accuracy",
                  gold_completion: str = "") -> StudentResult:
    """One inner loop: a copy of ``baseline`` trained ``max_steps`` RLOO steps on ``problems``
    (fresh optimiser, KL to the baseline itself, which serves as the frozen reference), then scored
    on each of ``eval_sets`` by ``metric`` (accuracy: greedy, or ``eval_samples`` samples per
    question; or a ``GOLD_METRICS`` score).
    Generators default to HF on the student's weights."""
    if student_cfg.lora.r > 0:
        model = sharing_copy(baseline)
    else:
        model = copy.deepcopy(baseline).requires_grad_(True)  # the baseline is frozen as a reference below
    ref = baseline if student_cfg.lora.r == 0 and student_cfg.kl_coef > 0 else None  # read only: no copy
    trainer = RLOOTrainer(model, tokenizer, grader, student_cfg, prompt_template, seed, ref_model=ref,
                          batch_size=batch_size, generator=rollout_generator)
    history = []
    for step in range(student_cfg.max_steps):
        batch = [problems[i] for i in batch_indices(len(problems), step, student_cfg.questions_per_step, seed)]
        history.append(trainer.step(batch).metrics)
    correct = {name: trainer.evaluate(probs, student_cfg.eval_max_tokens, eval_samples, derive_seed(seed, "eval"),
                                      eval_generator, metric, gold_completion)
               for name, probs in (eval_sets or {}).items()}
    return StudentResult(correct, {k: float(np.mean(v)) for k, v in correct.items()}, history, trainer)


def run_rl(cfg) -> dict:
    """The ``soar-rl`` stage: train one student on a question file, with resume and metrics."""
    s = cfg.student

    def read_questions(stage):  # before the run dir is written
        problems = load_problems(cfg.data)
        eval_problems = load_problems(cfg.data, cfg.data.eval_path) if cfg.data.eval_path else []
        prompts = [render_prompt(cfg.data.prompt_template, p.question) for p in problems + eval_problems]
        stage.check_prompts(prompts, max(s.max_tokens, s.eval_max_tokens or 0), "student.max_tokens",
                            [p.id for p in problems + eval_problems])
        return problems, eval_problems

    stage = setup_stage(cfg, "rl", prepare=read_questions)
    run, tokenizer, model = stage.run, stage.tokenizer, stage.model
    try:
        problems, eval_problems = stage.prepared
        ref = load_model(cfg.model) if s.lora.r == 0 and s.kl_coef > 0 else None
        trainer = RLOOTrainer(model, tokenizer, make_grader(cfg.data.grader), s, cfg.data.prompt_template,
                              cfg.seed, ref_model=ref, batch_size=cfg.backend.batch_size)
        start = 0
        if run.resume_from is not None:
            trainer.load_state_dict(load_trainer_state(run.resume_from / "state.pt"))
            start = trainer.step_count
            log.info("resumed from %s (step %d)", run.resume_from, start)
        metrics_log = MetricsLogger(run, resume_step=start if run.resume_from is not None else None)

        def eval_metrics() -> dict:
            return {"eval/accuracy": float(np.mean(trainer.evaluate(eval_problems, s.eval_max_tokens)))}

        if eval_problems and start == 0:
            metrics_log.log(0, eval_metrics())
        bar = tqdm(range(start, s.max_steps), desc="soar-rl", initial=start, total=s.max_steps,
                   disable=not cfg.run.progress, unit="step")
        last = {}
        for step in bar:
            batch = [problems[i] for i in batch_indices(len(problems), step, s.questions_per_step, cfg.seed)]
            trainer.grader.reset_stats()  # grading/* metrics are per step
            result = trainer.step(batch)
            last = dict(result.metrics)
            last.update(trainer.grader.stats.as_metrics())
            done = step + 1
            if eval_problems and s.eval_every and done % s.eval_every == 0 and done < s.max_steps:
                last.update(eval_metrics())
            if eval_problems and done == s.max_steps:
                last.update(eval_metrics())
            metrics_log.log(done, last)
            bar.set_postfix(reward=f"{last['student/reward_mean']:.1f}", acc=f"{last['student/accuracy']:.2f}")
            if done % s.save_every == 0 or done == s.max_steps:
                with run.checkpoint(done) as ckpt:
                    torch.save(trainer.state_dict(), ckpt / "state.pt")
        final = run.path / "final"
        trainer.save_pretrained(final)
        summary = {"steps": s.max_steps, "final_dir": str(final), "last": last}
        (run.path / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        metrics_log.close()
        return summary
    finally:
        stage.close()
