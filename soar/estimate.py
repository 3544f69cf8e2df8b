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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from omegaconf import open_dict

from soar.config import ConfigError
from soar.loop import Loop
from soar.memory_plan import PROMPT_TOKENS, MemoryPlan, check_plan, plan, plan_report
from soar.metrics_log import MetricsLogger
from soar.prepare import read_train_inputs, setup_train
from soar.resolve import resolve_backend
from soar.stage import resolve_model_path, setup_stage
from soar.student_tasks import student_tasks_per_step
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
    baseline_qr_s: float = 0.0
    """The baseline's greedy pass over the step's Q_R, every step (the driver's GPU, the others idle)."""


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
        ("baseline_qr", work.baseline_qr_s, 1.0),
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


@dataclass(frozen=True)
class CostInput:
    """One input of ``project_config``: its value and where it comes from."""

    value: float
    source: str
    """``measured: <what, where, when>`` or ``assumed: <why>``."""


COST_INPUTS = {
    "train_full_s": CostInput(10.5, "measured: one full-FT inner step (8 x 32 sequences of 128 + 512 tokens, pure bf16, "
                                    "no checkpointing, before fp32 masters existed), benchmarks/gpu_check.py on one H200, "
                                    "2026-11-30 (docs/paper_rehearsal.md; its JSON was not committed)"),
    "train_lora_s": CostInput(13.6, "measured: the same step with LoRA r = 16 on all 7 linear modules (fp32 adapters), "
                                    "same run"),
    "train_tokens": CostInput(640, "measured: tokens per sequence in those two steps (128 + 512)"),
    "optimizer_s": CostInput(0.0, "assumed: AdamW over fp32 masters is memory-bound, ~0.1 TB per 3B step at ~4 TB/s: "
                                  "under 0.05 s, left out"),
    "checkpointing_full": CostInput(1.25, "assumed: one more forward per micro-batch, full FT's 8 N FLOPs a token "
                                          "(forward 2, backward 4, reference 2) become 10 N"),
    "checkpointing_lora": CostInput(4 / 3, "assumed: LoRA's 6 N (forward 2, activation gradients 2, reference 2) "
                                           "become 8 N"),
    "hf_tokens_per_s": CostInput(3060, "measured: HF generate at batch 64, same run"),
    "vllm_tokens_per_s": CostInput(20000, "assumed: vLLM on one H100/H200 at >= 256 sequences of a 3B model (not "
                                          "measurable on the borrowed GPU machine: its image has no vllm)"),
    "vllm_decode_step_s": CostInput(0.006, "assumed: one vLLM decode step at small batch (3B on one GPU): the tail of "
                                           "a batch whose longest completion runs to max_tokens"),
    "completion_mean_tokens": CostInput(400, "assumed: mean length of a student completion that ends at EOS, on the "
                                             "hard set (no measurement of Llama-3.2-3B-Instruct on it exists here)"),
    "completion_capped_frac": CostInput(0.10, "assumed: share of completions cut at max_tokens; soar-filter's manifest "
                                              "counts them (overflow) in the fail@128 run that builds the hard set"),
    "sorted_micro_batches": CostInput(0, "assumed: 0, as built: RLOOTrainer fills micro-batches in rollout order, so "
                                         "one cut completion pads its micro-batch to max_tokens (1: sorted by length, "
                                         "each padded to about the mean; not built)"),
    "prompt_tokens": CostInput(128, "assumed: a MATH prompt in the paper's template (125 Llama-3 tokens at the median)"),
    "teacher_prompt_tokens": CostInput(160, "assumed: the paper's teacher prompt (142 tokens) and BOS, rounded up"),
    "teacher_completion_tokens": CostInput(512, "assumed: every teacher completion runs to teacher.max_tokens"),
    "teacher_valid_frac": CostInput(0.5, "assumed: half the teacher's completions parse into a valid pair"),
    "push_full_s": CostInput(1.5, "assumed: an in-memory push of 3B bf16 weights (6.4 GB) into an engine"),
    "push_lora_s": CostInput(0.1, "assumed: an adapter's push"),
    "checkpoint_s": CostInput(0.64, "assumed: the teacher's 6.4 GB of weights copied to host memory at 10 GB/s; the "
                                    "rest of the checkpoint is written in the background"),
    "hard_set": CostInput(719, "measured: MATH's fail@128 hard set in the paper (Table 2: 359 + 360)"),
    "promotions": CostInput(3, "assumed: PQ of 128-256 questions is 2-4 promotions; spaced evenly over the run"),
}
"""The inputs of ``project_config`` with their sources; ``soar-estimate --layout --inputs FILE`` replaces
any of them (a JSON object of ``{"name": {"value": v, "source": "measured: ..."}}``)."""


