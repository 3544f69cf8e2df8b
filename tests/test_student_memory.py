"""Issue 49 §2: what a step's students keep in memory. In-process students keep only the policies that
may still be promoted or dumped (``promotion_candidates``), and lockstep LoRA students share one base
instead of a deep copy each (``sharing_copy``); both leave every result unchanged."""

from __future__ import annotations

import gc
import itertools
import weakref

import numpy as np
import pytest
import torch

import soar
from soar.config import PromotionConfig
from soar.students.promotion import PromotionPolicy, median_replicate, promotion_candidates

pytestmark = pytest.mark.timeout(300)


def test_promotion_candidates_by_hand():
    # dataset 0 done (median of two: both equidistant), dataset 1 training: all kept
    assert promotion_candidates([[0.5, 0.25], [0.75]], 2) == {(0, 0), (0, 1), (1, 0)}
    # dataset 1 done and better: dataset 0 goes
    assert promotion_candidates([[0.5, 0.25], [0.75, 0.75]], 2) == {(1, 0), (1, 1)}
    # r = 3: the best dataset's middle replicate only
    assert promotion_candidates([[0.1, 0.2, 0.9], [0.3, 0.3, 0.4]], 3) == {(0, 1)}
    # tied best datasets keep both medians
    assert promotion_candidates([[0.5, 0.5, 0.5], [0.4, 0.5, 0.6]], 3) == {(0, 0), (0, 1), (0, 2), (1, 1)}
    assert promotion_candidates([], 4) == set()


@pytest.mark.parametrize("seed", range(200))
def test_promotion_candidates_always_hold_the_promoted_and_dumped_student(seed):
    """For every prefix of a group's students in training order, the student the loop promotes (and
    dumps: the median replicate of the best dataset) from the final rewards (scores minus the
    baseline's) is among the candidates once it has trained."""
    rng = np.random.default_rng(seed)
    g, r = int(rng.integers(2, 5)), int(rng.integers(1, 5))
    scores_KR = rng.integers(0, 9, size=(g, r)) / 8  # accuracies on 8 questions: many ties
    rewards_KR = scores_KR - rng.uniform(0, 1)
    decision = PromotionPolicy(PromotionConfig(tau=-1e9, window=1)).update(rewards_KR)
    best = (decision.dataset, decision.replicate)
    assert best == (int(np.argmax(rewards_KR.mean(-1))), median_replicate(rewards_KR[decision.dataset]))
    order = [(k, j) for k in range(g) for j in range(r)]
    for n in range(1, len(order) + 1):
        rows = [[scores_KR[k, j] for j in range(r) if (k, j) in order[:n]] for k in range(g)]
        while rows and not rows[-1]:
            rows.pop()
        if best in order[:n]:
            assert best in promotion_candidates(rows, r), (n, scores_KR, rewards_KR)


def test_in_process_students_keep_only_promotion_candidates(tiny_model_dir):
    """g = 3 datasets x r = 2 students, scored by gold log-probability (no ties): after each student
    only ``promotion_candidates`` keep a policy (the others are freed), and the student the loop would
    promote is among them, with its policy."""
    from soar.data import Problem
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.students.pool import InProcessStudents, StudentRunner, StudentTask

    cfg = soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", "student.max_steps=1",
                        "inner.reward_metric=gold_logprob"])
    tok, base = load_tokenizer(cfg.model), load_model(cfg.model)
    runner = StudentRunner(cfg, tok, make_grader(cfg.data.grader), cfg.data.prompt_template)
    datasets = [tuple(Problem(f"d{k}p{i}", f"{100 + 37 * k + i}+{200 + 11 * k * i}", str(300 + 37 * k + i + 11 * k * i))
                      for i in range(4)) for k in range(3)]
    tasks = [StudentTask(0, 0, k, j, datasets[k], 1) for k in range(3) for j in range(2)]
    policies, alive = [], []
    train = runner.run

    def spy(baseline, task, qr):
        gc.collect()
        alive.append({key for key, ref in policies if ref() is not None})
        res = train(baseline, task, qr)
        policies.append((task.key[2:], weakref.ref(res.trainer.model)))
        return res

    runner.run = spy
    results = InProcessStudents(runner).run(tasks, base, list(datasets[0][:2]))
    gc.collect()
    alive.append({key for key, ref in policies if ref() is not None})
    scores = [res.accuracy["qr"] for res in results]
    for n, seen in enumerate(alive):  # before student n: exactly the candidates of the first n
        rows = [[scores[2 * k + j] for j in range(2) if 2 * k + j < n] for k in range(3)]
        assert seen == promotion_candidates([row for row in rows if row] if n else [], 2), n
    kept = {task.key[2:] for task, res in zip(tasks, results) if res.trainer is not None}
    assert kept == alive[-1] and len(kept) < len(tasks)
    rewards_KR = np.array(scores).reshape(3, 2) - 0.5
    decision = PromotionPolicy(PromotionConfig(tau=-1e9, window=1)).update(rewards_KR)
    assert (decision.dataset, decision.replicate) in kept


