"""How many students an outer step trains, from the config alone: the ``${student_tasks:}`` resolver
(``resources.num_workers``) reads it while a config is composed, so it imports nothing."""

from __future__ import annotations

STUDENT_TRAINING_REWARDS = ("grounded",)
"""The ``teacher.reward`` values whose reward trains students (SOAR's inner loop); the intrinsic rewards
train none. ``soar.rewards.TEACHER_REWARDS`` takes each reward's ``trains_students`` from it."""


def student_tasks_per_step(cfg) -> int:
    """Students an outer step trains: ``teacher.groups_per_step`` x g x r with a reward that trains
    students (the pool's tasks); the intrinsic rewards train none."""
    if cfg.teacher.reward not in STUDENT_TRAINING_REWARDS:
        return 0
    return cfg.teacher.groups_per_step * cfg.teacher.datasets * cfg.inner.replicates
