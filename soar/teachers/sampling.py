"""Teacher rejection sampling (paper §2): sample completions until ``count`` parse into valid
(question, answer) pairs; the first ``count`` valid ones, in order, form the g datasets.
Rejected completions get no reward and no gradient (Proposition 1: with RLOO's zero-sum
advantages this leaves the gradient unchanged)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from soar.generation import SamplingParams
from soar.seeding import derive_seed
from soar.teachers.parse import REJECT_REASONS, Pair


@dataclass
class Rollout:
    question: str
    answer: str
    text: str
    """The whole completion (text outside the tags was sampled too, and is trained on)."""
    token_ids: list[int]
    logprobs: list[float] | None = None
    """The sampler's log-probs of ``token_ids`` (engine rollouts: for the weight-sync check)."""


class RejectionCapError(RuntimeError):
    pass


def sample_valid(generator, prompt: str, count: int, params: SamplingParams, parse, batch: int,
                 max_attempts: int, seed: int, step: int) -> tuple[list[Rollout], dict]:
    """``parse(text) -> Pair | Reject``. Returns ``count`` rollouts and ``teacher/…`` metrics."""
    rollouts: list[Rollout] = []
    reasons: Counter = Counter()
    attempts, round_ = 0, 0
    while len(rollouts) < count:
        if attempts >= max_attempts:
            raise RejectionCapError(
                f"teacher rejection sampling hit its cap (the teacher after {step} outer steps): {len(rollouts)}/{attempts} "
                f"completions valid ({len(rollouts) / max(attempts, 1):.1%}), {count} needed; rejects: "
                f"{dict(reasons)}. Raise teacher.max_attempts_factor or check teacher.prompt / max_tokens.")
        n = min(batch, max_attempts - attempts)
        outs = generator.generate([prompt], SamplingParams(
            n=n, temperature=params.temperature, max_tokens=params.max_tokens, stop=params.stop,
            seed=derive_seed(seed, "teacher_sample", step, round_), logprobs=params.logprobs))[0]
        attempts, round_ = attempts + n, round_ + 1
        for s in outs:
            parsed = parse(s.text)
            if isinstance(parsed, Pair):
                if len(rollouts) < count:
                    rollouts.append(Rollout(parsed.question, parsed.answer, s.text, list(s.token_ids), s.logprobs))
            else:
                reasons[parsed.reason] += 1
    metrics = {"teacher/valid_frac": (attempts - sum(reasons.values())) / attempts, "teacher/attempts": attempts,
               "teacher/sample_rounds": round_}
    metrics.update({f"teacher/reject/{r}": reasons[r] / attempts for r in REJECT_REASONS})
    return rollouts, metrics
