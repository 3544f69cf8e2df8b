"""The SOAR outer loop (paper §1.5); students run in-process or on a Ray pool (``resources.*``).

    soar-train                                   # the embedded world (experiment=arith)
    soar-train experiment=arith_micro            # the same loop in under a minute
    soar-train experiment=paper_math             # Llama-3.2-3B-Instruct on MATH (GPU cluster)

Per outer step t:
  1. the teacher samples until g*n completions parse (per group), split in order into g datasets;
  2. Q_R: M hard-train questions drawn without replacement from the step's own seed;
  3. reward R_{k,j} per dataset k and replicate student j (grounded: the gain of a baseline copy
     RL-trained K steps on X_k, on Q_R, in ``inner.reward_metric``: accuracy as in the paper, or the
     gold answers' log-probability; intrinsic: learnability of X_k for the base student);
  4. promotion: if the moving average of mean_k R_k passes tau, the median student of the best
     dataset becomes the baseline and X_k* joins the Promotion Questions; K (the inner steps) grows
     by ``inner.steps_per_promotion``, up to ``inner.max_steps``;
  5. teacher update: RLOO over the g datasets (A_k = R_k - mean of the others), KL to the initial
     teacher, using the rewards measured against the old baseline;
  6. step dump, metrics, one atomic checkpoint (every ``loop.checkpoint_every`` steps, written on a
     thread while the next step runs with ``loop.async_checkpoint``). A killed run resumes from the
     last checkpoint and reproduces the uninterrupted run.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from contextlib import contextmanager

import numpy as np
from omegaconf import OmegaConf

from soar.console import outer_step_line, progress_bar, train_summary_text
from soar.diversity import DiversityMeter
from soar.faults import maybe_die
from soar.grading import make_grader
from soar.metrics_log import MetricsLogger
from soar.models import load_model, model_context
from soar.policy.trainer import SyncError
from soar.prepare import read_train_inputs, setup_train
from soar.rewards import (
    TEACHER_REWARDS,
    GroupRecord,
    as_problems,
    make_reward_state,
    merge_group_metrics,
)
from soar.seeding import derive_seed
from soar.signals import StopRequest
from soar.stage import setup_stage
from soar.state import Checkpoints, LoopState, save_model_atomic
from soar.step_dump import start_completions, write_step_dump
from soar.student_tasks import student_tasks_per_step
from soar.students.promotion import PromotionPolicy
from soar.teachers.sampling import RejectionCapError
from soar.teachers.update import TeacherPolicy, dataset_advantages
from soar.worlds.base import answer_oracle_hook

log = logging.getLogger("soar.loop")


class LoopError(RuntimeError):
    pass


@contextmanager
def phase(name: str, step: int, times: dict):
    """Time a phase of outer step ``step`` (0-based; named 1-based, as the console's ``step 1/3``); a
    non-finite loss or a rejection cap aborts naming the step and phase."""
    t0 = time.perf_counter()
    try:
        yield
    except (FloatingPointError, RejectionCapError, SyncError) as exc:
        raise LoopError(f"outer step {step + 1}, phase {name}: {exc}") from exc
    times[f"time/{name}_s"] = time.perf_counter() - t0


def draw_reward_questions(n_train: int, m: int, seed: int) -> list[int]:
    """Q_R indices: M of the hard-train split, without replacement, from their own seed stream."""
    return sorted(np.random.default_rng(seed).choice(n_train, size=m, replace=False).tolist())


class Loop:
    """Holds the run's long-lived pieces; ``step`` is one outer iteration."""

    def __init__(self, cfg, run, tokenizer, base_model, hard):
        self.cfg, self.run, self.tokenizer, self.hard = cfg, run, tokenizer, hard
        self.template = cfg.data.prompt_template
        self.grader = make_grader(cfg.data.grader)
        self.teacher = TeacherPolicy(cfg, copy.deepcopy(base_model), tokenizer, self.grader, self.template,
                                     model_context(base_model, cfg.model))
        self.reward_fn = TEACHER_REWARDS[cfg.teacher.reward].fn
        self.reward_state = make_reward_state(cfg, tokenizer, self.grader, self.template)
        self.state = LoopState(inner_steps=cfg.student.max_steps)
        self.baseline = base_model
        if run.resume_from is not None:
            self.state, teacher_state = LoopState.load(run.resume_from)
            self.teacher.trainer.load_state_dict(teacher_state)
            if self.state.promotions:
                self.baseline = load_model(_model_cfg(cfg, str(run.path / self.state.promotions[-1]["path"])))
            log.info("resumed from %s after outer step %d", run.resume_from, self.state.step)
        self.state.hard_set_sha256 = hard.sha256  # checked against it on resume (soar.prepare.check_hard_set)
        self.checkpoints = Checkpoints(cfg, run, self.teacher.trainer, self.state.step)
        self.policy = PromotionPolicy(cfg.promotion, self.state.history)
        self.diversity = DiversityMeter(cfg.loop.diversity_model)
        self.oracle = answer_oracle_hook(cfg)  # measurement only

    # ---- helpers ------------------------------------------------------------------------------
    def scores(self, problems, seed_label, metric: str) -> list[float]:
        """The baseline's score per problem in ``metric`` (``soar.policy.scores.REWARD_METRICS``), in the
        layout the students are scored in (``score_baseline`` of the reward's student executor)."""
        seed = derive_seed(self.cfg.seed, "baseline_eval", seed_label)
        return self.reward_state.scorer.score_baseline(self.baseline, problems, metric, seed)

    def baseline_scores(self, metric: str | None = None) -> list[float]:
        """The baseline's score on every hard-train problem in ``metric`` (default: the reward's),
        cached per baseline version: the ``promotion/baseline_hard_train_*`` metrics. Not the
        reward's baseline, which is scored on Q_R as the students are (``step``)."""
        metric, cache = metric or self.cfg.inner.reward_metric, self.state.baseline_scores
        if metric not in cache:
            cache[metric] = self.scores(self.hard.train, self.state.baseline_version, metric)
        return cache[metric]

    # ---- one outer step -----------------------------------------------------------------------
    def step(self, t: int, bar=None) -> dict:
        t_start = time.perf_counter()
        cfg, st, times, m = self.cfg, self.state, {}, {"student/inner_steps": self.state.inner_steps}
        self.grader.reset_stats()
        with phase("teacher_sample", t, times):  # 1. g*n valid pairs per group
            groups, sample_metrics = self.teacher.sample(t)
            maybe_die("teacher_sample", t)
        m.update(sample_metrics)
        datasets_JK = [[as_problems(d, t, gi, k) for k, d in enumerate(group)] for gi, group in enumerate(groups)]
        questions = [p for ds in datasets_JK for d in ds for p in d]
        m.update(self.diversity([p.question for p in questions]))
        if self.oracle is not None:
            m["teacher/answer_correct_frac"] = float(np.mean([self.oracle(p.question) == p.answer for p in questions]))

        qr_idx = draw_reward_questions(len(self.hard.train), cfg.inner.reward_questions,  # 2. Q_R
                                       derive_seed(cfg.seed, "reward_questions", t))
        qr = [self.hard.train[i] for i in qr_idx]
        with phase("baseline_eval", t, times):
            # Q_R alone, as each student scores it: batched greedy decoding (bf16 above all) and batched
            # log-probs depend on what shares a batch, so an unchanged student gets R = 0 exactly only if
            # the baseline is scored in the same layout (not a slice of a hard-train pass). Students whose
            # Q_R goes out in one joint vLLM call (lockstep) share no layout with anyone: vLLM is not
            # batch-invariant.
            base_score = float(np.mean(self.scores(qr, f"qr{t}", cfg.inner.reward_metric)))
        with phase("rewards", t, times):  # 3. R_{k,j}
            results = [self.reward_fn(GroupRecord(ds, self.baseline, qr, base_score, t, gi, st.inner_steps, bar),
                                      self.reward_state) for gi, ds in enumerate(datasets_JK)]
        rewards_KR = np.concatenate([r.rewards_KR for r in results])
        m.update(merge_group_metrics([r.metrics for r in results]))

        # Before the step's first file (promotion, dump) and its teacher update: the last checkpoint is written.
        with phase("checkpoint_wait", t, times):
            self.checkpoints.wait()
            maybe_die("checkpoint_wait", t)
        decision = self.policy.update(rewards_KR)  # 4. promotion (before the teacher update)
        st.history = self.policy.history
        record = None
        if decision.promote:
            with phase("promotion", t, times):
                record = self.promote(t, decision, results, datasets_JK, rewards_KR)

        completions = start_completions(cfg, self.template, t, qr, results, rewards_KR)  # a pool's: during the update
        adv_JK = [dataset_advantages(r.rewards_KR.mean(-1)) for r in results]  # 5. teacher update
        if not cfg.teacher.frozen:
            with phase("teacher_update", t, times):
                m.update(self.teacher.update(groups, adv_JK))

        rewards_K = rewards_KR.mean(-1)
        m.update({"teacher/reward_mean": float(rewards_K.mean()), "teacher/reward_std": float(rewards_K.std()),
                  # the key keeps its old name (base_acc: it holds inner.reward_metric's score): the pre-registered
                  # confirmation's analysis and older runs read it
                  "teacher/reward_max": float(rewards_K.max()), "student/base_acc_qr": base_score,
                  "promotion/moving_average": decision.moving_average, "promotion/promoted": int(decision.promote),
                  "promotion/count": len(st.promotions),
                  "promotion/baseline_hard_train_acc": float(np.mean(self.baseline_scores("accuracy")))})
        if cfg.inner.reward_metric != "accuracy":  # the baseline in the reward's units (student/base_acc_qr too)
            m["promotion/baseline_hard_train_score"] = float(np.mean(self.baseline_scores()))
        m.update(self.grader.stats.as_metrics())
        write_step_dump(self.run.path, cfg, t, datasets_JK, rewards_KR, adv_JK, results, decision, record, completions())
        st.step = t + 1
        m.update(times)
        m["time/phases_s"] = sum(times.values())  # the timed phases only (was time/step_s)
        m["time/step_wall_s"] = time.perf_counter() - t_start  # the whole step, wall clock
        return m

    def promote(self, t, decision, results, datasets_JK, rewards_KR) -> dict:
        """The median student of the best dataset becomes the baseline (a copy: the teacher never
        shares its weights); its dataset joins PQ; K grows."""
        cfg, st, g = self.cfg, self.state, self.cfg.teacher.datasets
        gi, k = divmod(decision.dataset, g)
        student = results[gi].students_KR[k][decision.replicate]
        index = len(st.promotions) + 1
        path = self.run.path / "promoted" / f"promotion_{index:02d}"
        for folder in (path.parent, self.run.path / "teacher"):
            folder.mkdir(exist_ok=True)
        save_model_atomic(student.trainer, path)
        # The teacher that wrote the promoted dataset (before this step's update), for PQ provenance.
        save_model_atomic(self.teacher.trainer, self.run.path / "teacher" / f"step_{t:06d}")
        self.baseline = student.trainer.export_model()
        st.baseline_version, st.baseline_scores = index, {}
        record = {"promotion": index, "step": t + 1, "dataset": decision.dataset, "replicate": decision.replicate,
                  "dataset_reward": float(rewards_KR[decision.dataset].mean()),
                  "replicate_rewards": rewards_KR[decision.dataset].tolist(), "moving_average": decision.moving_average,
                  "reason": decision.reason, "path": str(path.relative_to(self.run.path)), "inner_steps": st.inner_steps,
                  "hard_train_acc": float(np.mean(self.baseline_scores("accuracy"))),
                  "hard_test_acc": float(np.mean(self.scores(self.hard.test, f"test{index}", "accuracy"))),
                  "hard_train_score": float(np.mean(self.baseline_scores()))}
        st.promotions.append(record)
        st.pq += [{**p.to_dict(), "promotion": index, "step": t + 1, "dataset": decision.dataset,
                   "dataset_reward": record["dataset_reward"], "replicate_rewards": record["replicate_rewards"],
                   "seed": cfg.seed} for p in datasets_JK[gi][k]]
        st.inner_steps = min(st.inner_steps + cfg.inner.steps_per_promotion, cfg.inner.max_steps)
        log.info("promotion %d at step %d: %s", index, t + 1, decision.reason)
        return record

    def close(self, raise_errors: bool = True) -> None:
        """Wait for the last checkpoint (re-raising its error unless another is on its way up) and
        close the reward's executor."""
        try:
            self.checkpoints.close(raise_errors)
        finally:
            self.reward_state.close()


def _model_cfg(cfg, path: str):
    return OmegaConf.merge(cfg.model, {"path": path})


def outer_loop_bar(cfg, first_step: int, **tqdm_kwargs):
    """``soar-train``'s progress bar from ``first_step`` to ``loop.steps``. It counts the steps' students
    (datasets, for a reward that trains none): units of like cost, each counted when it is scored (stacked
    students all at once), and its ETA is the run's mean rate (``smoothing=0``), since a step delivers its
    units in a burst: tqdm's default rate, a moving average of the last updates, took the first update's
    one student for the whole first step's time (ETA 1:01:43 for a 7-minute job)."""
    students = student_tasks_per_step(cfg)
    per_step = students or cfg.teacher.groups_per_step * cfg.teacher.datasets
    return progress_bar(cfg.run.progress, total=(cfg.loop.steps - first_step) * per_step, desc="soar-train",
                        unit="student" if students else "dataset", smoothing=0, **tqdm_kwargs)


def run_train(cfg) -> dict:
    """The ``soar-train`` stage: hard set -> outer loop -> Promotion Questions (``pq.jsonl``)."""
    # SIGTERM/SIGUSR1: during setup stop at once (StoppedDuringSetup), then checkpoint at the next step boundary
    stop = StopRequest.install(setting_up=True)
    try:
        stage = setup_stage(cfg, "train", prepare=read_train_inputs)
        try:
            summary = _train(cfg, stage, stop)
        finally:
            stage.close()
    finally:
        stop.restore()
    return summary


def _train(cfg, stage, stop) -> dict:
    run, hard = stage.run, setup_train(cfg, stage)
    loop = Loop(cfg, run, stage.tokenizer, stage.model, hard)
    metrics_log = MetricsLogger(run, resume_step=loop.state.step if run.resume_from is not None else None,
                                console_line=lambda step, metrics: outer_step_line(step, metrics, cfg))
    bar = outer_loop_bar(cfg, loop.state.step)
    stop.setup_done()
    try:
        for t in range(loop.state.step, cfg.loop.steps):
            if stop.requested:
                break
            metrics = loop.step(t, bar)
            metrics_log.log(t + 1, metrics)  # before the checkpoint: a resume truncates rows past it
            loop.checkpoints.after_step(loop.state, force=stop.requested)
            bar.set_postfix(step=t + 1, reward=f"{metrics['teacher/reward_mean']:+.3f}",
                            promotions=len(loop.state.promotions))
        loop.checkpoints.after_step(loop.state, force=True)  # a stop between steps (a no-op when written)
    except BaseException:
        loop.close(raise_errors=False)  # the last finished step's checkpoint still lands
        raise
    bar.close()
    loop.close()
    stop.exit_if_requested(loop.state.step, cfg.loop.steps)
    summary = {"steps": loop.state.step, "promotions": loop.state.promotions, "pq_size": len(loop.state.pq),
               "hard_set": hard.source, "ungradable_golds": hard.ungradable, "run_dir": str(run.path)}
    (run.path / "summary.json").write_text(json.dumps(summary, indent=2))
    metrics_log.close()
    print(train_summary_text(summary), flush=True)
    return summary
