"""Two loop-level suspects: in-process students each kept their trainer (optimiser state, schedule,
full-FT reference copy) until the outer step ended (~4 model copies x g*r students); with
``teacher.groups_per_step > 1`` the step's ``student/inner_*`` metrics were the last group's only. And
the step state itself: a checkpoint written on a GPU must resume on a machine without one."""

from __future__ import annotations

import gc
import json
import weakref

import pytest

import soar

pytestmark = pytest.mark.timeout(300)


def test_in_process_students_free_training_state_before_the_next_student(tiny_model_dir):
    from soar.data import Problem
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.students.pool import InProcessStudents, StudentRunner, StudentTask

    cfg = soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", "student.max_steps=1"])
    tok, base = load_tokenizer(cfg.model), load_model(cfg.model)
    runner = StudentRunner(cfg, tok, make_grader(cfg.data.grader), cfg.data.prompt_template)
    problems = tuple(Problem(f"p{i}", f"{100 + i}+{200 + i}", str(300 + 2 * i)) for i in range(4))
    tasks = [StudentTask(0, 0, k, 0, problems, 1) for k in range(3)]
    held, alive_at_start = [], []
    train = runner.run

    def spy(baseline, task, qr):
        gc.collect()
        alive_at_start.append([ref() is not None for ref in held])  # the earlier students' training state
        res = train(baseline, task, qr)
        assert res.trainer.ref_model is baseline and res.trainer.optimizer.state  # full FT with KL: no reference copy
        held.extend([weakref.ref(res.trainer.optimizer), weakref.ref(res.trainer.master)])
        return res

    runner.run = spy
    results = InProcessStudents(runner).run(tasks, base, list(problems[:2]))
    assert alive_at_start == [[], [False, False], [False, False, False, False]]
    kept = [res for res in results if res.trainer is not None]  # the best dataset's (r = 1: promotion_candidates)
    assert kept
    for res in kept:  # what the promotion and the step dump use is still there
        assert res.trainer.optimizer is None and res.trainer.ref_model is None
        assert res.trainer.export_model() is not None and res.trainer.sampler() is not None


def test_groups_metrics_are_merged_not_overwritten():
    from soar.rewards import merge_group_metrics

    a = {"student/inner_reward_mean": 10.0, "student/inner_accuracy": 0.5, "compute/student_steps": 8,
         "compute/student_tokens": 100.0, "student/inner_reward_by_step": [1.0, 3.0], "student/sync_logprob_gap_max": 0.01}
    b = {"student/inner_reward_mean": 30.0, "student/inner_accuracy": 0.0, "compute/student_steps": 8,
         "compute/student_tokens": 50.0, "student/inner_reward_by_step": [3.0, 5.0], "student/sync_logprob_gap_max": 0.03}
    assert merge_group_metrics([a, b]) == {
        "student/inner_reward_mean": 20.0, "student/inner_accuracy": 0.25, "compute/student_steps": 16,
        "compute/student_tokens": 150.0, "student/inner_reward_by_step": [2.0, 4.0], "student/sync_logprob_gap_max": 0.03}
    assert merge_group_metrics([a]) == a  # one group: as before


def test_two_groups_per_step_report_both_groups(tiny_model_dir, tmp_path, monkeypatch):
    """The loop's metrics with 2 groups: the mean of what each group's reward reported."""
    from dataclasses import replace

    from soar.rewards import TEACHER_REWARDS, merge_group_metrics

    seen = []
    grounded = TEACHER_REWARDS["grounded"]

    def spy(record, state):
        out = grounded.fn(record, state)
        seen.append(dict(out.metrics))
        return out

    monkeypatch.setitem(TEACHER_REWARDS, "grounded", replace(grounded, fn=spy))
    from soar.worlds.arith import generate_problems

    hard = tmp_path / "hard.jsonl"  # given, so the run builds no hard set
    hard.write_text("".join(json.dumps({"id": p.id, "question": p.question, "answer": p.answer,
                                        "split": "train" if i < 8 else "test"}) + "\n"
                            for i, p in enumerate(generate_problems(3, 3, 12, seed=7, prefix="hard"))))
    cfg = soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}",
                        f"loop.hard_set={hard}", "loop.steps=1",
                        "teacher.groups_per_step=2", "run.progress=false", "loop.diversity_model=null",
                        "student.max_steps=1", "inner.replicates=1"])  # 2 groups x 2 students x 1 inner step
    soar.train(cfg)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert len(seen) == 2 and seen[0]["student/inner_reward_mean"] != seen[1]["student/inner_reward_mean"]
    assert row["student/inner_reward_mean"] == pytest.approx((seen[0]["student/inner_reward_mean"]
                                                              + seen[1]["student/inner_reward_mean"]) / 2)
    assert row["compute/student_steps"] == seen[0]["compute/student_steps"] + seen[1]["compute/student_steps"]
    assert merge_group_metrics(seen) == {k: row[k] for k in seen[0]}


