"""The teacher's rewards (``teacher.reward``), one interface: a callable that scores the g datasets of
one group, registered by name in ``TEACHER_REWARDS`` beside its implementation.

- ``grounded`` (SOAR, paper §1.2): r students per dataset, each a copy of the baseline trained
  K inner steps on it, evaluated on the step's reward questions Q_R;
  R_{k,j} = Acc(student_{k,j}, Q_R) - Acc(baseline, Q_R), R_k = mean_j R_{k,j}.
- ``intrinsic`` (the paper's Intrinsic-T, App. B.4): no inner loop; per question the fixed base
  student's success rate s over ``teacher.intrinsic_samples`` samples at T=1, graded against the
  teacher's own answer; r_i = 0 if s = 0 else 1 - s; R_k = mean_i r_i. Variants published by
  other self-play systems: ``intrinsic_4p1p`` 4s(1-s), ``intrinsic_min`` min(s, 1-s),
  ``intrinsic_mixed`` 1 if 0 < s < 1.

It brings the two roles together (students scoring the teacher's datasets), so it sits beside
``soar.teachers`` and ``soar.students``, which never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from soar.data import Problem
from soar.generation import correctness, make_generator
from soar.seeding import derive_seed
from soar.student_tasks import STUDENT_TRAINING_REWARDS
from soar.students.pool import StudentTask, make_students
from soar.students.trainer import StudentResult

TEACHER_REWARDS: dict[str, type] = {}
"""``teacher.reward`` -> the reward's class, built with ``(cfg, tokenizer, grader, template)``; its
``trains_students`` says whether it trains students (and so whether there are any to promote), from
``soar.student_tasks.STUDENT_TRAINING_REWARDS`` (which the ``${student_tasks:}`` resolver reads without
importing the roles). The loop and ``soar.validation`` read it."""


def register_teacher_reward(name: str):
    """Class decorator: ``teacher.reward=<name>`` builds this class."""
    def register(reward_class: type) -> type:
        reward_class.trains_students = name in STUDENT_TRAINING_REWARDS
        TEACHER_REWARDS[name] = reward_class
        return reward_class
    return register


def make_teacher_reward(cfg, tokenizer, grader, template: str):
    """The reward ``teacher.reward`` names."""
    return TEACHER_REWARDS[cfg.teacher.reward](cfg, tokenizer, grader, template)


@dataclass
class GroupRewards:
    rewards_KR: np.ndarray
    """Per dataset and replicate (intrinsic: one column). R_k = rewards_KR.mean(-1)."""
    students_KR: list[list[StudentResult]] = field(default_factory=list)
    """The trained students (grounded), kept until the promotion decision; in-process students that can
    no longer be promoted or dumped have ``trainer`` None (``soar.students.pool.drop_unpromotable``)."""
    metrics: dict = field(default_factory=dict)


def merge_group_metrics(per_group: list[dict]) -> dict:
    """One step's reward metrics from its ``teacher.groups_per_step`` groups: ``compute/*`` summed,
    ``*_max`` the largest, other numbers and per-inner-step lists the mean over groups (the groups
    are alike: g*r students of the same K each, so that is also the mean over all the step's students)."""
    out = {}
    for key in dict.fromkeys(k for metrics in per_group for k in metrics):
        values = [metrics[key] for metrics in per_group if key in metrics]
        if key.startswith("compute/"):
            out[key] = sum(values)
        elif key.endswith("_max"):
            out[key] = max(values)
        elif isinstance(values[0], list):
            out[key] = np.mean(values, axis=0).tolist()
        else:
            out[key] = float(np.mean(values))
    return out


def as_problems(rollouts, step: int, group: int, k: int) -> list[Problem]:
    return [Problem(f"t{step}/g{group}/d{k}/{i}", r.question, r.answer, "teacher") for i, r in enumerate(rollouts)]


@register_teacher_reward("grounded")
class GroundedReward:
    """r students per dataset, trained by ``soar.students.pool`` (in-process, or a Ray worker pool)."""

    def __init__(self, cfg, tokenizer, grader, template: str):
        self.cfg = cfg
        self.students = make_students(cfg, tokenizer, grader, template)

    def __call__(self, datasets_K: list[list[Problem]], baseline, reward_questions: list[Problem],
                 base_acc: float, step: int, group: int, inner_steps: int, progress=None) -> GroupRewards:
        r = self.cfg.inner.replicates
        tasks = [StudentTask(step, group, k, j, tuple(dataset), inner_steps)
                 for k, dataset in enumerate(datasets_K) for j in range(r)]
        flat = self.students.run(tasks, baseline, reward_questions, progress)
        students_KR = [flat[k * r:(k + 1) * r] for k in range(len(datasets_K))]
        rewards_KR = np.array([[s.accuracy["qr"] - base_acc for s in row] for row in students_KR], dtype=float)
        history = [h for row in students_KR for s in row for h in s.history]
        metrics = {"student/inner_reward_mean": float(np.mean([h["student/reward_mean"] for h in history])),
                   "student/inner_accuracy": float(np.mean([h["student/accuracy"] for h in history])),
                   "student/inner_skipped_frac": float(np.mean([h["student/skipped_zero_adv"] for h in history])),
                   "compute/student_steps": len(history),
                   "compute/student_tokens": float(sum(h["student/completion_tokens_mean"] * h["student/rollouts"]
                                                       for h in history)),
                   "student/inner_completion_tokens_mean": float(np.mean([h["student/completion_tokens_mean"]
                                                                          for h in history])),
                   # the inner-loop learning curve: mean training reward at each inner step over the g*r students
                   "student/inner_reward_by_step": np.mean([[h["student/reward_mean"] for h in s.history]
                                                            for row in students_KR for s in row], axis=0).tolist()}
        gaps = [h["student/sync_logprob_gap"] for h in history if "student/sync_logprob_gap" in h]
        if gaps:  # students sampled by an engine: the worst weight-sync gap of the step
            metrics["student/sync_logprob_gap_max"] = float(max(gaps))
        return GroupRewards(rewards_KR, students_KR, metrics)

    def close(self) -> None:
        self.students.close()


@register_teacher_reward("intrinsic")
class IntrinsicReward:
    """No inner loop: R_k is the mean over dataset k's questions of ``question_reward(s)``, s the fixed base
    student's success rate on the question. The paper's Intrinsic-T: 0 if s = 0 else 1 - s."""

    @staticmethod
    def question_reward(s: float) -> float:
        return 0.0 if s == 0 else 1.0 - s

    def __init__(self, cfg, tokenizer, grader, template: str):
        self.cfg, self.tokenizer, self.grader, self.template = cfg, tokenizer, grader, template
        self.eval_gen = make_generator(cfg, "eval", None, tokenizer)

    def __call__(self, datasets_K, baseline, reward_questions, base_acc, step, group, inner_steps,
                 progress=None) -> GroupRewards:
        cfg, gen = self.cfg, self.eval_gen
        gen.sync_weights(baseline)
        rewards_K, rates = [], []
        for k, dataset in enumerate(datasets_K):
            s = correctness(gen, self.grader, dataset, self.template, cfg.student.max_tokens, tuple(cfg.student.stop),
                            cfg.teacher.intrinsic_samples, derive_seed(cfg.seed, "intrinsic", step, group, k))
            rates += s
            rewards_K.append(float(np.mean([self.question_reward(x) for x in s])))
            if progress is not None:
                progress.update(1)
        return GroupRewards(np.array(rewards_K)[:, None], [], {"teacher/intrinsic_success_rate": float(np.mean(rates))})

    def close(self) -> None:
        pass


@register_teacher_reward("intrinsic_4p1p")
class FourSOneMinusSReward(IntrinsicReward):
    """4s(1-s): largest at s = 1/2."""

    @staticmethod
    def question_reward(s: float) -> float:
        return 4.0 * s * (1.0 - s)


@register_teacher_reward("intrinsic_min")
class MinReward(IntrinsicReward):
    """min(s, 1-s)."""

    @staticmethod
    def question_reward(s: float) -> float:
        return min(s, 1.0 - s)


@register_teacher_reward("intrinsic_mixed")
class MixedReward(IntrinsicReward):
    """1 if the student is sometimes right and sometimes wrong (0 < s < 1)."""

    @staticmethod
    def question_reward(s: float) -> float:
        return float(0.0 < s < 1.0)