def test_lockstep_lora_students_share_one_base_and_train_as_deep_copies(tiny_model_dir, monkeypatch):
    """Lockstep LoRA students (hf backend) hold one base between them: the distinct weight storage of
    3 students is the base once plus 3 adapters; and they end exactly where one-by-one students on
    deep copies of the baseline (as before ``sharing_copy``) end: same rewards, scores and adapters."""
    import copy

    import soar.students.trainer
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.students.lockstep import LockstepStudents
    from soar.students.pool import InProcessStudents, StudentRunner, StudentTask
    from soar.worlds.arith import generate_problems

    over = ["experiment=arith_micro", f"model.path={tiny_model_dir}", "student.lora.r=4", "student.lora.alpha=8",
            "student.lr=1e-2", "student.max_steps=2"]
    cfg = soar.compose(over + ["resources.lockstep=true"])
    tok, base = load_tokenizer(cfg.model), load_model(cfg.model)
    grader = make_grader("integer")
    tasks = [StudentTask(0, 0, k, 0, tuple(generate_problems(3, 1 + k, 8, seed=20 + k, prefix=f"d{k}")), 2)
             for k in range(3)]
    qr = generate_problems(3, 2, 4, seed=30, prefix="qr")
    together = LockstepStudents(cfg, tok, grader, cfg.data.prompt_template).run(tasks, base, qr)
    trainers = [res.trainer for res in together]
    base_ptrs = {p.data_ptr() for p in base.parameters()}
    storages = {p.data_ptr(): p.numel() * p.element_size()
                for t in trainers for p in itertools.chain(t.model.parameters(), t.model.buffers())}
    adapter = sum(p.numel() * p.element_size() for p in trainers[0].model.parameters() if p.requires_grad)
    base_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    buffers = sum(b.numel() * b.element_size() for b in base.buffers())
    held = sum(storages.values())
    assert held <= base_bytes + buffers + len(tasks) * adapter, \
        f"{len(tasks)} students hold {held / 2**20:.2f} MB of weights; the base is {base_bytes / 2**20:.2f} MB"
    assert base_ptrs <= storages.keys()  # every student reads the baseline's own tensors
    monkeypatch.setattr(soar.students.trainer, "sharing_copy", copy.deepcopy)
    alone = InProcessStudents(StudentRunner(soar.compose(over), tok, grader, cfg.data.prompt_template)).run(tasks, base, qr)
    for a, b in zip(together, alone):
        assert [h["student/reward_mean"] for h in a.history] == [h["student/reward_mean"] for h in b.history]
        assert a.correct == b.correct
    for a, b in zip(together, alone):
        if b.trainer is None:  # in-process: not a promotion candidate
            continue
        wa = {k: v for k, v in a.trainer.model.named_parameters() if "lora_" in k}
        wb = {k: v for k, v in b.trainer.model.named_parameters() if "lora_" in k}
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
