"""One outer step of ``experiment=paper_math`` at Llama-3.2-3B's shape (random weights, Llama-3.2's real
tokenizer: ``soar.rehearsal``), per phase time and peak memory, full-FT and LoRA students, projected to
the paper's 200-step run with ``soar.estimate.project`` (what ``soar-estimate`` does). JSON out.

    python benchmarks/paper_step.py --out $OUT/paper_step.json             # one H100/H200: <= 6 min
    python benchmarks/paper_step.py --tiny --out /tmp/paper_step.json      # the CPU smoke test (CI)

The step is paper_math's code path (teacher sampling with the paper's prompt, math_verify grading,
RLOO students, Q_R evaluation, teacher update; hard set = MATH-500 rows, no filter pass) at sizes
shrunk to fit the time budget (``--g --n --r --k --questions --group --m --student-tokens
--teacher-tokens``; the paper's are 4, 64, 4, 10, 8, 32, 64, 1024, 512). Then each phase is scaled
to the paper's sizes by the ratio of its work (rollout tokens for sampling, sequences x tokens for
training), linearly, and handed to ``soar.estimate.project`` as a one-step calibration.

Assumptions (recorded in the JSON): random weights never emit EOS, so every completion runs to its
``max_tokens`` (an upper bound on generation: the paper's students stop earlier); the teacher's
completions are all taken as valid pairs (a random model writes none; ``--teacher-valid-frac`` scales
the sampling phase for the rejected ones, default 0.5); one GPU holds teacher and students (the paper
used 4 nodes x 8 GPUs). Backend: ``--backend auto`` is vLLM where it is installed, else hf.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PAPER = {"g": 4, "n": 64, "r": 4, "k": 10, "questions": 8, "group": 32, "m": 64, "student_tokens": 1024,
         "teacher_tokens": 512}
"""Table 3's sizes (experiment=paper_math)."""
GPU_DEFAULTS = {"g": 2, "n": 8, "r": 1, "k": 1, "questions": 8, "group": 32, "m": 8, "student_tokens": 256,
                "teacher_tokens": 512}
"""What one step measures on a GPU (<= 6 min for both student kinds on hf at 3B)."""
TINY_DEFAULTS = {"g": 2, "n": 2, "r": 1, "k": 1, "questions": 2, "group": 2, "m": 2, "student_tokens": 8,
                 "teacher_tokens": 8}


def peak_gb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # process high-water mark (CPU)


@contextlib.contextmanager
def phase_memory(device: str, record: dict):
    """Wrap ``soar.loop.phase`` so each phase also records its peak memory (GPU: reset per phase)."""
    import torch

    import soar.loop

    original = soar.loop.phase

    @contextlib.contextmanager
    def measured(name, step, times):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with original(name, step, times):
            yield
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        record[name] = peak_gb(device)

    soar.loop.phase = measured
    try:
        yield
    finally:
        soar.loop.phase = original


@contextlib.contextmanager
def every_completion_valid():
    """A random model writes no parseable pair: take each teacher completion as one (its text the question)."""
    from soar.teachers.parse import Pair
    from soar.teachers.update import TeacherPolicy

    original = TeacherPolicy.parse
    TeacherPolicy.parse = lambda self, text: Pair(question=(text.strip() or "x")[:300], answer="1")
    try:
        yield
    finally:
        TeacherPolicy.parse = original


def hard_set_file(path: Path, count: int) -> Path:
    """MATH-500 problems in the hard-set record schema with a split column (a random model fails them all)."""
    from soar.data import shared_data_dir

    rows = [json.loads(line) for line in (shared_data_dir() / "math500" / "test.jsonl").read_text().splitlines()[:count]]
    with open(path, "w") as fh:
        for i, row in enumerate(rows):
            fh.write(json.dumps({"id": row["unique_id"], "question": row["problem"], "answer": row["answer"],
                                 "split": "train" if i % 2 == 0 else "test"}) + "\n")
    return path


