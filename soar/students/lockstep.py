"""Shared-engine multi-LoRA students (``resources.lockstep=true``): the g*r students of an outer step
train together, one inner step at a time, as LoRA adapters on one frozen baseline whose weights they
share (``sharing_copy``: one base in memory, not one per student).

    soar-train experiment=arith_micro backend.student=vllm backend.eval=vllm backend.vllm.enable_lora=true \
        student.lora.r=8 resources.lockstep=true

Each inner step, every student's rollouts go out in one ``soar.generation.generate_many`` call: on a
vLLM engine that is one ``LLM.generate`` carrying one ``LoRARequest`` per student (a fresh adapter
name per version, the previous one removed), with the baseline pushed into the engine once; the
students' Q_R evaluations are likewise one call. Then each student grades and updates. Seeds are
the in-process executor's (``derive_seed(seed, "student", step, group, k, j)``, per-prompt seeds in
the engine), so a student gets the samples it would get alone; on the hf backend the same schedule
runs with one ``generate`` per student.
"""

from __future__ import annotations

import itertools
import time

from soar.generation import correctness_request, generate_many, grade_correctness, make_generator
from soar.policy.scores import Measures, gold_logprobs, score
from soar.policy.trainer import RLOOTrainer
from soar.seeding import derive_seed
from soar.students.executor import StudentExecutor
from soar.students.trainer import StudentResult, batch_indices, sharing_copy

_BASELINES = itertools.count()


class LockstepStudents(StudentExecutor):
    """A student executor (see ``soar.students.pool.make_students``) that batches generation across students."""

    def __init__(self, cfg, tokenizer, grader, template: str):
        super().__init__(cfg, tokenizer, grader, template)
        self.baseline, self.base_key = None, None
        self.live: list = []  # this step's generators; their adapters leave the engine at the next step

    def generators(self, role: str, n: int) -> list:
        """``n`` generators of ``role``, sharing its engine and (for adapters) the baseline in it."""
        gens = [make_generator(self.cfg, role, None, self.tokenizer) for _ in range(n)]
        for gen in gens:
            gen.base_key = self.base_key  # only the vLLM generator reads it
        self.live += gens
        return gens

    def run(self, tasks, baseline, reward_questions, progress=None) -> list[StudentResult]:
        cfg = self.cfg
        self.close()  # the previous step's students are decided by now
        if baseline is not self.baseline:
            self.baseline, self.base_key = baseline, ("lockstep-baseline", next(_BASELINES))
        seeds = [derive_seed(cfg.seed, "student", *task.key) for task in tasks]
        trainers = []
        for task, seed, gen in zip(tasks, seeds, self.generators("student", len(tasks))):
            trainers.append(RLOOTrainer(sharing_copy(baseline), self.tokenizer, self.grader,
                                        task.student_config(cfg.student), self.template, seed,
                                        batch_size=cfg.backend.batch_size, generator=gen))
        histories = [[] for _ in tasks]
        for step in range(max(task.inner_steps for task in tasks)):
            active = [i for i, task in enumerate(tasks) if step < task.inner_steps]
            batches = {i: [tasks[i].problems[x] for x in batch_indices(len(tasks[i].problems), step,
                                                                         trainers[i].cfg.questions_per_step, seeds[i])]
                       for i in active}
            t0 = time.perf_counter()
            samples = generate_many([(trainers[i].sampler(), *trainers[i].rollout_request(batches[i])) for i in active])
            share = (time.perf_counter() - t0) / len(active)  # each student's share of the joint call
            for i, samples_QG in zip(active, samples):
                histories[i].append(trainers[i].step(batches[i], samples_QG, share).metrics)

        # Q_R: every student's evaluation in one call, each with its own seed (as ``train_student``)
        def correctness_SM():
            requests = []
            for trainer, seed, gen in zip(trainers, seeds, self.generators("eval", len(tasks))):
                gen.sync_weights(trainer.model)
                requests.append((gen, *correctness_request(reward_questions, self.template, cfg.student.eval_max_tokens or
                                                           cfg.student.max_tokens, tuple(cfg.student.stop),
                                                           cfg.inner.accuracy_samples, derive_seed(seed, "eval"))))
            return [grade_correctness(self.grader, reward_questions, outs) for outs in generate_many(requests)]

        def gold_logprobs_SM():  # one forward pass per student, nothing to generate
            return [gold_logprobs(t.model, self.tokenizer, reward_questions, self.template, cfg.inner.gold_completion)
                    for t in trainers]

        scores_S = score(cfg.inner.reward_metric, Measures(correctness_SM, gold_logprobs_SM))
        for trainer in trainers:  # trained and scored: the policies are all the step needs from here on
            trainer.keep_policy_only()
        return self.finish(tasks, scores_S, histories, trainers, progress=progress)

    def close(self) -> None:
        for gen in self.live:
            if hasattr(gen, "release"):
                gen.release()
        self.live = []

