"""What every student executor shares (``soar.students.pool.make_students`` picks one: in-process, the Ray
pool, lockstep or stacked): ``run`` trains a step's student tasks against a baseline, ``score_baseline``
scores the baseline in the layout its students are scored in (so an unchanged student gets R = 0
exactly), and ``finish`` is every student's result tail. The loop asks the executor; it never asks
which one it is.
"""

from __future__ import annotations

import os

import numpy as np

from soar.faults import maybe_die
from soar.models import export_policy, save_policy
from soar.policy.scores import BaselineScorer
from soar.students.trainer import StudentResult


class StudentExecutor(BaselineScorer):
    """Base of the student executors: ``score_baseline`` by ``problem_scores`` on the eval role's generator
    (``BaselineScorer``; the stacked students score in their own layout), and the result tail."""

    def run(self, tasks, baseline, reward_questions, progress=None) -> list[StudentResult]:
        """Train ``tasks`` (``soar.students.pool.StudentTask``) from ``baseline``, each scored on
        ``reward_questions``; results in task order."""
        raise NotImplementedError

    @staticmethod
    def finish(tasks, scores_qr: list[list[float]], histories: list[list[dict]], trainers, wheres=None,
               progress=None) -> list[StudentResult]:
        """The results of ``tasks``, finished together: each its Q_R scores (and their mean), history, trained
        student and where it ran (default: this process), with the fault point after each, then one update of
        the progress bar for all of them (so no frame shows one student's time as all of theirs)."""
        results = []
        for task, scores, history, trainer, where in zip(tasks, scores_qr, histories, trainers,
                                                         wheres or [None] * len(tasks)):
            results.append(StudentResult({"qr": scores}, {"qr": float(np.mean(scores))}, history, trainer,
                                         where or {"pid": os.getpid(), "node_id": None, "worker": None, "attempts": 1}))
            maybe_die("student", task.step)
        if progress is not None:
            progress.update(len(tasks))
        return results

    def close(self) -> None:
        pass


class StudentHandle:
    """A trained student standing in for its ``RLOOTrainer`` where its weights live elsewhere (a stack's
    slice, ``soar.students.stacked.StackedStudent``; a pool worker, ``soar.students.pool.RemoteStudent``):
    ``export_model`` and ``save_pretrained`` read the weights ``policy`` gives."""

    tokenizer = None

    def policy(self):
        """The student's weights as a model of the baseline's architecture."""
        raise NotImplementedError

    def export_model(self):
        return export_policy(self.policy())

    def save_pretrained(self, out_dir) -> None:
        save_policy(self.policy(), self.tokenizer, out_dir)