def overrides(sizes: dict, model_dir: Path, hard: Path, run_dir: Path, args, lora: bool) -> list[str]:
    out = ["experiment=paper_math", "data=math500", f"model.path={model_dir}", f"loop.hard_set={hard}",
           f"run.dir={run_dir}", "run.progress=false", f"model.dtype={args.dtype}", f"backend={args.backend}",
           f"teacher.datasets={sizes['g']}", f"teacher.questions_per_dataset={sizes['n']}",
           f"inner.replicates={sizes['r']}", f"student.max_steps={sizes['k']}", f"inner.reward_questions={sizes['m']}",
           f"student.questions_per_step={sizes['questions']}", f"student.group_size={sizes['group']}",
           f"student.max_tokens={sizes['student_tokens']}", f"teacher.max_tokens={sizes['teacher_tokens']}",
           "teacher.warmup_steps=0", "student.skip_zero_adv=false", "teacher.skip_zero_adv=false",
           "loop.steps=200", "loop.diversity_model=null", f"student.micro_batch_size={args.micro_batch}",
           f"teacher.micro_batch_size={args.micro_batch}", "teacher.sample_batch=0", "teacher.max_attempts_factor=1",
           # one process: not experiment=paper's Ray cluster layout
           "resources.num_workers=0", "resources.gpus_per_student=0", "resources.driver_gpu_apart=false",
           "resources.ray_address=null"]
    if lora:
        out += [f"student.lora.r={args.lora_r}", f"student.lora.alpha={2 * args.lora_r}", "student.lr=1e-4",
                f"student.lora.target_modules=[{args.lora_targets}]", f"student.lora.dropout={args.lora_dropout}",
                f"student.lora.autocast_adapter_dtype={str(not args.lora_bf16).lower()}"]
    if args.backend == "vllm":
        out += ["backend.vllm.enable_lora=true", f"backend.vllm.max_lora_rank={max(args.lora_r, 8)}"]
    return out + args.override


def scale_to_paper(row: dict, sizes: dict, valid_frac: float) -> dict:
    """The measured step's phase times at the paper's sizes (linear in the work of each phase)."""
    p, s = PAPER, sizes
    students = (p["g"] * p["r"] * p["k"]) / (s["g"] * s["r"] * s["k"])
    rollout_tokens = ((p["questions"] * p["group"] * p["student_tokens"])
                      / (s["questions"] * s["group"] * s["student_tokens"]))
    qr = (p["m"] * p["student_tokens"]) / (s["m"] * s["student_tokens"]) * (p["g"] * p["r"]) / (s["g"] * s["r"])
    teacher = (p["g"] * p["n"] * p["teacher_tokens"]) / (s["g"] * s["n"] * s["teacher_tokens"])
    factors = {"teacher_sample": teacher / valid_frac, "teacher_update": teacher,
               "rewards": students * rollout_tokens,  # Q_R evaluation inside it scales less: an upper bound
               "baseline_eval": qr / (p["g"] * p["r"]), "promotion": 1.0}
    out = {k: v for k, v in row.items() if not k.startswith("time/")}
    from soar.estimate import TOTAL_KEYS

    for key, value in row.items():
        if key.startswith("time/") and key.endswith("_s") and key not in TOTAL_KEYS:
            out[key] = value * factors.get(key[len("time/"):-2], 1.0)
    out["time/phases_s"] = sum(v for k, v in out.items() if k.startswith("time/") and k.endswith("_s"))
    out["time/wall_s"] = out["time/phases_s"] + max(row["time/wall_s"] - row["time/phases_s"], 0.0)
    return out, {"factors": factors, "qr_factor": qr}


def run_kind(name: str, lora: bool, sizes: dict, model_dir: Path, hard: Path, args) -> dict:
    import soar
    from soar.estimate import TOTAL_KEYS, calibrate, project

    memory: dict = {}
    with tempfile.TemporaryDirectory(prefix=f"paper_step_{name}_") as tmp, every_completion_valid(), \
            phase_memory(args.device, memory):
        cfg = soar.compose(overrides(sizes, model_dir, hard, Path(tmp) / "run", args, lora))
        t0 = time.perf_counter()
        cal = calibrate(cfg, 1, Path(tmp) / "run")
        wall = time.perf_counter() - t0
    row = cal["rows"][0]
    measured = {k[len("time/"):-2]: v for k, v in row.items()
                if k.startswith("time/") and k.endswith("_s") and k not in TOTAL_KEYS}
    paper_row, how = scale_to_paper(row, sizes, args.teacher_valid_frac)
    paper_cfg = soar.compose(["experiment=paper_math", f"model.path={model_dir}"])
    projection = project({**cal, "rows": [paper_row], "K": PAPER["k"]}, paper_cfg)
    return {"students": "lora" if lora else "full", "wall_s": wall, "setup_s": cal["setup_s"],
            "measured_phases_s": measured, "peak_gb_by_phase": memory, "peak_gb": peak_gb(args.device),
            "scaling": how, "paper_step_s": {k[len("time/"):-2]: v for k, v in paper_row.items()
                                             if k.startswith("time/") and k.endswith("_s")},
            "projection_200_steps": {"total_hours": projection["total_hours"], "K": projection["K"],
                                     "step_s": projection["step_s"], "max_promotions": projection["max_promotions"]}}


