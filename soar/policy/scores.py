"""How a model is scored on problems: correctness of its generated answers, or a gold metric from the
log-probability of each gold completion; ``REWARD_METRICS`` is the registry of ``inner.reward_metric``.
The students' rewards, the baseline's scores and a trainer's ``evaluate`` all score through here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from soar.data import render_prompt
from soar.generation import correctness
from soar.policy.rloo import pack_sequences, token_logprobs
from soar.tokens import encode_prompts


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


@dataclass(frozen=True)
class RewardMetric:
    """What ``inner.reward_metric`` scores a model by on each problem; a student's reward R_{k,j} is its
    mean score on Q_R minus the baseline's."""

    uses_gold: bool = False
    """Scored from each problem's log p(gold completion | prompt) (``gold_logprobs``: one forward pass,
    nothing generated); False: generated answers graded (``correctness``)."""
    probability: bool = False
    """A gold metric's score is exp of that log-probability, in [0, 1]; False: the log-probability (nats)."""

    @property
    def bounded(self) -> bool:
        """Scores lie in [0, 1], so rewards lie in [-1, 1] (``soar.validation`` checks ``promotion.tau``
        against that)."""
        return not self.uses_gold or self.probability


REWARD_METRICS: dict[str, RewardMetric] = {
    # the paper: greedy correctness, or the mean over inner.accuracy_samples samples
    "accuracy": RewardMetric(),
    # the probability that a T=1 sample starts with the gold answer: the expected sampled correctness,
    # exact and without sampling noise
    "gold_prob": RewardMetric(uses_gold=True, probability=True),
    # the log-probability itself (nats): still graded where that probability is ~0
    "gold_logprob": RewardMetric(uses_gold=True),
}
"""``inner.reward_metric`` values; the scorers (``problem_scores``, ``RLOOTrainer.evaluate``, the
lockstep and stacked students) and ``soar.validation`` read it."""


def gold_scores(model, tokenizer, problems, template: str, metric: str, gold_completion: str) -> list[float]:
    """Per problem, a gold metric's score (``REWARD_METRICS``) from ``gold_logprobs``."""
    logprobs = gold_logprobs(model, tokenizer, problems, template, gold_completion)
    return np.exp(logprobs).tolist() if REWARD_METRICS[metric].probability else logprobs


def problem_scores(metric: str, model, tokenizer, generator, grader, problems, template: str, student_cfg, inner_cfg,
                   seed: int) -> list[float]:
    """Per problem, in ``metric``'s units: correctness for ``accuracy`` (greedy, or the mean over
    ``inner_cfg.accuracy_samples`` samples from ``generator``, pointed at ``model``), else a
    gold metric's score (``gold_scores``)."""
    if REWARD_METRICS[metric].uses_gold:
        return gold_scores(model, tokenizer, problems, template, metric, inner_cfg.gold_completion)
    generator.sync_weights(model)
    return correctness(generator, grader, problems, template, student_cfg.eval_max_tokens or student_cfg.max_tokens,
                       tuple(student_cfg.stop), inner_cfg.accuracy_samples, seed)
