"""Where the wall time of one SOAR outer step goes, per phase and per kind of work, and how much of
it is overhead (everything but generation, forward/backward and the optimiser; target <= 15 %).
Writes JSON with machine info.

    python benchmarks/outer_step.py --out benchmarks/results/outer_step.json -- \
        loop.hard_set=runs/methods/hard_set run.threads=1

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
        total = time.perf_counter() - self.step_start
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
    import soar.run
    import soar.students.trainer
    import soar.vllm_backend  # imports vllm only when an engine starts
    from soar.diversity import DiversityMeter
    from soar.generation import HFGenerator
    from soar.grading import Grader, MathVerifyGrader
    from soar.teachers.rewards import GroundedReward, IntrinsicReward
    from soar.teachers.update import TeacherPolicy

    # Work: the same function counts as the phase of whoever calls it.
    timers.wrap(HFGenerator, "generate", kind="generation")
    timers.wrap(soar.vllm_backend.VLLMGenerator, "generate", kind="generation")
    timers.wrap(soar.vllm_backend, "generate_together", kind="generation")
    timers.wrap(soar.students.trainer.RLOOTrainer, "accumulate_gradients", kind="forward_backward")
    # Before any AdamW exists: its first instance hooks the class's step, and each scheduler wraps it.
    timers.wrap(torch.optim.AdamW, "step", kind="optimizer")
    timers.wrap(Grader, "grade_batch", kind="grading")
    timers.wrap(MathVerifyGrader, "grade_batch", kind="grading")
    timers.wrap(soar.loop, "save_model_atomic", kind="io")  # promoted students, teacher snapshots
    # Phases: the innermost one on the stack owns the work below it.
    timers.wrap(soar.loop.Loop, "step", phase="loop_other", opens_step=True)
    timers.wrap(TeacherPolicy, "sample", phase="teacher_sampling")
    timers.wrap(DiversityMeter, "__call__", phase="diversity")
    timers.wrap(GroundedReward, "__call__", phase="student_training")  # incl. a Ray pool's students
    timers.wrap(soar.students.trainer, "train_student", phase="student_training")
    timers.wrap(soar.students.trainer.RLOOTrainer, "evaluate", phase="student_evaluation")  # trained students on Q_R
    timers.wrap(soar.loop.Loop, "correctness", phase="student_evaluation")  # the baseline on hard-train/test
    timers.wrap(IntrinsicReward, "__call__", phase="student_evaluation")  # the base student on teacher questions
    timers.wrap(soar.loop.Loop, "promote", phase="promotion")
    timers.wrap(TeacherPolicy, "update", phase="teacher_update")
    timers.wrap(soar.loop.Loop, "dump", phase="checkpoint_dumps")
    timers.wrap(soar.run.MetricsLogger, "log", phase="checkpoint_dumps")
    timers.wrap(soar.loop.Loop, "checkpoint", phase="checkpoint_dumps", closes_step=True)


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/outer_step.json")
    ap.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary dir)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as scripts/quickstart.sh; before torch starts OpenMP
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import soar
    from soar.run import package_versions, read_metrics

    with tempfile.TemporaryDirectory(prefix="outer_step_") as tmp:
        run_dir = args.run_dir or str(Path(tmp) / "run")
        # The teacher's LR schedule spans the full run (teacher.max_steps defaults to loop.steps, and
        # its warm-up is longer than 2 steps): these are the first steps of the default run.
        horizon = soar.compose(["experiment=arith"]).loop.steps
        overrides = ["experiment=arith", "loop.steps=2", f"teacher.max_steps={horizon}", "run.progress=false",
                     "run.loggers=[jsonl]", f"run.dir={run_dir}", *args.overrides]
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
    out = {"benchmark": "outer_step",
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": platform.processor(),
                       "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg()},
           "versions": package_versions(),
           "config": {"overrides": overrides, "threads": c.run.threads, "g": c.teacher.datasets,
                      "n": c.teacher.questions_per_dataset, "r": c.inner.replicates, "K": c.student.max_steps,
                      "M": c.inner.reward_questions, "steps": c.loop.steps, "backend": c.backend.name,
                      "num_workers": c.resources.num_workers},
           "run_wall_s": wall, "setup_s": wall - sum(s["total_s"] for s in timers.steps),
           "summary": summary, "steps": steps}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    for name, s in summary.items():
        print(f"{name}: {s['total_s']:.2f} s/step, overhead {s['overhead_frac']:.1%} "
              f"(target <= {OVERHEAD_TARGET:.0%}: {'met' if s['target_met'] else 'NOT met'})")
        print("  " + ", ".join(f"{k} {v['s']:.2f} s ({v['share']:.1%})" for k, v in s["categories"].items()))
        print("  " + ", ".join(f"{k} {v['s']:.2f} s ({v['share']:.1%})" for k, v in s["kinds"].items()))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
