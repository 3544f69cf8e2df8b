"""The GPU check script runs where only torch, transformers and peft exist (the GPU machine's
image): here on CPU with a tiny shape in bf16, with vllm, ray, hydra, omegaconf, datasets, math-verify
and sentence-transformers made unimportable. Every part runs and reports the memory plan's figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_gpu_check():
    """benchmarks/gpu_check.py as a module (its tables; nothing runs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

BLOCK = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"vllm", "ray", "hydra", "omegaconf", "datasets", "math_verify", "sentence_transformers"}:
            raise ImportError(f"{name} is not on the GPU image")
sys.meta_path.insert(0, Block())
sys.argv = ["gpu_check.py", *sys.argv[1:]]
runpy.run_path("benchmarks/gpu_check.py", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpu_check_runs_without_vllm_ray_hydra(tmp_path):
    """``--dry``: every part end to end on CPU at a tiny shape in bf16, as the device would run it."""
    parts = load_gpu_check().PARTS
    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, "-c", BLOCK, "--dry", "--parts", ",".join(parts), "--out", str(out)],
                   cwd=REPO, check=True, timeout=280)
    res = json.loads(out.read_text())
    inner = ("full_mixed", "full_pure", "lora_fp32", "lora_bf16", "full_mixed_no_checkpointing")
    for part in parts:
        assert "error" not in res[part] and "skipped" not in res[part], res[part]
    assert res["vllm"].startswith("not measured")
    for part in (*inner, "generation"):
        assert res[part]["planned_peak_gib"] > 0
    assert res["full_mixed"]["optimizer_dtypes"] == ["torch.float32"]  # fp32 masters of bf16 weights
    assert res["full_mixed"]["gradient_checkpointing"] and res["lora_bf16"]["gradient_checkpointing"]
    assert res["full_pure"]["optimizer_dtypes"] == ["torch.bfloat16"]
    assert res["lora_fp32"]["trainable_dtypes"] == ["torch.float32"]
    assert res["lora_bf16"]["trainable_dtypes"] == ["torch.bfloat16"] and res["lora_bf16"]["optimizer_dtypes"] == \
        ["torch.float32"]
    lora, full = res["lora_fp32"]["trainable_params"], res["full_mixed"]["trainable_params"]
    assert lora == res["lora_bf16"]["trainable_params"] < full
    assert res["generation"]["tokens_per_s"] > 0 and res["generation"]["new_tokens_per_seq"] == 8
    assert res["logprobs"]["max_abs_logprob_gap"] < 0.05 and res["logprobs"]["head_grad_rel_gap"] < 0.05  # bf16
    assert res["multi_adapter_forward"]["max_abs_logit_gap"] < 0.05
    assert set(res["over_full_pure"]) == {"full_mixed", "full_pure", "lora_fp32", "lora_bf16"}
    # where LoRA's time goes: every piece of both steps timed, and their ratios
    split = res["lora_split"]
    for kind in ("full", "lora"):
        pieces = [split[kind][k] for k in ("reference_s", "forward_s", "backward_s", "optimizer_s")]
        assert all(x > 0 for x in pieces) and split[kind]["total_s"] == pytest.approx(sum(pieces))
    assert set(split["lora_over_full"]) == {"reference_s", "forward_s", "backward_s", "optimizer_s", "total_s"}
    assert split["adapter_forward_s"] > 0 and split["base_forward_s"] > 0
    # the chosen layout's worker and GPU 0, each beside the plan's figure
    students = res["layout_students"]
    assert students["students"] == 2 and len(students["steps"]) == 2 * 2 and students["planned_peak_gib"] > 0
    both = res["driver_and_student"]
    assert both["planned_sum_of_peaks_gib"] > both["planned_peak_gib"] > both["planned"]["driver"]["held_gib"] > 0
    assert len(both["teacher_update_s"]) == len(both["student_update_s"]) == 2
    assert res["sdpa_kernels"]["math_fallback_needed"] in (True, False)


def test_the_layout_sizes_are_the_presets():
    """gpu_check.py's ``LAYOUT`` (the GPU image cannot compose Hydra configs) is experiment=paper_math_lora's."""
    import soar

    LAYOUT = load_gpu_check().LAYOUT
    cfg = soar.compose(["experiment=paper_math_lora"], config_name="train")
    s, t = cfg.student, cfg.teacher
    assert (LAYOUT["micro_batch"], LAYOUT["lora_r"], LAYOUT["lora_alpha"], LAYOUT["teacher_micro_batch"],
            LAYOUT["teacher_tokens"]) == (s.micro_batch_size, s.lora.r, s.lora.alpha, t.micro_batch_size, t.max_tokens)
    assert s.gradient_checkpointing and t.gradient_checkpointing
    students = cfg.teacher.groups_per_step * cfg.teacher.datasets * cfg.inner.replicates
    assert LAYOUT["students_per_gpu"] == -(-students // cfg.resources.num_workers)


@pytest.mark.timeout(240)
def test_device_script_writes_the_json_and_log(tmp_path):
    """``dev/scripts/gpu_check_on_device.sh``, the device tool's call, at the tiny shape on CPU (two parts)."""
    import os

    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(REPO)}
    subprocess.run(["bash", "dev/scripts/gpu_check_on_device.sh", "--shape", "tiny", "--device", "cpu",
                    "--dtype", "bfloat16",
                    "--prompt-len", "8", "--completion-len", "16", "--micro-batch", "2", "--gen-batch", "8",
                    "--gen-tokens", "8", "--parts", "generation,logprobs"], cwd=REPO, env=env, check=True, timeout=230)
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "error" not in res["generation"] and "error" not in res["logprobs"]
    assert "wrote" in (tmp_path / "gpu_check.log").read_text()
