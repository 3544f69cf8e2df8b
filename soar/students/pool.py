"""Where the g*r students of an outer step train: in the driver one after another
(``resources.num_workers=0``, the default) or on a persistent Ray pool of W worker processes.

    soar-train experiment=arith_micro resources.num_workers=2 resources.threads_per_worker=1

- Workers (``StudentWorker`` actors) are created once per run; each holds the tokenizer, the grader,
  its generators and a copy of the current baseline. The baseline travels (one ``ray.put``, then a
  reference to every worker) only when the loop hands over a different baseline object, i.e. after
  a promotion; students carry only their dataset.
- A student is a task (step, group, k, j) seeded with ``derive_seed(seed, "student", step, group, k, j)``;
  it reads only the baseline, its dataset and Q_R, so its result does not depend on W, on the
  worker it lands on or on completion order (results go back in task order).
- Trained students stay in their worker (the policy weights only; optimiser and reference are
  dropped) until the promotion decision. The driver gets a ``RemoteStudent`` per student: its
  ``sampler()`` generates inside the worker (the step dump's completions), its ``export_model`` /
  ``save_pretrained`` fetch the weights, so only the promoted student's weights travel back. A worker
  drops its kept students when it gets a task of a later step.
- A worker that dies mid-student (OOM, SIGKILL, node loss) is replaced by a fresh actor that gets
  the current baseline, and the student reruns from its seed with an identical result; a second
  failure of the same student fails the run naming it. A kept student lost with its worker is
  retrained from its seed when it is needed.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
from collections import deque
from dataclasses import dataclass

import torch
from omegaconf import OmegaConf

from soar.faults import maybe_die
from soar.generation import make_generator
from soar.grading import make_grader
from soar.seeding import derive_seed
from soar.students import trainer  # trainer.train_student looked up per call (benchmarks/outer_step.py times it)
from soar.students.executor import StudentExecutor, StudentHandle
from soar.students.lockstep import LockstepStudents
from soar.students.promotion import promotion_candidates
from soar.students.stacked import StackedStudents

# ray is imported inside the worker and pool methods: a run without a pool (resources.num_workers=0)
# never starts or imports Ray.

log = logging.getLogger("soar.pool")

FORWARDED_ENV = ("SOAR_FAULT", "SOAR_FAULT_ONCE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "SOAR_SET_ALLOC_CONF")
"""What the workers inherit from the driver: fault injection (``soar.faults``) and the CUDA allocator's
settings (``soar.machine.use_expandable_segments``; a cluster's workers start from ``ray start``'s
environment, not the driver's)."""


STARTUP_TIMEOUT_S = 300
"""Seconds the workers may take to start (imports ~4 s each here); longer means Ray cannot place them."""


class PoolError(RuntimeError):
    """A student could not be trained (its worker died twice)."""


def gpu_shortfall(workers: int, gpus_per_student: float, ray_gpus: float) -> str | None:
    """Why ``workers`` workers of ``gpus_per_student`` GPUs each cannot all start on ``ray_gpus`` GPUs,
    naming the worker count and the GPU share that would fit; None when they fit."""
    need = workers * gpus_per_student
    if need <= ray_gpus + 1e-9:
        return None
    what = f"resources.num_workers: {workers} workers x resources.gpus_per_student {gpus_per_student:g} = {need:g} GPUs"
    if ray_gpus < 1:
        return f"{what}, but Ray has none: set resources.gpus_per_student=0 to train on CPU, or give Ray the GPUs"
    per_gpu = math.ceil(workers / int(ray_gpus))
    share = math.floor(1e4 / per_gpu) / 1e4  # rounded down: per_gpu shares never exceed one GPU
    return (f"{what}, but Ray has {ray_gpus:g}: use at most {int(ray_gpus // gpus_per_student)} workers, or "
            f"resources.gpus_per_student={share:g} to put {per_gpu} on each GPU")


@dataclass(frozen=True)
class StudentTask:
    step: int
    """Outer step t (0-based)."""
    group: int
    """Group of g datasets within the step."""
    k: int
    """Dataset index within the group."""
    j: int
    """Replicate index."""
    problems: tuple
    """The dataset X_k (``Problem``s)."""
    inner_steps: int
    """K: RLOO steps of this student."""

    @property
    def key(self) -> tuple[int, int, int, int]:
        return self.step, self.group, self.k, self.j

    @property
    def name(self) -> str:
        return f"student (step {self.step}, group {self.group}, k {self.k}, j {self.j})"

    def student_config(self, student_cfg):
        """``student_cfg`` with this task's K."""
        return OmegaConf.merge(student_cfg, {"max_steps": self.inner_steps})


class StudentRunner:
    """Trains one student task against a baseline: the same code in the driver and in every worker."""

    def __init__(self, cfg, tokenizer, grader, template: str):
        self.cfg, self.tokenizer, self.grader, self.template = cfg, tokenizer, grader, template
        self.rollout_gen = make_generator(cfg, "student", None, tokenizer)
        self.eval_gen = make_generator(cfg, "eval", None, tokenizer)

    def run(self, baseline, task: StudentTask, reward_questions):
        cfg = self.cfg
        return trainer.train_student(baseline, self.tokenizer, self.grader, list(task.problems),
                                     task.student_config(cfg.student), self.template,
                                     derive_seed(cfg.seed, "student", *task.key), {"qr": reward_questions},
                                     cfg.inner.accuracy_samples, cfg.backend.batch_size, self.rollout_gen, self.eval_gen,
                                     cfg.inner.reward_metric, cfg.inner.gold_completion)


class InProcessStudents(StudentExecutor):
    """``resources.num_workers=0``: every student in this process, one after another. Of the trained
    students only those that may still be promoted or dumped keep their policy
    (``promotion_candidates``: the running best dataset's median replicate and the dataset in
    training), so a group holds at most r + 1 policies, not g*r (16 x 6.4 GB at 3B); the others keep
    their scores and history (``trainer`` None)."""

    def __init__(self, runner: StudentRunner):
        super().__init__(runner.cfg, runner.tokenizer, runner.grader, runner.template)
        self.runner = runner

    def run(self, tasks: list[StudentTask], baseline, reward_questions, progress=None) -> list:
        out = []
        for task in tasks:
            res = self.runner.run(baseline, task, reward_questions)
            res.trainer.keep_policy_only()  # before the next student: one model copy kept per student, not ~4
            out += self.finish([task], [res.correct["qr"]], [res.history], [res.trainer], progress=progress)
            del res  # its trainer lives on in the result only, where drop_unpromotable may free it
            drop_unpromotable(tasks, out)
            for gen in (self.runner.rollout_gen, self.runner.eval_gen):
                gen.sync_weights(None)  # let go of this student: a kept one is synced again when used
        return out


def drop_unpromotable(tasks: list[StudentTask], results: list) -> None:
    """Release the policies of ``results`` (those of the first ``len(results)`` of ``tasks``) that can
    no longer be promoted or dumped, per group of the step (``promotion_candidates`` on Q_R scores)."""
    replicates: dict = {}
    for task in tasks:
        key = (task.step, task.group)
        replicates[key] = max(replicates.get(key, 0), task.j + 1)
    scores: dict = {}  # (step, group) -> k -> {j: Q_R score}
    for task, res in zip(tasks, results):
        scores.setdefault((task.step, task.group), {}).setdefault(task.k, {})[task.j] = res.accuracy["qr"]
    keep = set()
    for (step, group), by_k in scores.items():
        js = {k: sorted(by_j) for k, by_j in by_k.items()}
        rows = [[by_k[k][j] for j in js[k]] if k in by_k else [] for k in range(1 + max(by_k))]
        keep |= {(step, group, k, js[k][i]) for k, i in promotion_candidates(rows, replicates[(step, group)])}
    for task, res in zip(tasks, results):
        if task.key not in keep:
            res.trainer = None


class StudentWorker:
    """One pool process (a Ray actor): a ``StudentRunner``, the current baseline and the students it
    trained in the current step (kept until the promotion decision)."""

    def __init__(self, cfg_container: dict, tokenizer, threads: int):
        import ray

        torch.set_num_threads(threads)
        cfg = OmegaConf.create(cfg_container)
        self.runner = StudentRunner(cfg, tokenizer, make_grader(cfg.data.grader), cfg.data.prompt_template)
        self.baseline, self.kept = None, {}
        self.where = {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    def ready(self) -> dict:
        return self.where

    def set_baseline(self, baseline) -> None:
        self.baseline = baseline

    def train(self, task: StudentTask, reward_questions) -> dict:
        self.kept = {key: policy for key, policy in self.kept.items() if key[0] == task.step}
        self.runner.grader.reset_stats()
        res = self.runner.run(self.baseline, task, reward_questions)
        maybe_die("pool_student", ":".join(map(str, task.key)))  # the result is lost with the worker
        self.kept[task.key] = res.trainer.model
        return {"correct": res.correct, "history": res.history,
                "grading": self.runner.grader.stats, **self.where}

    def generate(self, key, prompts, params):
        gen = self.runner.rollout_gen
        gen.sync_weights(self.kept[key])
        return gen.generate(prompts, params)

    def fetch(self, key):
        return self.kept[key]


class RemoteStudent(StudentHandle):
    """Stands in for a trained student's ``RLOOTrainer`` while the student lives in a pool worker."""

    generates_in_worker = True
    """``generate`` runs in the worker: the driver may work meanwhile (``soar.loop.Loop.start_completions``)."""

    def __init__(self, pool: "StudentPool", key, tokenizer):
        self.pool, self.key, self.tokenizer, self._policy = pool, key, tokenizer, None

    def policy(self):
        """The student's weights, fetched from its worker once."""
        if self._policy is None:
            self._policy = self.pool.call_kept(self.key, "fetch")
        return self._policy

    def sampler(self, generator=None):
        """A generator on this student: ``generator`` synced to the fetched weights, else (no
        transfer) this handle, which generates inside the worker."""
        if generator is None:
            return self
        generator.sync_weights(self.policy())
        return generator

    def sync_weights(self, model) -> None:
        pass

    def generate(self, prompts, params):
        return self.pool.call_kept(self.key, "generate", prompts, params)


class StudentPool(StudentExecutor):
    """W persistent ``StudentWorker`` actors; ``run`` trains a step's students on them."""

    def __init__(self, cfg, tokenizer, grader):
        import ray

        super().__init__(cfg, tokenizer, grader, cfg.data.prompt_template)  # grader: where the workers' stats add up
        self.res = cfg.resources
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:  # "local": a bare ray.init() would join any cluster running on this machine
            local = {"include_dashboard": False} if self.res.ray_address is None else {}
            ray.init(address=self.res.ray_address or "local", log_to_driver=False, logging_level=logging.WARNING,
                     **local)
        self.check_capacity()
        self.cfg_container = OmegaConf.to_container(cfg, resolve=True)
        self.tokenizer_ref = ray.put(tokenizer)
        self.actor_cls = ray.remote(StudentWorker)
        self.baseline, self.baseline_ref = None, None
        self.generation = [0] * self.res.num_workers  # bumps when a slot's worker is replaced
        self.workers = [self.spawn() for _ in range(self.res.num_workers)]
        self.kept_at: dict = {}  # student key -> (slot, generation, task, reward questions)
        atexit.register(self.close)
        try:  # imports done; startup errors surface here
            ray.get([w.ready.remote() for w in self.workers], timeout=STARTUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as exc:
            self.close()
            r = self.res
            raise PoolError(f"resources.num_workers: {r.num_workers} workers x {r.threads_per_worker} CPUs "
                            f"(+{r.gpus_per_student} GPUs each) did not start within {STARTUP_TIMEOUT_S} s; "
                            f"Ray has {ray.available_resources()} free") from exc

    def check_capacity(self) -> None:
        """Refuse, before any worker waits on Ray, a pool whose workers cannot all hold their GPU
        share at once: Ray would start some and leave the rest pending until ``STARTUP_TIMEOUT_S``."""
        import ray

        message = gpu_shortfall(self.res.num_workers, self.res.gpus_per_student, ray.cluster_resources().get("GPU", 0.0))
        if message is not None:
            if self.owns_ray:
                ray.shutdown()
            raise PoolError(message)

    def spawn(self):
        t = self.res.threads_per_worker
        env = {"OMP_NUM_THREADS": str(t), "MKL_NUM_THREADS": str(t), "OMP_WAIT_POLICY": "PASSIVE",
               "TOKENIZERS_PARALLELISM": "false", **{k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}}
        worker = self.actor_cls.options(num_cpus=t, num_gpus=self.res.gpus_per_student, max_restarts=0,
                                        runtime_env={"env_vars": env}).remote(self.cfg_container, self.tokenizer_ref, t)
        if self.baseline_ref is not None:
            worker.set_baseline.remote(self.baseline_ref)  # actor calls run in order: before any train
        return worker

    def replace(self, slot: int) -> None:
        import ray

        ray.kill(self.workers[slot], no_restart=True)
        self.generation[slot] += 1
        self.workers[slot] = self.spawn()

    def worker_pids(self) -> list[int]:
        import ray

        return [w["pid"] for w in ray.get([w.ready.remote() for w in self.workers])]

    def run(self, tasks: list[StudentTask], baseline, reward_questions, progress=None) -> list:
        """Train ``tasks`` on the pool; results (``StudentResult`` with a ``RemoteStudent``) in task order."""
        import ray

        if baseline is not self.baseline:  # a promotion (or the first step): the only weight transfer
            self.baseline, self.baseline_ref = baseline, ray.put(baseline)
            for w in self.workers:
                w.set_baseline.remote(self.baseline_ref)
        qr_ref = ray.put(reward_questions)
        self.kept_at = {key: kept for key, kept in self.kept_at.items() if key[0] == tasks[0].step}  # as the workers do
        pending, idle, inflight = deque(range(len(tasks))), deque(range(len(self.workers))), {}
        failures, results = {}, [None] * len(tasks)
        while pending or inflight:
            while pending and idle:
                slot, i = idle.popleft(), pending.popleft()
                inflight[self.workers[slot].train.remote(tasks[i], qr_ref)] = (slot, i)
            [ref], _ = ray.wait(list(inflight), num_returns=1)
            slot, i = inflight.pop(ref)
            task = tasks[i]
            try:
                out = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                failures[task.key] = failures.get(task.key, 0) + 1
                if failures[task.key] >= 2:
                    raise PoolError(f"{task.name} failed twice: its worker died both times ({exc})") from exc
                log.warning("%s: worker %d died; replacing it and rerunning the student from its seed", task.name, slot)
                self.replace(slot)
                pending.appendleft(i)
                idle.append(slot)
                continue
            idle.append(slot)
            self.grader.stats.add(out["grading"])
            where = {"pid": out["pid"], "node_id": out["node_id"], "worker": slot,
                     "attempts": failures.get(task.key, 0) + 1}
            self.kept_at[task.key] = (slot, self.generation[slot], task, qr_ref)
            [results[i]] = self.finish([task], [out["correct"]["qr"]], [out["history"]],
                                       [RemoteStudent(self, task.key, self.tokenizer)], [where], progress)
        return results

    def call_kept(self, key, method: str, *args):
        """Call ``method`` of the worker holding student ``key``; a student lost with its worker
        is first retrained from its seed (identical weights)."""
        import ray

        slot, generation, task, qr_ref = self.kept_at[key]
        for _ in range(2):
            try:
                if self.generation[slot] != generation:
                    ray.get(self.workers[slot].train.remote(task, qr_ref))
                    generation = self.generation[slot]
                    self.kept_at[key] = (slot, generation, task, qr_ref)
                return ray.get(getattr(self.workers[slot], method).remote(key, *args))
            except ray.exceptions.RayActorError:
                log.warning("%s: its worker died; retraining it from its seed", task.name)
                self.replace(slot)
        raise PoolError(f"{task.name}: its worker died twice while serving it")

    def close(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
        if self.owns_ray:
            ray.shutdown()


def student_executor(cfg) -> str:
    """Where a run's students train: ``pool`` (``resources.num_workers`` > 0), ``lockstep``, ``batched``
    (``resources.batched`` with fully fine-tuned students: float32, or bf16/fp16 with fp32 masters) or
    ``in_process`` (one by one)."""
    r = cfg.resources
    if r.num_workers > 0:
        return "pool"
    if r.lockstep:
        return "lockstep"
    return "batched" if r.batched and cfg.student.lora.r == 0 else "in_process"


def make_students(cfg, tokenizer, grader, template: str):
    """The run's student executor (``student_executor``): ``StudentPool``, the lockstep multi-LoRA students
    (``soar.students.lockstep``), the stacked students (``soar.students.stacked``) or in-process."""
    kind = student_executor(cfg)
    log.info("students: %s", kind)
    if kind == "pool":
        return StudentPool(cfg, tokenizer, grader)
    if kind == "lockstep":
        return LockstepStudents(cfg, tokenizer, grader, template)
    if kind == "batched":
        return StackedStudents(cfg, tokenizer, grader, template)
    return InProcessStudents(StudentRunner(cfg, tokenizer, grader, template))