def read_cost_inputs(path: str | Path | None) -> dict[str, CostInput]:
    """``COST_INPUTS`` with the entries of the JSON file ``path`` in place of theirs; each must name a known
    input and say where its value comes from."""
    inputs = dict(COST_INPUTS)
    if path is None:
        return inputs
    try:
        given = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"config error: --inputs: cannot read {path} ({exc})") from None
    for name, entry in given.items():
        if name not in COST_INPUTS:
            raise ConfigError(f"config error: --inputs: {path}: unknown input {name!r} (one of {', '.join(COST_INPUTS)})")
        source = entry.get("source", "") if isinstance(entry, dict) else ""
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), (int, float)) or \
                not source.startswith(("measured:", "assumed:")):
            raise ConfigError(f"config error: --inputs: {path}: {name} needs a number 'value' and a 'source' that "
                              "starts with 'measured:' or 'assumed:'")
        inputs[name] = CostInput(float(entry["value"]), source)
    return inputs


def generation_s(sequences: int, cap: int, mean: float, capped: float, backend: str, x: dict) -> float:
    """Seconds of one GPU to generate ``sequences`` completions (at most ``cap`` tokens, ``mean`` on average,
    ``capped`` of them cut at ``cap``): on vLLM the tokens at its throughput, but no less than the longest
    completion's decode steps; on HF every sequence of a batch runs until its longest ends (to ``cap``
    once any is cut), at HF's measured throughput."""
    if backend == "hf":
        return sequences * (cap if capped > 0 else mean) / x["hf_tokens_per_s"]
    return max(sequences * mean / x["vllm_tokens_per_s"], (cap if capped > 0 else mean) * x["vllm_decode_step_s"])


def config_step_work(cfg, inputs: dict[str, CostInput] | None = None) -> tuple[StepWork, dict]:
    """One outer step of ``cfg`` as ``StepWork`` (one GPU's seconds per phase), from ``inputs`` (default
    ``COST_INPUTS``), and the terms of a student's inner step. A completion is either cut at
    ``max_tokens`` (``completion_capped_frac``) or ends at EOS after ``completion_mean_tokens``; a training
    micro-batch of b sequences is padded to its longest: to ``max_tokens`` with probability 1 - (1 - c)^b."""
    x = {name: entry.value for name, entry in (inputs or COST_INPUTS).items()}
    s, t = cfg.student, cfg.teacher
    cap, c = s.max_tokens, x["completion_capped_frac"]
    mean = c * cap + (1 - c) * min(x["completion_mean_tokens"], cap)
    lora = s.lora.r > 0
    sequences = s.questions_per_step * s.group_size
    rollouts = generation_s(sequences, cap, mean, c, resolve_backend(cfg.backend, "student"), x)
    vllm_students = resolve_backend(cfg.backend, "student") == "vllm"
    push = 0.0 if not vllm_students else x["push_lora_s"] if lora else x["push_full_s"]
    uncut = (1 - c) ** s.micro_batch_size  # no completion of a micro-batch cut: padded to an EOS length
    padded = mean if x["sorted_micro_batches"] else cap * (1 - uncut) + min(x["completion_mean_tokens"], cap) * uncut
    step_s = x["train_lora_s"] if lora else x["train_full_s"]
    ckpt = (x["checkpointing_lora"] if lora else x["checkpointing_full"]) if s.gradient_checkpointing else 1.0
    train = step_s * ckpt * sequences / 256 * (x["prompt_tokens"] + padded) / x["train_tokens"] + x["optimizer_s"]
    eval_backend = resolve_backend(cfg.backend, "eval")
    m = cfg.inner.reward_questions
    qr = generation_s(m, s.eval_max_tokens or cap, mean, c, eval_backend, x)
    groups = t.groups_per_step
    teacher_n = groups * t.datasets * t.questions_per_dataset / x["teacher_valid_frac"]
    teacher_tokens = min(x["teacher_completion_tokens"], t.max_tokens)
    teacher_sample = generation_s(int(teacher_n), t.max_tokens, teacher_tokens, 1.0, resolve_backend(cfg.backend, "teacher"),
                                  x)
    teacher_ckpt = x["checkpointing_full"] if t.gradient_checkpointing else 1.0
    teacher_update = x["train_full_s"] * teacher_ckpt * groups * t.datasets * t.questions_per_dataset / 256 * \
        (x["teacher_prompt_tokens"] + teacher_tokens) / x["train_tokens"]
    hard = generation_s(int(x["hard_set"]), s.eval_max_tokens or cap, mean, c, eval_backend, x)
    work = StepWork(student_inner_s=rollouts + push + train, student_eval_s=qr, teacher_sample_s=teacher_sample,
                    teacher_update_s=teacher_update, checkpoint_s=x["checkpoint_s"], dump_s=0.0, baseline_eval_s=hard,
                    baseline_qr_s=qr)
    return work, {"rollouts_s": rollouts, "push_s": push, "train_s": train, "mean_completion_tokens": mean,
                  "padded_micro_batch_tokens": padded}


