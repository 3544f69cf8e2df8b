"""What a full ``soar-train`` run of a config will cost, projected from a short calibration.

    soar-estimate                                              # experiment=arith, 1 calibration step
    soar-estimate loop.hard_set=runs/methods/hard_set --calibration-steps 2 run.threads=1

It runs ``calibration_steps`` outer steps of the config, exactly as ``soar-train`` would start them
(same teacher schedule), in a temporary run dir: the hard set is built there unless ``loop.hard_set``
is given, and its time is part of the projection. Then, with T = ``loop.steps``:

    total = hard_set_s + one_off_s + T * step_s(K)

- ``step_s``: the loop's phases (``time/*_s`` in ``metrics.jsonl``) plus ``other`` (diversity, step
  dump, metrics, checkpoint: the wall time the loop's phases leave out). With 2+ calibration steps,
  the mean of the steps after the first; the first step's surplus (e.g. loading the embedder) is
  paid once. ``baseline_eval`` (the baseline on the step's Q_R, scored as the students are) is paid
  every step. The baseline's pass over hard-train (the ``promotion/baseline_hard_train_*`` metrics)
  is cached per baseline: paid in the first step (its surplus) and again at each promotion (the
  ``promotion`` phase: saves, hard-train and hard-test passes; measured when the calibration
  promoted, else estimated from ``baseline_eval`` scaled from M to the hard-train and hard-test
  sizes, without the saves).
- K: the inner loop grows by ``inner.steps_per_promotion`` per promotion up to ``inner.max_steps``.
  ``low``: no promotion (K = ``student.max_steps`` throughout). ``high``: K = ``inner.max_steps``
  from the first step, the students' phase (``rewards``) scaled by K / K_calibration (its Q_R
  evaluation does not grow with K, so this overstates), and a promotion whenever the window allows.
Student steps and tokens (``compute/*``) are projected the same way. A calibration step whose
teacher update was skipped (all-equal rewards: ``teacher/skipped_zero_adv`` in ``rows``) measures
that phase at ~0 s, so both bounds then leave out the teacher's forward/backward.

``project_layout`` is the other projection: a step's work per phase in one GPU's seconds
(``StepWork``, from single-GPU measurements) laid out on G GPUs held for the whole run, giving the
step's timeline, the busy fraction of the held GPU-time and the allocated GPU-hours
(``benchmarks/layouts.py``, docs/paper_setting.md).
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import open_dict

from soar.config import ConfigError
from soar.loop import Loop
from soar.memory_plan import PROMPT_TOKENS, check_plan, plan, plan_report
from soar.prepare import read_train_inputs, setup_train
from soar.run import MetricsLogger
from soar.stage import resolve_model_path, setup_stage
from soar.team.checks import validate_team
from soar.team.plan import team_plan
from soar.validation import validate

OTHER_PHASE = "other"
"""The part of a step's wall time that the loop's own ``time/*`` phases do not cover."""


PER_BASELINE_PHASES = ("promotion",)
"""Loop phases paid once per baseline (at each promotion), not every step."""


def knobs(cfg) -> dict:
    """The config knobs the cost depends on (paper notation)."""
    return {"g": cfg.teacher.datasets, "n": cfg.teacher.questions_per_dataset, "r": cfg.inner.replicates,
            "K": cfg.student.max_steps, "K_max": cfg.inner.max_steps, "K_per_promotion": cfg.inner.steps_per_promotion,
            "M": cfg.inner.reward_questions, "steps": cfg.loop.steps, "groups_per_step": cfg.teacher.groups_per_step,
            "reward": cfg.teacher.reward, "promotion": bool(cfg.promotion.enabled), "window": cfg.promotion.window}


def calibrate(cfg, steps: int = 1, run_dir: str | Path | None = None) -> dict:
    """Run ``steps`` outer steps in ``run_dir`` (default: a temporary dir, removed), set up exactly as
    ``soar.loop.run_train`` does (``setup_stage`` + ``setup_train``, context checks included) and timed
    piece by piece; returns timings and per-step metrics."""
    if not 1 <= steps <= cfg.loop.steps:
        raise ConfigError(f"config error: calibration steps: {steps} is not in [1, loop.steps={cfg.loop.steps}]")
    cfg = copy.deepcopy(cfg)
    with tempfile.TemporaryDirectory(prefix="soar_estimate_") as tmp:
        with open_dict(cfg):  # a fresh, private run: never resume a real one or log to wandb
            cfg.run.dir, cfg.run.resume, cfg.run.loggers = str(run_dir or tmp), "never", ["jsonl"]
        stage = setup_stage(cfg, "train", prepare=read_train_inputs)
        try:
            hard = setup_train(cfg, stage)
            loop = Loop(cfg, stage.run, stage.tokenizer, stage.model, hard)
            metrics_log = MetricsLogger(stage.run)
            rows = []
            for t in range(steps):
                t0 = time.perf_counter()
                metrics = loop.step(t)
                metrics_log.log(t + 1, metrics)
                loop.checkpoints.after_step(loop.state)
                rows.append({**metrics, "time/wall_s": time.perf_counter() - t0})
            loop.close()  # the last checkpoint is written (loop.async_checkpoint) before the run dir goes
            metrics_log.close()
        finally:
            stage.close()
    return {"steps": steps, "setup_s": stage.seconds["setup_s"], "hard_set_s": stage.seconds["hard_set_s"],
            "hard_set_built": not cfg.loop.hard_set,
            "hard_set": hard.source,  # a built one is gone with the temporary run dir
            "hard_train": len(hard.train), "hard_test": len(hard.test), "K": rows[0]["student/inner_steps"],
            "rows": [{k: v for k, v in r.items() if k.startswith(("time/", "compute/"))
                      or k in ("promotion/promoted", "teacher/skipped_zero_adv")} for r in rows]}


TOTAL_KEYS = ("time/step_s", "time/phases_s", "time/step_wall_s", "time/wall_s")
"""``time/*`` keys that are totals, not phases (``time/step_s``: older runs' name of ``time/phases_s``)."""


def step_phases(row: dict) -> dict[str, float]:
    """One step's seconds by phase: the loop's ``time/<phase>_s`` and the rest of its wall time."""
    phases = {k[len("time/"):-2]: v for k, v in row.items()
              if k.startswith("time/") and k.endswith("_s") and k not in TOTAL_KEYS}
    phases[OTHER_PHASE] = max(row["time/wall_s"] - row.get("time/phases_s", row.get("time/step_s", 0.0)), 0.0)
    return phases


def mean_phases(rows: list[dict]) -> dict[str, float]:
    per_step = [step_phases(r) for r in rows]
    names = sorted({name for p in per_step for name in p})  # e.g. promotion appears in some steps only
    return {name: float(np.mean([p.get(name, 0.0) for p in per_step])) for name in names}


def project(calibration: dict, cfg) -> dict:
    """The full run's time, student steps and tokens, low (no promotion) and high (K = K_max)."""
    rows, k = calibration["rows"], knobs(cfg)
    first = step_phases(rows[0])
    baseline_eval_s = first.get("baseline_eval", 0.0)  # the baseline on M = |Q_R| problems

    def per_step(phases: dict) -> dict:  # per-baseline costs are counted apart
        return {name: 0.0 if name in PER_BASELINE_PHASES else s for name, s in phases.items()}

    if len(rows) >= 2:
        step = per_step(mean_phases(rows[1:]))
        first_step_extra_s = max(sum(per_step(first).values()) - sum(step.values()), 0.0)
    else:  # one step: its one-off costs stay in the per-step time (conservative)
        step, first_step_extra_s = per_step(first), 0.0
    grounded = k["reward"] == "grounded"
    can_promote = grounded and k["promotion"]
    max_promotions = 0
    if can_promote:  # a promotion needs a full window; reset_window makes it a fresh one
        w, steps = k["window"], k["steps"]
        max_promotions = steps // w if cfg.promotion.reset_window else max(steps - w + 1, 0)
    k_cal = calibration["K"]
    k_high = max(k_cal, k["K_max"]) if can_promote and k["K_per_promotion"] > 0 else k_cal
    k_scale = {"low": 1.0, "high": k_high / k_cal}
    # A promotion (measured if the calibration had one): saves, the new baseline on hard-train and on
    # hard-test; else estimated from the baseline's Q_R evaluation, per problem.
    measured = [r["time/promotion_s"] for r in rows if "time/promotion_s" in r]
    promotion_s = (float(np.mean(measured)) if measured else
                   baseline_eval_s * (calibration["hard_train"] + calibration["hard_test"]) / max(k["M"], 1))
    one_off_s = {"low": first_step_extra_s, "high": first_step_extra_s + max_promotions * promotion_s}
    step_s = {b: sum(step.values()) + step.get("rewards", 0.0) * (s - 1) for b, s in k_scale.items()}
    total_s = {b: calibration["hard_set_s"] + one_off_s[b] + k["steps"] * step_s[b] for b in step_s}
    compute = {name: float(np.mean([r.get(name, 0.0) for r in rows])) for name in sorted({n for r in rows for n in r})
               if name.startswith("compute/")}
    student_keys = ("compute/student_steps", "compute/student_tokens")  # grow with K; teacher tokens do not
    totals = {name: {b: k["steps"] * v * (s if name in student_keys else 1.0) for b, s in k_scale.items()}
              for name, v in compute.items()}
    return {"K": {"low": k_cal, "high": k_high}, "max_promotions": max_promotions, "step_s": step_s,
            "one_off_s": one_off_s, "promotion_s": promotion_s, "total_s": total_s,
            "total_hours": {b: s / 3600 for b, s in total_s.items()}, "compute_totals": totals,
            "per_step": {"phases_s": step, "compute": compute}, "first_step_extra_s": first_step_extra_s,
            "baseline_eval_s": baseline_eval_s}


@dataclass(frozen=True)
class StepWork:
    """One outer step's work, phase by phase, in seconds of one GPU (``project_layout``)."""

    student_inner_s: float
    """One inner step of one student: its rollouts, the weight push into an engine, forward/backward
    and optimiser."""
    student_eval_s: float
    """One student's greedy evaluation on Q_R (after its K inner steps)."""
    teacher_sample_s: float
    """Teacher sampling, until g*n valid pairs per group (the driver's GPU)."""
    teacher_update_s: float
    """The teacher's RLOO update (the driver's GPU)."""
    checkpoint_s: float = 0.0
    """Checkpoint time on the step's critical path, every GPU idle (0: written in the background)."""
    dump_s: float = 0.0
    """The step dump's completions on the critical path (0: generated while the teacher updates)."""
    baseline_eval_s: float = 0.0
    """The baseline's greedy pass over hard-train and hard-test, at the start and at each promotion
    (the driver's GPU)."""


def project_layout(work: StepWork, gpus: int, students: int, inner_steps: int, steps: int = 200,
                   promotions: int = 0, driver_trains_students: bool = True) -> dict:
    """A run of ``steps`` outer steps on ``gpus`` GPUs held throughout: per-step timeline, busy
    fraction and allocated GPU-hours (GPUs held x wall time).

    The teacher's phases run on the driver's GPU while the others wait. The ``students`` of a step
    (K = ``inner_steps`` each) are spread evenly over the GPUs that train students: all of them when
    the driver's GPU trains students too (``driver_trains_students``), else one fewer. A GPU with
    more than one student trains them one after another or side by side at the same total time
    (no gain from sharing is assumed), so the students' phase lasts ceil(students / GPUs) students."""
    trainers = gpus if driver_trains_students else gpus - 1
    if trainers < 1 or students < 1 or inner_steps < 1:
        raise ValueError(f"a layout needs a GPU for students and a student: gpus={gpus}, students={students}, "
                         f"inner_steps={inner_steps}, driver_trains_students={driver_trains_students}")
    student_s = inner_steps * work.student_inner_s + work.student_eval_s
    per_gpu = math.ceil(students / trainers)
    timeline = [  # (phase, seconds, GPUs busy on average during it)
        ("teacher_sample", work.teacher_sample_s, 1.0),
        ("students", per_gpu * student_s, students / per_gpu),
        ("teacher_update", work.teacher_update_s, 1.0),
        ("dump", work.dump_s, 1.0),
        ("checkpoint", work.checkpoint_s, 0.0),
    ]
    step_s = sum(seconds for _, seconds, _ in timeline)
    busy_gpu_s = sum(seconds * busy for _, seconds, busy in timeline)
    one_off_s = (1 + promotions) * work.baseline_eval_s
    wall_s = steps * step_s + one_off_s
    busy_run_s = steps * busy_gpu_s + one_off_s
    return {"gpus": gpus, "students": students, "inner_steps": inner_steps, "students_per_gpu": per_gpu,
            "driver_trains_students": driver_trains_students, "student_s": student_s,
            "timeline": [{"phase": name, "s": seconds, "busy_gpus": busy} for name, seconds, busy in timeline],
            "step_s": step_s, "step_busy_fraction": busy_gpu_s / (gpus * step_s),
            "wall_hours": wall_s / 3600, "allocated_gpu_hours": gpus * wall_s / 3600,
            "busy_gpu_hours": busy_run_s / 3600, "busy_fraction": busy_run_s / (gpus * wall_s)}


def estimate(cfg, calibration_steps: int = 1, run_dir: str | Path | None = None) -> dict:
    """Calibrate on ``calibration_steps`` outer steps of ``cfg``, then project the full run."""
    calibration = calibrate(cfg, calibration_steps, run_dir)
    return {"config": knobs(cfg), "calibration": calibration, "projection": project(calibration, cfg)}


def rounded(value, digits: int = 3):
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return round(value, digits) if isinstance(value, float) else value


def run_estimate(cfg, calibration_steps: int = 1) -> dict:
    """The ``soar-estimate`` stage: prints the estimate as JSON."""
    result = estimate(cfg, calibration_steps)
    print(json.dumps(rounded(result), indent=2))
    return result


def run_plan(cfg, prompt_tokens: int = PROMPT_TOKENS) -> list:
    """``soar-estimate --plan``: the memory plan of each GPU role (``soar.memory_plan``), printed; a
    ``ConfigError`` (exit 2) naming the fields to change when a role does not fit. Runs nothing and
    needs no GPU: only the model's ``config.json``."""
    if cfg.team.chain:  # a soar-team config: its own checks and plan (soar.team.plan)
        validate(cfg, "team_plan")
        validate_team(cfg)
    else:
        validate(cfg, "plan")
    if cfg.model.path in (None, "", "???") and not cfg.model.build:
        raise ConfigError("config error: model.path: the memory plan needs the model's config.json (a local folder)")
    resolve_model_path(cfg)
    roles = team_plan(cfg, prompt_tokens) if cfg.team.chain else plan(cfg, prompt_tokens=prompt_tokens)
    print(f"memory plan of {cfg.model.path} ({cfg.model.dtype}), prompts of {prompt_tokens} tokens:")
    print(plan_report(roles))
    check_plan(cfg, roles=roles)
    return roles
