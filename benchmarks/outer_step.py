"""Where the wall time of one SOAR outer step goes, per phase and per kind of work, and how much of
it is overhead (everything but generation, forward/backward and the optimiser; target <= 15 %), for
the one-by-one students (``resources.batched=false``, the old path) and the stacked ones (``true``,
the new path) in one run, and the speed-up of the new path over the old. Writes JSON with machine info.

    python benchmarks/outer_step.py --out benchmarks/results/outer_step.json -- \
        loop.hard_set=runs/methods/hard_set run.threads=1
    python benchmarks/outer_step.py --paths new -- ...     # one path only

Runs ``soar.train`` on ``experiment=arith`` (``loop.steps=2``; Hydra overrides after ``--`` are
appended) in a temporary run dir, with the functions that do the work wrapped by timers (restored
afterwards). Time is exclusive: a timed call's own time excludes the timed calls inside it, so the
greedy generation inside a student's evaluation counts once, as generation in student_evaluation.
Each cell is (phase, kind): the phase is the innermost enclosing phase function, the kind the work
function itself (generation / forward_backward / optimizer / grading / io) or ``other`` (the phase's
own code: model copies, tokenisation, packing, bookkeeping). A step runs from ``Loop.step`` to the
end of its checkpoint; time in it outside every timed call is ``loop_other``. The loop's own
``time/*_s`` metrics are read back from ``metrics.jsonl``. The first step pays one-off costs
(loading the embedder, the baseline's hard-train evaluation): the summary reports all steps and,
with 2 or more steps, the steady state without the first.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import tempfile
import time
from collections import defaultdict
from pathlib import Path

WORK_KINDS = ("generation", "forward_backward", "optimizer")
"""The work a step exists for; everything else is overhead."""
OVERHEAD_TARGET = 0.15


class StepTimers:
    """Exclusive seconds per (phase, kind) for each outer step, by wrapping functions in place."""

    def __init__(self):
        self.stack: list[list] = []  # frames: [phase, kind, start, seconds of timed children]
        self.cells: dict[tuple[str, str], float] = defaultdict(float)
        self.step_start: float | None = None
        self.steps: list[dict] = []
        self._patched: list[tuple[object, str, object]] = []

    def wrap(self, owner, name: str, phase: str | None = None, kind: str = "other", opens_step=False,
             closes_step=False) -> None:
        """Time ``owner.name``; ``phase`` None: the call belongs to the phase of its caller."""
        own = name in vars(owner)  # inherited (AdamW.step is Adam's): restoring removes the override
        original = vars(owner)[name] if own else getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if opens_step and not self.stack:
                self.cells.clear()  # drop setup time (model loads, hard set) and start the step
                self.step_start = time.perf_counter()
            if closes_step and not self.stack and self.step_start is None:
                return original(*args, **kwargs)  # the run's last checkpoint call, after its last step: no step
            frame = [phase or (self.stack[-1][0] if self.stack else "outside"), kind, time.perf_counter(), 0.0]
            self.stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                self.stack.pop()
                elapsed = time.perf_counter() - frame[2]
                self.cells[(frame[0], frame[1])] += elapsed - frame[3]
                if self.stack:
                    self.stack[-1][3] += elapsed
                elif closes_step:
                    self._close_step()

        setattr(owner, name, timed)
        self._patched.append((owner, name, original if own else None))

    def _close_step(self) -> None:
        total, self.step_start = time.perf_counter() - self.step_start, None
        cells = dict(self.cells)
        cells[("loop_other", "other")] = cells.get(("loop_other", "other"), 0.0) + total - sum(cells.values())
        self.steps.append({"total_s": total, "cells": cells})
        self.cells.clear()

    def restore(self) -> None:
        for owner, name, original in reversed(self._patched):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._patched.clear()


def instrument(timers: StepTimers) -> None:
    import torch

    import soar.loop
    import soar.metrics_log
    import soar.policy.trainer
    import soar.rewards
    import soar.state
    import soar.students.trainer
    import soar.vllm_backend  # imports vllm only when an engine starts
    from soar.diversity import DiversityMeter
    from soar.generation import HFGenerator
    from soar.grading import Grader, MathVerifyGrader
    from soar.stacked_llama import StackedLlama
    from soar.students.lockstep import LockstepStudents
    from soar.students.pool import InProcessStudents, StudentPool
    from soar.students.stacked import StackedOptimizer, StackedStudents
    from soar.teachers.update import TeacherPolicy

    # Work: the same function counts as the phase of whoever calls it.
    timers.wrap(HFGenerator, "generate", kind="generation")
    timers.wrap(soar.vllm_backend.VLLMGenerator, "generate", kind="generation")
    timers.wrap(soar.vllm_backend, "generate_together", kind="generation")
    timers.wrap(soar.policy.trainer.RLOOTrainer, "accumulate_gradients", kind="forward_backward")
    timers.wrap(StackedLlama, "sample", kind="generation")
    timers.wrap(StackedLlama, "prefill", kind="forward_backward")
    timers.wrap(StackedLlama, "tree_logprobs", kind="forward_backward")
    timers.wrap(torch.Tensor, "backward", kind="forward_backward")
    timers.wrap(StackedOptimizer, "step", kind="optimizer")
    # Before any AdamW exists: its first instance hooks the class's step, and each scheduler wraps it.
    timers.wrap(torch.optim.AdamW, "step", kind="optimizer")
    timers.wrap(Grader, "grade_batch", kind="grading")
    timers.wrap(MathVerifyGrader, "grade_batch", kind="grading")
    timers.wrap(soar.loop, "save_model_atomic", kind="io")  # promoted students, teacher snapshots
    timers.wrap(soar.state, "save_model_atomic", kind="io")  # kept teachers (loop.keep_every)
    # Phases: the innermost one on the stack owns the work below it.
    timers.wrap(soar.loop.Loop, "step", phase="loop_other", opens_step=True)
    timers.wrap(TeacherPolicy, "sample", phase="teacher_sampling")
    timers.wrap(DiversityMeter, "__call__", phase="diversity")
    for executor in (InProcessStudents, StudentPool, LockstepStudents, StackedStudents):  # incl. a Ray pool's
        timers.wrap(executor, "run", phase="student_training")
    timers.wrap(soar.students.trainer, "train_student", phase="student_training")
    timers.wrap(StackedStudents, "_score", phase="student_evaluation")
    timers.wrap(soar.policy.trainer.RLOOTrainer, "evaluate", phase="student_evaluation")  # trained students on Q_R
    timers.wrap(soar.loop.Loop, "scores", phase="student_evaluation")  # the baseline on Q_R, hard-train, hard-test
    timers.wrap(soar.rewards, "success_rates", phase="student_evaluation")  # the base student on teacher questions
    timers.wrap(soar.loop.Loop, "promote", phase="promotion")
    timers.wrap(TeacherPolicy, "update", phase="teacher_update")
    timers.wrap(soar.loop, "write_step_dump", phase="checkpoint_dumps")
    timers.wrap(soar.metrics_log.MetricsLogger, "log", phase="checkpoint_dumps")
    timers.wrap(soar.state.Checkpoints, "after_step", phase="checkpoint_dumps", closes_step=True)


def breakdown(total: float, cells: dict[tuple[str, str], float]) -> dict:
    """Categories (phases, with grading pulled out of every phase), kinds, the overhead fraction."""
    categories, kinds, matrix = defaultdict(float), defaultdict(float), defaultdict(dict)
    for (phase, kind), seconds in cells.items():
        categories["grading" if kind == "grading" else phase] += seconds
        kinds[kind] += seconds
        matrix[phase][kind] = seconds
    overhead = total - sum(kinds.get(k, 0.0) for k in WORK_KINDS)

    def shares(d):
        ordered = sorted(d.items(), key=lambda kv: -kv[1])
        return {k: {"s": round(v, 4), "share": round(v / total, 4)} for k, v in ordered}

    return {"total_s": round(total, 4), "categories": shares(categories), "kinds": shares(kinds),
            "overhead_s": round(overhead, 4), "overhead_frac": round(overhead / total, 4),
            "phase_x_kind_s": {p: {k: round(v, 4) for k, v in row.items()} for p, row in matrix.items()}}


def mean_step(steps: list[dict]) -> dict:
    cells = defaultdict(float)
    for s in steps:
        for key, v in s["cells"].items():
            cells[key] += v / len(steps)
    out = breakdown(sum(s["total_s"] for s in steps) / len(steps), cells)
    out.update(steps=len(steps), target_overhead_frac=OVERHEAD_TARGET,
               target_met=out["overhead_frac"] <= OVERHEAD_TARGET)
    return out


def measure(overrides: list[str], run_dir: str) -> dict:
    """One ``soar.train`` run of ``overrides`` in ``run_dir``, timed."""
    import soar
    from soar.metrics_log import read_metrics

    cfg = soar.compose(overrides)
    timers = StepTimers()
    instrument(timers)
    load_start, t0 = os.getloadavg(), time.perf_counter()
    try:
        soar.train(cfg)
    finally:
        timers.restore()
    wall = time.perf_counter() - t0
    # The loop's own timings, and what explains a step's size (a skipped teacher update costs ~0).
    loop_times = [{k: v for k, v in row.items() if k.startswith(("time/", "compute/")) or k in
                   ("student/inner_steps", "teacher/skipped_zero_adv", "promotion/promoted")}
                  for row in read_metrics(Path(run_dir) / "metrics.jsonl")]
    steps = [{"step": i + 1, **breakdown(s["total_s"], s["cells"]), "loop_metrics": loop_times[i]}
             for i, s in enumerate(timers.steps)]
    summary = {"all_steps": mean_step(timers.steps)}
    if len(timers.steps) >= 2:
        summary["steady_state"] = mean_step(timers.steps[1:])  # without the first step's one-off costs
    c = cfg
    return {"config": {"overrides": overrides, "threads": c.run.threads, "g": c.teacher.datasets,
                       "n": c.teacher.questions_per_dataset, "r": c.inner.replicates, "K": c.student.max_steps,
                       "M": c.inner.reward_questions, "steps": c.loop.steps, "backend": c.backend.name,
                       "num_workers": c.resources.num_workers, "batched": c.resources.batched},
            "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg(),
            "run_wall_s": wall, "setup_s": wall - sum(s["total_s"] for s in timers.steps),
            "summary": summary, "steps": steps}


PATHS = {"old": "resources.batched=false", "new": "resources.batched=true"}
"""The student paths compared: one by one in process (old) and stacked (new)."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/outer_step.json")
    ap.add_argument("--run-dir", default=None, help="keep the runs here (default: a temporary dir)")
    ap.add_argument("--paths", default="old,new", help="which student paths to time, in order (old, new)")
    ap.add_argument("--steps", type=int, default=3, help="outer steps per path (the first pays one-off costs)")
    ap.add_argument("--experiment", default="arith", help="the preset timed")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as scripts/quickstart.sh; before torch starts OpenMP
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from soar.run import package_versions

    runs = {}
    with tempfile.TemporaryDirectory(prefix="outer_step_") as tmp:
        for name in args.paths.split(","):
            run_dir = str(Path(args.run_dir or tmp) / name)
            overrides = [f"experiment={args.experiment}", f"loop.steps={args.steps}", "run.progress=false",
                         "run.loggers=[jsonl]", f"run.dir={run_dir}", PATHS[name], *args.overrides]
            runs[name] = measure(overrides, run_dir)
    out = {"benchmark": "outer_step",
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": platform.processor()},
           "versions": package_versions(), "paths": runs}
    if {"old", "new"} <= runs.keys():
        key = "steady_state" if "steady_state" in runs["old"]["summary"] else "all_steps"
        old, new = (runs[p]["summary"][key]["total_s"] for p in ("old", "new"))
        out["speedup"] = {"measured_over": key, "old_step_s": old, "new_step_s": new, "speedup": old / new}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    for name, run in runs.items():
        for label, s in run["summary"].items():
            print(f"{name} {label}: {s['total_s']:.2f} s/step, overhead {s['overhead_frac']:.1%} "
                  f"(target <= {OVERHEAD_TARGET:.0%}: {'met' if s['target_met'] else 'NOT met'})")
            print("  " + ", ".join(f"{k} {v['s']:.2f} s ({v['share']:.1%})" for k, v in s["categories"].items()))
            print("  " + ", ".join(f"{k} {v['s']:.2f} s ({v['share']:.1%})" for k, v in s["kinds"].items()))
    if "speedup" in out:
        sp = out["speedup"]
        print(f"speed-up ({sp['measured_over']}): {sp['old_step_s']:.1f} s -> {sp['new_step_s']:.1f} s a step, "
              f"{sp['speedup']:.2f}x")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
