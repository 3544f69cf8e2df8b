"""The students' rollout rewards (``student.reward``): pure functions of one ``soar.grading.Grade``,
registered by name in ``STUDENT_REWARDS``; the trainers (``soar.policy.trainer.grade_rollouts``) reward each
graded rollout through it and ``soar.validation`` checks the name against it.
"""

from __future__ import annotations

from typing import Callable

from soar.grading import Grade

# The recipe of RL on the sometimes-solvable band (docs/band_rl.md): 1 right, 0 wrong, -0.2 for a missing or
# malformed answer box. The penalty keeps a small signal in groups whose correctness is uniform.
FORMAT_CORRECT = 1.0
FORMAT_WRONG = 0.0
FORMAT_MALFORMED = -0.2

STUDENT_REWARDS: dict[str, Callable[[Grade], float]] = {}
"""A graded rollout's reward by ``student.reward`` name, each registered by ``register_student_reward``
beside its rule."""


def register_student_reward(name: str):
    """Decorator: ``student.reward=<name>`` rewards each rollout with ``fn(grade)``."""
    def register(fn: Callable[[Grade], float]) -> Callable[[Grade], float]:
        STUDENT_REWARDS[name] = fn
        return fn
    return register


@register_student_reward("shaped")
def grader_reward(grade: Grade) -> float:
    """The grader's own reward: the paper's 120/20/10/0 (``soar.grading.shaped_reward``) for the built-in graders."""
    return grade.reward


@register_student_reward("format_penalty")
def format_penalty_reward(grade: Grade) -> float:
    """1 correct, 0 wrong, -0.2 when the answer box is missing or malformed, i.e. when the grader finds
    no box (``Grade.boxed`` False): no ``\\boxed``/``\\fbox`` in the completion, a last box whose braces
    never close (e.g. cut off by ``max_tokens``: ``soar.grading.extract_boxed`` is None), or a box holding only
    blanks. The box is soar's answer tag (its prompts ask for one). A well-formed box whose content the
    grader cannot read as an answer is wrong (0), not malformed."""
    if grade.correct:
        return FORMAT_CORRECT
    return FORMAT_WRONG if grade.boxed else FORMAT_MALFORMED
