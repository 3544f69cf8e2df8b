"""Allocated GPU-hours of a 200-step ``experiment=paper_math`` run on the documented layouts, projected
with ``soar.estimate.project_layout`` from single-GPU phase times: the measured ones (an H200) where
they exist, stated assumptions elsewhere. No GPU needed; JSON out, and the tables of
docs/paper_setting.md ("Layouts and what a run costs") printed as markdown.

    python benchmarks/layouts.py --out benchmarks/results/layouts.json

Each phase of a step is work in one GPU's seconds (``StepWork``):
- a student's inner step = its rollouts (8 x 32 of L tokens at the generation throughput) + the
  weight push into an engine (vLLM only) + forward/backward and optimiser (measured at L = 512,
  scaled by prompt + L tokens);
- its Q_R evaluation = 64 greedy completions of L tokens;
- teacher sampling = g*n / valid fraction completions of 512 tokens; the teacher update = the
  measured full-FT step scaled to the teacher's 256 sequences of prompt + 512 tokens;
- the checkpoint and the step dump on the critical path (before issue 49: a synchronous ~19 GB
  ``teacher.pt`` and 4 greedy completions every step; after: the weights' copy to host memory, the
  write in the background, and completions every 10 steps during the teacher update);
- the baseline's greedy pass over MATH's fail@128 hard set (359 + 360) at the start and per promotion.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from soar.estimate import StepWork, project_layout  # noqa: E402

MEASURED = {
    "source": "benchmarks/gpu_check.py --questions 8 on one H200, 2026-11-30 (docs/paper_rehearsal.md; its JSON "
              "was not committed); Llama-3.2-3B shape, bf16, random weights",
    "train_full_s": 10.5,
    "train_lora_s": 13.6,
    "train_tokens": 128 + 512,
    "hf_tokens_per_s": 3060.0,
}
"""One inner step's forward/backward + optimiser on 8 x 32 sequences of 128 + 512 tokens (full
fine-tuning; LoRA r = 16 on all 7 linear modules), and HF ``generate`` throughput at batch 64."""

ASSUMED = {
    "vllm_tokens_per_s": 20000.0,
    "prompt_tokens": 128,
    "teacher_prompt_tokens": 160,
    "teacher_valid_frac": 0.5,
    "push_full_s": 1.5,
    "push_lora_s": 0.1,
    "teacher_state_gb": 19.0,
    "teacher_weights_gb": 6.4,
    "disk_gb_per_s": 1.0,
    "host_copy_gb_per_s": 10.0,
    "decode_step_s": 64 / 3060.0,
    "hard_set": 359 + 360,
    "promotions": 3,
    "lora_flops_ratio": 2 / 3,
}
"""Not measured here. vLLM's throughput for a 3B model on one H100/H200 at >= 256 sequences (vLLM
cannot be installed on the GPU machine this project borrows); the student prompt length; the
teacher's prompt length and valid fraction; one in-memory push of 3B bf16 weights (6.4 GB through
host memory) or of an adapter; the ~19 GB teacher state (weights + Adam moments) written at 1 GB/s
in the step, or in the background after its 6.4 GB of weights are copied to host memory at
10 GB/s; an HF decode step at small batch (from the measured batch-64 throughput); MATH's hard set
(paper Table 2); promotions per run (PQ of 128-256 questions: 2-4); LoRA's step at the FLOP ratio
of a backward without weight gradients (about 2/3 of full FT)."""

PAPER = {"g": 4, "n": 64, "r": 4, "questions": 8, "group": 32, "m": 64, "teacher_tokens": 512, "steps": 200,
         "dump_completions": 4}


def step_work(length: int, students: str, generation: str, after_issue_49: bool, groups: int = 1) -> StepWork:
    """A paper_math step's work at completion length ``length``; ``students``: full | lora | lora_at_full
    (LoRA at full FT's measured speed) | lora_at_flops (at ``lora_flops_ratio`` of it); ``generation``:
    hf (measured) | vllm (assumed)."""
    a, p = ASSUMED, PAPER
    tps = MEASURED["hf_tokens_per_s"] if generation == "hf" else a["vllm_tokens_per_s"]
    train_ref = {"full": MEASURED["train_full_s"], "lora": MEASURED["train_lora_s"],
                 "lora_at_full": MEASURED["train_full_s"],
                 "lora_at_flops": MEASURED["train_full_s"] * a["lora_flops_ratio"]}[students]
    scale = (a["prompt_tokens"] + length) / MEASURED["train_tokens"]
    push = 0.0 if generation == "hf" else a["push_full_s"] if students == "full" else a["push_lora_s"]
    rollouts = p["questions"] * p["group"]
    teacher_tokens = groups * p["g"] * p["n"] / a["teacher_valid_frac"] * p["teacher_tokens"]
    teacher_update = groups * MEASURED["train_full_s"] * (a["teacher_prompt_tokens"] + p["teacher_tokens"]) \
        / MEASURED["train_tokens"]
    if after_issue_49:  # the weights' clone to host memory, the rest written in the background;
        # completions every 10 steps, during the teacher update
        checkpoint, dump = a["teacher_weights_gb"] / a["host_copy_gb_per_s"], 0.0
    else:
        # the dump's completions are one batch: L decode steps
        checkpoint, dump = a["teacher_state_gb"] / a["disk_gb_per_s"], length * a["decode_step_s"]
    return StepWork(student_inner_s=rollouts * length / tps + push + train_ref * scale,
                    student_eval_s=p["m"] * length / tps,
                    teacher_sample_s=teacher_tokens / tps, teacher_update_s=teacher_update,
                    checkpoint_s=checkpoint, dump_s=dump, baseline_eval_s=a["hard_set"] * length / tps)


LAYOUTS = {
    "4x8 before issue 49": dict(gpus=32, groups=1, driver_trains_students=False, after=False,
                                note="the old slurm/README command: 31 one-GPU workers for 16 students, the "
                                     "driver's GPU apart, synchronous checkpoint and dump every step"),
    "4x8, 32 students": dict(gpus=32, groups=2, driver_trains_students=True, after=True,
                             note="teacher.groups_per_step=2 (the paper's teacher 'batch size 2' read as two "
                                  "groups): 32 students on 32 GPUs, the driver's among them"),
    "4x8, 16 students": dict(gpus=32, groups=1, driver_trains_students=True, after=True,
                             note="16 students on 32 GPUs: half the GPUs never train (refused now: "
                                  "resources.num_workers <= 16)"),
    "1x8": dict(gpus=8, groups=1, driver_trains_students=True, after=True,
                note="16 students on 8 GPUs (2 per GPU, one after another or side by side), the driver's GPU "
                     "among them"),
    "1x8, driver apart": dict(gpus=8, groups=1, driver_trains_students=False, after=True,
                              note="SOAR_DRIVER_GPUS=1 (a full-FT teacher and a full-FT student do not fit one "
                                   "H100): 16 students on 7 GPUs, 3 rounds"),
}

STUDENTS = {
    ("hf", "full"): "HF generation (measured), full-FT students (measured)",
    ("vllm", "full"): "vLLM generation (assumed), full-FT students, in-memory push",
    ("vllm", "lora"): "vLLM, LoRA students at their measured speed (1.29x full FT)",
    ("vllm", "lora_at_full"): "vLLM, LoRA students as fast as full FT",
    ("vllm", "lora_at_flops"): "vLLM, LoRA students at 2/3 of full FT (FLOP ratio)",
}

GRID = [(512, 10), (1024, 10), (1024, 20)]


def project_all() -> dict:
    rows = []
    for (generation, students), students_label in STUDENTS.items():
        for name, layout in LAYOUTS.items():
            for length, k in GRID:
                work = step_work(length, students, generation, layout["after"], layout["groups"])
                proj = project_layout(work, layout["gpus"], PAPER["g"] * PAPER["r"] * layout["groups"], k,
                                      steps=PAPER["steps"], promotions=ASSUMED["promotions"],
                                      driver_trains_students=layout["driver_trains_students"])
                rows.append({"layout": name, "generation": generation, "student_kind": students,
                             "students_label": students_label, "length": length, "K": k, "work": asdict(work),
                             **proj})
    return {"benchmark": "layouts", "measured": MEASURED, "assumed": ASSUMED, "paper": PAPER,
            "paper_gpu_hours": [1500, 1900], "layouts": LAYOUTS, "rows": rows, "floors": floors()}


def floors() -> list[dict]:
    """The students' own GPU-hours over the run (16 students x K inner steps x 200 steps), split into
    training (with the weight pushes) and generation: what no layout can go below, idle time aside."""
    out = []
    for length, k in GRID:
        for generation, students in (("hf", "full"), ("vllm", "full"), ("vllm", "lora"), ("vllm", "lora_at_flops")):
            work = step_work(length, students, generation, True)
            inner_steps = PAPER["steps"] * PAPER["g"] * PAPER["r"] * k
            rollouts_s = PAPER["questions"] * PAPER["group"] * length / (
                MEASURED["hf_tokens_per_s"] if generation == "hf" else ASSUMED["vllm_tokens_per_s"])
            out.append({"length": length, "K": k, "generation": generation, "student_kind": students,
                        "generation_gpu_hours": inner_steps * rollouts_s / 3600,
                        "train_and_push_gpu_hours": inner_steps * (work.student_inner_s - rollouts_s) / 3600})
    return out


def markdown(result: dict) -> str:
    rows = result["rows"]
    lines = ["| students and generation | layout | " + " | ".join(f"L={n}, K={k}" for n, k in GRID) + " |",
             "|---|---|" + "---|" * len(GRID)]
    for (generation, students), label in STUDENTS.items():
        for name in LAYOUTS:
            cells = []
            for length, k in GRID:
                r = next(x for x in rows if (x["layout"], x["generation"], x["student_kind"], x["length"], x["K"])
                         == (name, generation, students, length, k))
                cells.append(f"{r['allocated_gpu_hours']:,.0f} ({100 * r['busy_fraction']:.0f} %)")
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for generation, students in (("hf", "full"), ("vllm", "full"), ("vllm", "lora_at_flops")):
        for name in ("1x8", "4x8, 32 students"):
            r = next(x for x in rows if (x["layout"], x["generation"], x["student_kind"], x["length"], x["K"])
                     == (name, generation, students, 512, 10))
            steps = ", ".join(f"{p['phase']} {p['s']:.0f} s ({p['busy_gpus']:g} busy)" for p in r["timeline"] if p["s"])
            lines.append(f"- {STUDENTS[(generation, students)]}, {name}, L=512, K=10: step {r['step_s']:.0f} s = "
                         f"{steps}; {100 * r['step_busy_fraction']:.0f} % of the held GPU-time busy")
    lines.append("")
    for f in result["floors"]:
        what = STUDENTS[(f["generation"], f["student_kind"])]
        lines.append(f"- floor, L={f['length']}, K={f['K']}, {what}: training and weight pushes "
                     f"{f['train_and_push_gpu_hours']:.0f} + generation {f['generation_gpu_hours']:.0f} GPU-hours")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/layouts.json")
    args = ap.parse_args(argv)
    result = project_all()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