def layout_gpus(cfg) -> tuple[int, bool]:
    """(GPUs a ``soar-train`` run of ``cfg`` holds, whether the driver's GPU trains students): the pool's
    GPUs (``num_workers`` x ``gpus_per_student``, rounded up) and the driver's when kept apart; one GPU
    for students in the driver."""
    res = cfg.resources
    if res.num_workers == 0 or res.gpus_per_student == 0:
        return 1, True
    pool = math.ceil(res.num_workers * res.gpus_per_student - 1e-9)
    return pool + (1 if res.driver_gpu_apart else 0), not res.driver_gpu_apart


def project_config(cfg, inputs: dict[str, CostInput] | None = None, promotions: int | None = None) -> dict:
    """A full ``soar-train`` run of ``cfg`` on its layout (``layout_gpus``), from ``inputs``: ``promotions``
    (default the input) evenly spaced, each adding ``inner.steps_per_promotion`` inner steps up to
    ``inner.max_steps``, so the run is ``promotions + 1`` spans of ``project_layout``. Returns the
    allocated GPU-hours, wall hours and busy fraction, each span's timeline and the inputs with their
    sources."""
    inputs = inputs or COST_INPUTS
    promotions = int(inputs["promotions"].value if promotions is None else promotions)
    gpus, driver_trains = layout_gpus(cfg)
    steps, students = cfg.loop.steps, student_tasks_per_step(cfg)
    work, inner = config_step_work(cfg, inputs)
    spans, k = [], cfg.student.max_steps
    bounds = [round(steps * j / (promotions + 1)) for j in range(promotions + 2)]
    for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        span = project_layout(work, gpus, students, k, steps=hi - lo, promotions=1 if j == 0 else 0,
                              driver_trains_students=driver_trains)
        span["one_off_note"] = "the baseline's hard-set pass at the start and after the promotion that opens it"
        spans.append({"steps": hi - lo, "K": k, "work": asdict(work), "inner": inner, **span})
        k = min(k + cfg.inner.steps_per_promotion, cfg.inner.max_steps)
    wall = sum(sp["wall_hours"] for sp in spans)
    busy = sum(sp["busy_gpu_hours"] for sp in spans)
    return {"gpus": gpus, "driver_trains_students": driver_trains, "students": students, "steps": steps,
            "promotions": promotions, "allocated_gpu_hours": gpus * wall, "wall_hours": wall,
            "busy_fraction": busy / (gpus * wall), "spans": spans,
            "inputs": {name: asdict(entry) for name, entry in inputs.items()}}


def run_layout(cfg, inputs_path: str | None = None, promotions: int | None = None) -> dict:
    """``soar-estimate --layout [--inputs FILE] [--promotions N]``: ``project_config`` printed as JSON (no
    run, no GPU); the memory plan must accept the layout first (``soar-estimate --plan``)."""
    result = project_config(cfg, read_cost_inputs(inputs_path), promotions)
    print(json.dumps(rounded(result), indent=2))
    return result


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


def run_plan(cfg, prompt_tokens: int = PROMPT_TOKENS, stage: str = "train") -> MemoryPlan:
    """``soar-estimate --plan [--stage S]``: the memory plan of every GPU of stage S (train | rl | eval |
    filter; ``soar.memory_plan``), or of a ``soar-team`` config (``team.chain``: ``soar.team.plan``), printed;
    a ``ConfigError`` (exit 2) naming the GPU that does not fit, by how much, and the fields to change. Runs
    nothing and needs no GPU: only the models' ``config.json``."""
    if cfg.team.chain:  # a soar-team config: its own checks and plan
        validate(cfg, "team_plan")
        validate_team(cfg)
    else:
        validate(cfg, "plan" if stage == "train" else f"plan_{stage}")
    if cfg.model.path in (None, "", "???") and not cfg.model.build:
        raise ConfigError("config error: model.path: the memory plan needs the model's config.json (a local folder)")
    resolve_model_path(cfg)
    memory = team_plan(cfg, prompt_tokens) if cfg.team.chain else plan(cfg, prompt_tokens=prompt_tokens, stage=stage)
    print(f"memory plan of {memory.stage} with {cfg.model.path} ({cfg.model.dtype}), prompts of {prompt_tokens} tokens:")
    print(plan_report(memory))
    check_plan(cfg, memory=memory)
    return memory
