"""The GPU check script runs where only torch, transformers and peft exist (the GPU machine's
image): here on CPU with a tiny shape, with vllm, ray, hydra, omegaconf, datasets, math-verify and
sentence-transformers made unimportable."""

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


@pytest.mark.timeout(180)
def test_gpu_check_runs_without_vllm_ray_hydra(tmp_path):
    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, "-c", BLOCK, "--shape", "tiny", "--device", "cpu", "--dtype", "float32",
                    "--group", "4", "--prompt-len", "8", "--completion-len", "16", "--gen-batch", "8",
                    "--gen-tokens", "8", "--lora-variants", "all,attn_bf16", "--out", str(out)],
                   cwd=REPO, check=True, timeout=170)
    res = json.loads(out.read_text())
    for part in ("inner_step_full", "inner_step_lora", "generation", "multi_adapter_forward"):
        assert "error" not in res[part], res[part]
    full, lora = res["inner_step_full"], res["inner_step_lora"]
    assert lora["trainable_params"] < full["trainable_params"] and len(full["steps"]) == 3
    attn = res["inner_step_lora_attn_bf16"]  # attention-only adapters kept in the model's dtype
    assert attn["trainable_params"] < lora["trainable_params"] and "attn_bf16" in res["lora_over_full"]
    assert res["generation"]["tokens_per_s"] > 0 and res["generation"]["new_tokens_per_seq"] == 8
    # one batch mixing 4 adapters computes what 4 single-adapter batches compute
    assert res["multi_adapter_forward"]["max_abs_logit_gap"] < 1e-4