def main(argv=None) -> dict:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="the tiny shape and sizes (CPU smoke test)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="bfloat16 on a GPU, float32 on CPU")
    ap.add_argument("--backend", default="auto", choices=["auto", "hf", "vllm"])
    ap.add_argument("--students", default="full,lora", help="full, lora or both")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ap.add_argument("--lora-dropout", type=float, default=0.0)
    ap.add_argument("--lora-bf16", action="store_true", help="adapters in the model's dtype (peft autocast off)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--teacher-valid-frac", type=float, default=0.5)
    ap.add_argument("--gpus", type=int, default=1, help="GPUs the measured step used (GPU-hours = hours x gpus)")
    for key in PAPER:
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=None)
    ap.add_argument("--out", default="paper_step.json")
    ap.add_argument("override", nargs="*", help="Hydra overrides appended to the step's config")
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    sizes = {k: getattr(args, k) if getattr(args, k) is not None else v
             for k, v in (TINY_DEFAULTS if args.tiny else GPU_DEFAULTS).items()}
    import importlib.util

    from soar.rehearsal import SHAPES, write_model

    if args.backend == "auto":
        args.backend = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    import transformers

    result = {"benchmark": "paper_step", "machine": {
        "platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
        "transformers": transformers.__version__, "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None},
        "shape": "tiny" if args.tiny else "3b", "model_shape": SHAPES["tiny" if args.tiny else "3b"],
        "backend": args.backend, "sizes": sizes, "paper_sizes": PAPER, "gpus": args.gpus,
        "assumptions": ["random weights: every completion runs to max_tokens (generation is an upper bound)",
                        f"teacher valid fraction {args.teacher_valid_frac} (sampling scaled by its inverse)",
                        "phases scaled linearly in rollout tokens / sequences to the paper's sizes",
                        "one device for teacher and students; GPU-hours = hours x gpus"],
        "lora": {"r": args.lora_r, "targets": args.lora_targets, "dropout": args.lora_dropout,
                 "adapter_dtype": "model" if args.lora_bf16 else "float32 (peft autocast)"}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="paper_step_model_") as tmp:
        t0 = time.perf_counter()
        model_dir = write_model(Path(tmp) / "model", "tiny" if args.tiny else "3b", dtype=args.dtype, device=args.device)
        hard = hard_set_file(Path(tmp) / "hard.jsonl", 2 * max(sizes["m"], 2))
        result["model_write_s"] = time.perf_counter() - t0
        for kind in args.students.split(","):
            try:
                result[kind] = run_kind(kind, kind == "lora", sizes, model_dir, hard, args)
                hours = result[kind]["projection_200_steps"]["total_hours"]
                result[kind]["gpu_hours_200_steps"] = {b: h * args.gpus for b, h in hours.items()}
            except Exception as exc:  # noqa: BLE001 - recorded, the other kind still runs
                import traceback

                result[kind] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            out.write_text(json.dumps(result, indent=2, default=float))
            print(kind, json.dumps({k: v for k, v in result[kind].items() if k in ("wall_s", "paper_step_s",
                                                                                     "gpu_hours_200_steps", "error")},
                                   default=float), flush=True)
    if args.tiny:
        result["note"] = "tiny shape: a smoke test of the pipeline; its projections mean nothing"
    out.write_text(json.dumps(result, indent=2, default=float))
    print("wrote", out)
    return result


if __name__ == "__main__":
    main()