def test_a_checkpoint_written_on_a_gpu_resumes_on_a_cpu_only_machine(tmp_path):
    """A gate on a GPU host stops at its call's limit and continues on 2 cores, from a ``teacher.pt``
    of CUDA tensors. No GPU here: a tagger ahead of torch's own marks the storages ``cuda:0`` when
    saving, which is what a GPU's tensors are marked."""
    import torch
    from torch import serialization

    from soar.state import LoopState

    teacher_state = {"trainable": {"w": torch.arange(6.0).reshape(2, 3)}, "optimizer": {"state": {}}, "step": 4}
    as_if_on_a_gpu = (lambda storage: "cuda:0", lambda storage, location: None)
    serialization.register_package(-100, *as_if_on_a_gpu)
    try:
        LoopState(step=4).save(tmp_path, teacher_state)
    finally:
        serialization._package_registry[:] = [e for e in serialization._package_registry if e[1] is not as_if_on_a_gpu[0]]
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):  # what resuming did before (2026-12-04)
            torch.load(tmp_path / "teacher.pt", weights_only=True)
    state, loaded = LoopState.load(tmp_path)
    assert state.step == 4 and loaded["step"] == 4
    assert loaded["trainable"]["w"].device.type == "cpu"
    assert torch.equal(loaded["trainable"]["w"], teacher_state["trainable"]["w"])


def test_a_background_checkpoint_runs_while_the_caller_goes_on_and_reports_its_error_at_the_next_wait(tmp_path, caplog):
    """``loop.async_checkpoint``: the write runs on a thread while the caller goes on; a failed write
    is raised at the next ``wait``/``submit`` (the loop's next step waits before its first file and
    its teacher update), or logged when another error is on its way; inline without a thread.
    ``on_cpu`` moves GPU tensors off and leaves CPU tensors as they are (no copy)."""
    import threading

    import torch

    from soar.state import Background, LoopState, on_cpu

    weights, moment = torch.arange(6.0), torch.ones(2)
    state = {"trainable": {"w": weights}, "optimizer": {"state": {0: {"exp_avg": moment}}}, "step": 1}
    assert on_cpu(state)["trainable"]["w"] is weights and on_cpu(state)["step"] == 1

    release, writing = threading.Event(), threading.Event()

    def slow_write(folder, teacher_state):
        writing.set()
        release.wait(30)
        LoopState(step=1).save(folder, teacher_state)

    writer = Background(True, "test-checkpoint")
    writer.submit(slow_write, tmp_path, state)  # returns while the write waits
    assert writing.wait(30) and not (tmp_path / "teacher.pt").exists()
    release.set()
    assert writer.wait() >= 0
    assert torch.equal(LoopState.load(tmp_path)[1]["optimizer"]["state"][0]["exp_avg"], moment)

    def full_disk():
        raise OSError(28, "No space left on device")

    writer.submit(full_disk)
    with pytest.raises(OSError, match="No space left"):
        writer.submit(print)  # the next job waits for the failed one first
    writer.submit(full_disk)
    writer.close(raise_errors=False)
    assert "test-checkpoint: the last background job failed as well" in caplog.text

    inline, order = Background(False, "inline"), []
    inline.submit(order.append, 1)
    assert order == [1]  # async_checkpoint=false: written before submit returns


def test_the_teacher_changes_only_after_its_background_checkpoint_is_written(tiny_model_dir, tmp_path, monkeypatch):
    """The background write reads the teacher's live optimiser state (no copy), so the next step must
    not update the teacher, nor write a file, before the write is done. Each write is held back until
    the loop waits for it or the teacher's update is called: the update must find no write in flight."""
    import threading

    from soar.state import Background, Checkpoints
    from soar.teachers.update import TeacherPolicy
    from soar.worlds.arith import generate_problems

    in_flight, updates, waits, release = [], [], [], threading.Event()
    write, update, wait = Checkpoints.write, TeacherPolicy.update, Background.wait

    def held_write(self, st, teacher_state):
        in_flight.append(st.step)
        release.wait(60)
        release.clear()
        write(self, st, teacher_state)
        in_flight.remove(st.step)

    def watched_update(self, *args, **kwargs):
        updates.append(list(in_flight))
        if in_flight:
            release.set()  # an update before the wait: let the write go on
        return update(self, *args, **kwargs)

    def watched_wait(self):
        if self._future is not None:  # a write under way: the loop waits for it
            waits.append(self.name)
            release.set()
        return wait(self)

    monkeypatch.setattr(Checkpoints, "write", held_write)
    monkeypatch.setattr(TeacherPolicy, "update", watched_update)
    monkeypatch.setattr(Background, "wait", watched_wait)
    hard = tmp_path / "hard.jsonl"
    hard.write_text("".join(json.dumps({"id": p.id, "question": p.question, "answer": p.answer,
                                        "split": "train" if i < 8 else "test"}) + "\n"
                            for i, p in enumerate(generate_problems(3, 3, 12, seed=7, prefix="hard"))))
    cfg = soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}",
                        f"loop.hard_set={hard}", "loop.steps=2", "run.progress=false", "loop.diversity_model=null",
                        "student.max_steps=1", "inner.replicates=1"])
    soar.train(cfg)
    assert updates == [[], []]  # no teacher update while a checkpoint was being written
    assert waits == ["soar-checkpoint", "soar-checkpoint"]  # step 2 waited for step 1's, the end for step 2's
    assert [p.name for p in sorted((tmp_path / "run" / "checkpoints").glob("step_*"))] == ["step_000001", "step_000002"]
