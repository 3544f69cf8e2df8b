"""Coach-guided on-policy context distillation (``docs/distill.md``) on the RLOO policy: the methods
``soar.policy.trainer.RLOOTrainer`` inherits for it. With ``distill`` (``DistillConfig``) and an ``advisor``
(``soar.coach.Advisor``), the trainer's step has the advice-conditioned distillation teacher score the
rollouts' sampled token ids (``distill_teacher_logprobs``; the loss is
``soar.policy.rloo.distill_token_weights``); ``distill.objective=sft`` is the supervised baseline at the same
budget (``sft_step``), whose targets the distillation teacher samples (``distill_teacher_generator``). The
distillation teacher is the policy's initial (or current) copy given the coach's advice, not SOAR's teacher.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import torch

from soar.generation import HFGenerator
from soar.policy.rloo import StepResult, completion_values, pack_completion_values, pack_sequences, token_logprobs
from soar.tokens import encode_prompts, stop_token_ids


class Distillation:
    """The distillation methods of ``RLOOTrainer`` (its ``cfg``, ``model``, ``ref_model``, ``tokenizer``,
    ``grader``, ``distill``, ``advisor``, ``rollout_request``, ``update`` and ``reference_logprobs``)."""

    def sft_step(self, problems) -> StepResult:
        """``distill.objective=sft``: the coach advises on each question before any attempt, the
        distillation teacher (``distill_teacher_generator``) samples ``group_size`` completions per advised question
        from its advised prompt (the rollouts' seed and sampling parameters: the on-policy arms' budget), and
        the policy takes one ``update`` on them with weight ``distill.coef`` on each correct one and 0 on the
        rest, under its own unadvised prompt: the NLL of the teacher's correct samples. A question whose
        advice is refused gets no samples. Metrics: ``sft/*`` of the teacher's samples (``student/*`` would
        describe rollouts this arm does not have), the update's ``student/*`` and the coach's."""
        cfg, t0 = self.cfg, time.perf_counter()
        prompts, params = self.rollout_request(problems)
        advised_texts, advice_metrics = self.advisor.before_attempts(problems, prompts, self.step_count)
        advised = [q for q, t in enumerate(advised_texts) if t is not None]
        t_advice = time.perf_counter()
        with self.distill_teacher_generator() as generator:
            samples_AG = generator.generate([advised_texts[q] for q in advised], params)
        t_sample = time.perf_counter()
        flat = [s for group in samples_AG for s in group]
        rows = [q for q in advised for _ in range(cfg.group_size)]  # each sample's question
        grades = self.grader.grade_batch([s.text for s in flat], [problems[q].answer for q in rows])
        correct_B = torch.tensor([float(g.correct) for g in grades])
        t_grade = time.perf_counter()
        prompt_ids = encode_prompts(self.tokenizer, prompts)  # the policy's own prompts, without advice
        train_stats = self.update([prompt_ids[q] for q in rows], [s.token_ids for s in flat], self.distill.coef * correct_B)
        t_train = time.perf_counter()
        metrics = {
            "sft/teacher_accuracy": correct_B.mean().item() if len(flat) else 0.0,
            "sft/targets": int(correct_B.sum().item()),
            "sft/samples": len(flat),
            "sft/completion_tokens_mean": float(np.mean([len(s.token_ids) for s in flat])) if flat else 0.0,
            "student/skipped_zero_adv": int(train_stats["skipped"]),
            "student/lr": train_stats["lr"],
            "student/pg_loss": train_stats["pg_loss"],
            "student/kl": train_stats["kl"],
            "student/grad_norm": train_stats["grad_norm"],
            **advice_metrics,
            "time/advice_s": t_advice - t0,
            "time/sample_s": t_sample - t_advice,
            "time/grade_s": t_grade - t_sample,
            "time/train_s": t_train - t_grade,
            "time/forward_backward_s": train_stats["forward_backward_s"],
            "time/optimizer_s": train_stats["optimizer_s"],
        }
        return StepResult(metrics, correct_B.view(len(advised), cfg.group_size), train_stats["skipped"])

    @contextmanager
    def distill_teacher_generator(self):
        """An HF generator of the distillation teacher's samples (``distill.objective=sft``): the initial
        policy (``distill.teacher=frozen``: the reference copy, or this LoRA policy with its adapter disabled
        while it samples) or the current one (``updated``)."""
        if self.distill.teacher == "updated":
            yield HFGenerator(self.model, self.tokenizer, batch_size=self.batch_size)
        elif self.ref_model is not None:
            yield HFGenerator(self.ref_model, self.tokenizer, batch_size=self.batch_size)
        elif self.cfg.lora.r > 0:
            with self.model.disable_adapter():
                yield HFGenerator(self.model, self.tokenizer, batch_size=self.batch_size)
        else:
            raise ValueError("a frozen distillation teacher needs a reference model (full fine-tuning) or LoRA")

    @torch.no_grad()
    def distill_teacher_logprobs(self, advised_prompt_ids, completion_ids, prompt_ids, width: int):
        """The distillation teacher's log-probs of exactly the rollouts' sampled token ids, and the mask of the
        tokens distilled, both laid out like the policy's ``pack_sequences(prompt_ids, completion_ids)``
        (``width`` wide). Row i is scored as ``advised_prompt_ids[i] + completion_ids[i]``: the
        advice-conditioned prompt (BOS once, as ``soar.tokens`` encodes it), then the same completion ids, EOS
        included, right-padded; a row without advice (None) is not distilled, nor is a final stop token
        unless ``distill.stop_token``. ``distill.teacher``: ``frozen`` scores with the initial policy
        (``reference_logprobs``), ``updated`` with the current one, both at the rollouts' temperature."""
        rows = [i for i, t in enumerate(advised_prompt_ids) if t is not None]
        values: list[list[float]] = [[0.0] * len(c) for c in completion_ids]
        scored: list[list[float]] = [[0.0] * len(c) for c in completion_ids]
        if rows:
            t_prompts, t_completions = [advised_prompt_ids[i] for i in rows], [completion_ids[i] for i in rows]
            ids, attn, _ = (t.to(self.model.device) for t in pack_sequences(t_prompts, t_completions,
                                                                            self.tokenizer.pad_token_id))
            if self.distill.teacher == "frozen":
                logp = self.reference_logprobs(ids, attn)
            else:
                logp = token_logprobs(self.model, ids, attn, self.cfg.temperature)
            stops = set(stop_token_ids(self.tokenizer, self.model))
            for i, v in zip(rows, completion_values(logp.float().cpu(), t_prompts, t_completions)):
                c = completion_ids[i]
                values[i] = v
                scored[i] = [1.0] * len(c)
                if c and c[-1] in stops and not self.distill.stop_token:
                    scored[i][-1] = 0.0
        return pack_completion_values(prompt_ids, values, width), pack_completion_values(prompt_ids, scored, width)
