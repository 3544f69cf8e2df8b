"""The teacher's rewards (``teacher.reward``): pure functions of one group's record (``GroupRecord``) and the
run's reward state (``RewardState``: the student executor or the base student's generator, built once),
registered by name in ``TEACHER_REWARDS``, each returning the group's ``GroupRewards``.

- ``grounded`` (SOAR, paper §1.2): r students per dataset, each a copy of the baseline trained
  K inner steps on it, evaluated on the step's reward questions Q_R;
  R_{k,j} = Acc(student_{k,j}, Q_R) - Acc(baseline, Q_R), R_k = mean_j R_{k,j}.
- ``intrinsic`` (the paper's Intrinsic-T, App. B.4): no inner loop; per question the fixed base
  student's success rate s over ``teacher.intrinsic_samples`` samples at T=1, graded against the
  teacher's own answer; r_i = 0 if s = 0 else 1 - s; R_k = mean_i r_i. Variants published by
  other self-play systems (``QUESTION_REWARDS``): ``intrinsic_4p1p`` 4s(1-s), ``intrinsic_min``
  min(s, 1-s), ``intrinsic_mixed`` 1 if 0 < s < 1.

It brings the two roles together (students scoring the teacher's datasets), so it sits beside
``soar.teachers`` and ``soar.students``, which never import each other.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from soar.data import Problem
from soar.generation import correctness, make_generator
from soar.policy.scores import BaselineScorer
from soar.seeding import derive_seed
from soar.student_tasks import STUDENT_TRAINING_REWARDS
from soar.students.pool import StudentTask, make_students
from soar.students.trainer import StudentResult


@dataclass(frozen=True)
class GroupRecord:
    """What a teacher reward reads of one group of g datasets in one outer step."""

    datasets_K: list[list[Problem]]
    """The group's g datasets X_k."""
    baseline: Any
    """The current baseline: the students' starting point, the intrinsic rewards' base student."""
    reward_questions: list[Problem]
    """The step's Q_R."""
    baseline_score: float
    """The baseline's mean score on Q_R in ``inner.reward_metric``'s units (``soar.loop.Loop.scores``)."""
    step: int
    group: int
    inner_steps: int
    """K: RLOO steps of each student."""
    progress: Any = None
    """The outer loop's progress bar (a unit per student, or per dataset for a reward without students), or None."""


@dataclass
class RewardState:
    """What the teacher rewards keep across steps, built once per run (``make_reward_state``) and closed by
    the loop."""

    cfg: Any
    grader: Any
    template: str
    scorer: BaselineScorer
    """Scores the baseline in the layout the students are scored in (``score_baseline``): the student
    executor, else the default ``BaselineScorer``."""
    students: Any = None
    """The run's student executor (``soar.students.pool.make_students``), for a reward that trains students."""
    generator: Any = None
    """The base student's generator (the eval role's), for a reward that trains none."""

    def close(self) -> None:
        if self.students is not None:
            self.students.close()


@dataclass(frozen=True)
class TeacherReward:
    fn: Callable[[GroupRecord, RewardState], GroupRewards]
    """The group's rewards from its record and the run's reward state."""
    trains_students: bool = False
    """It trains students, so there are students to promote; its state holds a student executor."""


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


def grounded(record: GroupRecord, state: RewardState) -> GroupRewards:
    """r students per dataset, trained by the run's student executor (``soar.students.pool.make_students``)."""
    r = state.cfg.inner.replicates
    tasks = [StudentTask(record.step, record.group, k, j, tuple(dataset), record.inner_steps)
             for k, dataset in enumerate(record.datasets_K) for j in range(r)]
    flat = state.students.run(tasks, record.baseline, record.reward_questions, record.progress)
    students_KR = [flat[k * r:(k + 1) * r] for k in range(len(record.datasets_K))]
    rewards_KR = np.array([[s.accuracy["qr"] - record.baseline_score for s in row] for row in students_KR], dtype=float)
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


def success_rates(record: GroupRecord, state: RewardState, k: int) -> list[float]:
    """Per question of dataset k, the base student's success rate over ``teacher.intrinsic_samples`` samples at
    T=1 (``state.generator``, synced to the baseline)."""
    cfg = state.cfg
    return correctness(state.generator, state.grader, record.datasets_K[k], state.template, cfg.student.max_tokens,
                       tuple(cfg.student.stop), cfg.teacher.intrinsic_samples,
                       derive_seed(cfg.seed, "intrinsic", record.step, record.group, k))


def intrinsic(record: GroupRecord, state: RewardState, question_reward: Callable[[float], float]) -> GroupRewards:
    """No inner loop: R_k is the mean over dataset k's questions of ``question_reward(s)``, s the fixed base
    student's success rate on the question (``success_rates``)."""
    rewards_K, rates = [], []
    state.generator.sync_weights(record.baseline)
    for k in range(len(record.datasets_K)):
        s = success_rates(record, state, k)
        rates += s
        rewards_K.append(float(np.mean([question_reward(x) for x in s])))
        if record.progress is not None:
            record.progress.update(1)
    return GroupRewards(np.array(rewards_K)[:, None], [], {"teacher/intrinsic_success_rate": float(np.mean(rates))})


QUESTION_REWARDS: dict[str, Callable[[float], float]] = {
    "intrinsic": lambda s: 0.0 if s == 0 else 1.0 - s,  # the paper's Intrinsic-T: nothing for the unsolvable
    "intrinsic_4p1p": lambda s: 4.0 * s * (1.0 - s),  # largest at s = 1/2
    "intrinsic_min": lambda s: min(s, 1.0 - s),
    "intrinsic_mixed": lambda s: float(0.0 < s < 1.0),  # sometimes right and sometimes wrong
}
"""The intrinsic rewards by name: a question's reward from the base student's success rate s on it."""

_REWARD_FUNCTIONS = {"grounded": grounded, **{name: functools.partial(intrinsic, question_reward=fn)
                                                for name, fn in QUESTION_REWARDS.items()}}
TEACHER_REWARDS: dict[str, TeacherReward] = {name: TeacherReward(fn, trains_students=name in STUDENT_TRAINING_REWARDS)
                                             for name, fn in _REWARD_FUNCTIONS.items()}
"""``teacher.reward`` -> its function of (``GroupRecord``, ``RewardState``) and whether it trains students (and
so whether there are any to promote), the latter from ``soar.student_tasks.STUDENT_TRAINING_REWARDS`` (which
the ``${student_tasks:}`` resolver reads without importing the roles). The loop and ``soar.validation`` read it."""


def make_reward_state(cfg, tokenizer, grader, template: str) -> RewardState:
    """The state ``teacher.reward`` keeps: the run's student executor (which also scores the baseline) for a
    reward that trains students, else the base student's generator beside the default baseline scorer."""
    if TEACHER_REWARDS[cfg.teacher.reward].trains_students:
        students = make_students(cfg, tokenizer, grader, template)
        return RewardState(cfg, grader, template, scorer=students, students=students)
    return RewardState(cfg, grader, template, scorer=BaselineScorer(cfg, tokenizer, grader, template),
                       generator=make_generator(cfg, "eval", None, tokenizer))
