"""How a model is scored on problems: correctness of its generated answers, or a gold metric from the
log-probability of each gold completion; ``REWARD_METRICS`` is the registry of ``inner.reward_metric``:
pure functions from what a scorer measures (``Measures``) to per-problem scores. The students' rewards,
the baseline's scores and a trainer's ``evaluate`` all score through ``score``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from soar.data import render_prompt
from soar.generation import correctness, make_generator
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
class Measures:
    """What a reward metric may read of one model (or a stack of them) on some problems, each computed by
    the caller's own means only when a metric reads it: a scorer offers both and the metric picks."""

    correctness: Callable[[], Any]
    """Per problem, its generated answers graded (``correctness``: greedy, or the mean over samples)."""
    gold_logprobs: Callable[[], Any]
    """Per problem, log p(gold completion | prompt) (``gold_logprobs``: one forward pass, nothing generated)."""


def exp(logprobs):
    """exp in the log-probs' own arithmetic: a tensor's (the stacked students' float32), else numpy's float64."""
    return logprobs.exp() if isinstance(logprobs, torch.Tensor) else np.exp(logprobs)


@dataclass(frozen=True)
class RewardMetric:
    """What ``inner.reward_metric`` scores a model by on each problem; a student's reward R_{k,j} is its
    mean score on Q_R minus the baseline's."""

    score: Callable[[Measures], Any]
    """Per problem, its score from what the metric reads of ``Measures``."""
    reads_gold: bool
    """Reads the gold completion (``soar.validation`` checks that ``inner.gold_completion`` holds ``{answer}``)."""
    bounded: bool
    """Scores lie in [0, 1], so rewards lie in [-1, 1] (``soar.validation`` checks ``promotion.tau`` against that)."""


def accuracy_score(m: Measures):
    """The paper's: greedy correctness, or the mean over ``inner.accuracy_samples`` samples."""
    return m.correctness()


def gold_prob_score(m: Measures):
    """The probability that a T=1 sample starts with the gold answer: the expected sampled correctness,
    exact and without sampling noise."""
    return exp(m.gold_logprobs())


def gold_logprob_score(m: Measures):
    """The gold log-probability itself (nats): still graded where that probability is ~0."""
    return m.gold_logprobs()


REWARD_METRICS: dict[str, RewardMetric] = {
    "accuracy": RewardMetric(accuracy_score, reads_gold=False, bounded=True),
    "gold_prob": RewardMetric(gold_prob_score, reads_gold=True, bounded=True),
    "gold_logprob": RewardMetric(gold_logprob_score, reads_gold=True, bounded=False),
}
"""``inner.reward_metric`` -> its scoring function of ``Measures`` and what ``soar.validation`` checks (``reads_gold``,
``bounded``). Every scorer (``problem_scores``, ``RLOOTrainer.evaluate``, the lockstep and stacked students)
scores through ``score``."""


def score(metric: str, measures: Measures) -> list:
    """Per problem (per model and problem, for a stack's measures), ``metric``'s score as Python floats."""
    out = REWARD_METRICS[metric].score(measures)
    return out.tolist() if hasattr(out, "tolist") else out


def gold_measures(model, tokenizer, problems, template: str, gold_completion: str,
                  correctness: Callable[[], Any]) -> Measures:
    """``Measures`` of one HF model: its gold log-probs by ``gold_logprobs``, its correctness by ``correctness``."""
    return Measures(correctness, lambda: gold_logprobs(model, tokenizer, problems, template, gold_completion))


def problem_scores(metric: str, model, tokenizer, generator, grader, problems, template: str, student_cfg, inner_cfg,
                   seed: int) -> list[float]:
    """Per problem, in ``metric``'s units: correctness (greedy, or the mean over
    ``inner_cfg.accuracy_samples`` samples from ``generator``, pointed at ``model``) or the gold
    log-probability of each problem, as ``metric`` reads them."""
    def graded() -> list[float]:
        generator.sync_weights(model)
        return correctness(generator, grader, problems, template, student_cfg.eval_max_tokens or student_cfg.max_tokens,
                           tuple(student_cfg.stop), inner_cfg.accuracy_samples, seed)

    return score(metric, gold_measures(model, tokenizer, problems, template, inner_cfg.gold_completion, graded))


class BaselineScorer:
    """Scores the loop's baseline per problem by ``problem_scores`` on the eval role's generator: the
    layout the students are scored in unless their executor has its own (``soar.students.stacked``)."""

    def __init__(self, cfg, tokenizer, grader, template: str):
        self.cfg, self.tokenizer, self.grader, self.template = cfg, tokenizer, grader, template
        self.baseline_gen = None  # the eval role's, made on first use

    def score_baseline(self, model, problems, metric: str, seed: int) -> list[float]:
        """``model``'s score per problem in ``metric`` (sampled accuracy seeded ``seed``)."""
        if self.baseline_gen is None:
            self.baseline_gen = make_generator(self.cfg, "eval", None, self.tokenizer)
        return problem_scores(metric, model, self.tokenizer, self.baseline_gen, self.grader, problems, self.template,
                              self.cfg.student, self.cfg.inner, seed)
