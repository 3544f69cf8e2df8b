"""The teacher as a policy: rejection-sampled datasets out, set-level RLOO update in (paper §1.2).

Every rollout of dataset k gets the advantage A_k = R_k - mean_{l != k} R_l of its group. The
loss is the sum of token log-probs over the **whole completion** times A_k, divided by one
constant (the number of rollouts, g*n per group): a per-sequence length mean would break
Proposition 1. KL is a separate k3 term to the initial teacher (LoRA: the adapter disabled).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from soar.data import render_prompt
from soar.generation import SamplingParams, make_generator
from soar.policy.rloo import rloo_advantages
from soar.policy.trainer import RLOOTrainer
from soar.teachers.parse import Reject, parse_pair
from soar.teachers.prompts import TeacherFormat
from soar.teachers.sampling import Rollout, sample_valid
from soar.tokens import encode_prompt


def dataset_advantages(rewards_K) -> np.ndarray:
    """Leave-one-out advantages over the g datasets of one group."""
    return rloo_advantages(torch.tensor(np.asarray(rewards_K, dtype=np.float64))[None])[0].numpy()


class TeacherPolicy:
    def __init__(self, cfg, model, tokenizer, grader, student_template: str, student_context: int):
        teacher_cfg = cfg.teacher
        ref = copy.deepcopy(model) if teacher_cfg.lora.r == 0 and teacher_cfg.kl_coef > 0 else None
        self.cfg, self.tokenizer, self.grader = cfg, tokenizer, grader
        self.trainer = RLOOTrainer(model, tokenizer, grader, teacher_cfg, "{question}", cfg.seed, ref_model=ref,
                                   batch_size=cfg.backend.batch_size, role="teacher",
                                   generator=make_generator(cfg, "teacher", None, tokenizer))
        self.fmt = TeacherFormat(teacher_cfg.question_tag, teacher_cfg.answer_tag)
        self.student_template, self.student_context = student_template, student_context
        self.prompt_ids = encode_prompt(tokenizer, teacher_cfg.prompt)  # the ids the teacher samples from

    def parse(self, text: str):
        pair = parse_pair(text, self.fmt, answer_ok=self.grader.parseable)
        if isinstance(pair, Reject):
            return pair
        prompt_len = len(encode_prompt(self.tokenizer, render_prompt(self.student_template, pair.question)))
        if prompt_len + self.cfg.student.max_tokens > self.student_context:
            return Reject("question_too_long")
        return pair

    def sample(self, step: int) -> tuple[list[list[list[Rollout]]], dict]:
        """Rollouts split in order into groups x g datasets x n questions, and sampling metrics."""
        teacher_cfg = self.cfg.teacher
        per_group = teacher_cfg.datasets * teacher_cfg.questions_per_dataset
        count = per_group * teacher_cfg.groups_per_step
        params = SamplingParams(temperature=teacher_cfg.temperature, max_tokens=teacher_cfg.max_tokens,
                                stop=tuple(teacher_cfg.stop), logprobs=self.trainer.checks_sync)
        rollouts, metrics = sample_valid(self.trainer.sampler(), teacher_cfg.prompt, count, params, self.parse,
                                         teacher_cfg.sample_batch or count, int(teacher_cfg.max_attempts_factor * count),
                                         self.cfg.seed, step)
        n = teacher_cfg.questions_per_dataset
        groups = [[rollouts[g * per_group + k * n: g * per_group + (k + 1) * n] for k in range(teacher_cfg.datasets)]
                  for g in range(teacher_cfg.groups_per_step)]
        metrics["teacher/completion_tokens_mean"] = float(np.mean([len(r.token_ids) for r in rollouts]))
        metrics["compute/teacher_tokens"] = float(sum(len(r.token_ids) for r in rollouts))
        return groups, metrics

    def update(self, groups, advantages_JK) -> dict:
        """One optimiser step; A_k on every rollout of dataset k."""
        completions, adv, logprobs = [], [], []
        for datasets, adv_K in zip(groups, advantages_JK):
            for dataset, a in zip(datasets, adv_K):
                completions += [r.token_ids for r in dataset]
                logprobs += [r.logprobs for r in dataset]
                adv += [float(a)] * len(dataset)
        stats = self.trainer.update([self.prompt_ids] * len(completions), completions, torch.tensor(adv),
                                    logprobs if self.trainer.checks_sync else None)
        return {"teacher/pg_loss": stats["pg_loss"], "teacher/kl": stats["kl"], "teacher/grad_norm": stats["grad_norm"],
                "teacher/lr": stats["lr"], "teacher/skipped_zero_adv": int(stats["skipped"]),
                **({"teacher/sync_logprob_gap": stats["sync_logprob_gap"]} if "sync_logprob_gap" in stats else {})}
