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


@pytest.mark.timeout(300)
def test_gpu_check_runs_without_vllm_ray_hydra(tmp_path):
    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, "-c", BLOCK, "--shape", "tiny", "--device", "cpu", "--dtype", "bfloat16",
                    "--questions", "1", "--group", "4", "--prompt-len", "8", "--completion-len", "16",
                    "--micro-batch", "2", "--steps", "1", "--gen-batch", "8", "--gen-tokens", "8", "--out", str(out)],
                   cwd=REPO, check=True, timeout=280)
    res = json.loads(out.read_text())
    inner = ("full_mixed", "full_pure", "lora_fp32", "lora_bf16", "full_mixed_no_checkpointing")
    for part in (*inner, "generation", "logprobs", "multi_adapter_forward"):
        assert "error" not in res[part] and "skipped" not in res[part], res[part]
    for part in (*inner, "generation"):
        assert res[part]["planned_peak_gib"] > 0
    assert res["full_mixed"]["optimizer_dtypes"] == ["torch.float32"]  # fp32 masters of bf16 weights
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
