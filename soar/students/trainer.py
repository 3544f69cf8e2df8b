"""A SOAR student (paper §1.3): a copy of the baseline trained a few RLOO steps on one dataset
(``train_student``), then scored on the evaluation sets (Q_R). The outer step's executors
(``soar.students.pool``, ``lockstep``, ``batched``) train g*r of them; ``soar-rl`` (``soar.rl``) and
fresh students (``soar.evaluate``) draw their batches the same way (``batch_indices``).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import numpy as np

from soar.policy.trainer import RLOOTrainer
from soar.seeding import derive_seed


def batch_indices(n_items: int, step: int, per_step: int, seed: int) -> list[int]:
    """Indices for ``step``: epochs of seeded permutations, read without replacement, wrapping."""
    out = []
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, offset = divmod(pos, n_items)
        perm = np.random.default_rng(derive_seed(seed, "batch_order", epoch)).permutation(n_items)
        out.append(int(perm[offset]))
    return out


@dataclass
class StudentResult:
    correct: dict[str, list[float]]
    """Score per problem of each evaluation set after training: correctness (greedy: 0/1), or the
    gold metric's score the run's ``inner.reward_metric`` asks for (``soar.policy.scores``)."""
    accuracy: dict[str, float]
    """Mean of ``correct`` per evaluation set."""
    history: list[dict]
    """Per-step trainer metrics."""
    trainer: "RLOOTrainer"
    """The trained student (kept until the caller decides, e.g. promotion); with the Ray pool a
    ``soar.students.pool.RemoteStudent`` standing in for it (same ``sampler``/``export_model``/``save_pretrained``)."""
    worker: dict | None = None
    """Where it ran: ``pid``, ``node_id``, ``worker`` (pool slot; None in-process), ``attempts``."""


def sharing_copy(baseline):
    """A copy of ``baseline``'s modules holding the *same* weight tensors (parameters and buffers),
    for a LoRA student: peft wraps the copy's layers with the student's adapter and freezes the shared
    base, so the g*r students of a step (and those kept until the promotion decision) hold one base
    between them plus an adapter each, instead of a deep copy each (~6.4 GB per student at 3B in
    bf16). Only adapters may train on it; a student is exported by merging into a deep copy
    (``export_policy``), never into the shared base. The baseline's parameters are left frozen."""
    memo = {id(t): t for t in itertools.chain(baseline.parameters(), baseline.buffers())}
    return copy.deepcopy(baseline, memo)


def train_student(baseline, tokenizer, grader, problems, student_cfg, prompt_template: str, seed: int,
                  eval_sets: dict | None = None, eval_samples: int = 0, batch_size: int = 256,
                  rollout_generator=None, eval_generator=None, metric: str = "accuracy",
                  gold_completion: str = "") -> StudentResult:
    """One inner loop: a copy of ``baseline`` trained ``max_steps`` RLOO steps on ``problems``
    (fresh optimiser, KL to the baseline itself, which serves as the frozen reference), then scored
    on each of ``eval_sets`` by ``metric`` (accuracy: greedy, or ``eval_samples`` samples per
    question; or a gold metric's score, ``soar.policy.scores.REWARD_METRICS``).
    Generators default to HF on the student's weights."""
    if student_cfg.lora.r > 0:
        model = sharing_copy(baseline)
    else:
        model = copy.deepcopy(baseline).requires_grad_(True)  # the baseline is frozen as a reference below
    ref = baseline if student_cfg.lora.r == 0 and student_cfg.kl_coef > 0 else None  # read only: no copy
    trainer = RLOOTrainer(model, tokenizer, grader, student_cfg, prompt_template, seed, ref_model=ref,
                          batch_size=batch_size, generator=rollout_generator)
    history = []
    for step in range(student_cfg.max_steps):
        batch = [problems[i] for i in batch_indices(len(problems), step, student_cfg.questions_per_step, seed)]
        history.append(trainer.step(batch).metrics)
    correct = {name: trainer.evaluate(probs, student_cfg.eval_max_tokens, eval_samples, derive_seed(seed, "eval"),
                                      eval_generator, metric, gold_completion)
               for name, probs in (eval_sets or {}).items()}
    return StudentResult(correct, {k: float(np.mean(v)) for k, v in correct.items()}, history, trainer)
