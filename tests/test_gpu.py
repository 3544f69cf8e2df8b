"""Tier ``requires_gpu``: what needs a CUDA device. Skipped (by ``tests/conftest.py``) where torch sees
none, which so far is every machine this project has run on: these tests have not yet run on a GPU.

    python3 -m pytest tests -m requires_gpu
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.requires_gpu
@pytest.mark.timeout(600)
def test_gpu_check_runs_on_the_gpu_with_a_tiny_shape(tmp_path):
    """``benchmarks/gpu_check.py`` (generation, full-FT inner steps with fp32 masters and in pure bf16,
    LoRA with fp32 and bf16 adapters, chunked against full log-probs, mixed-adapter forward) on CUDA in
    bf16 with the tiny shape: every part runs, each measured peak has the memory plan's figure beside
    it, and a 4-adapter batch matches 4 single ones."""
    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--shape", "tiny", "--device", "cuda",
                    "--dtype", "bfloat16", "--questions", "1", "--group", "4", "--prompt-len", "8", "--completion-len",
                    "16", "--micro-batch", "2", "--gen-batch", "8", "--gen-tokens", "8", "--out", str(out)], cwd=REPO,
                   check=True, timeout=570)
    res = json.loads(out.read_text())
    for part in ("generation", "full_mixed", "full_pure", "lora_fp32", "lora_bf16", "logprobs", "multi_adapter_forward"):
        assert "error" not in res[part], res[part]
    for part in ("generation", "full_mixed", "full_pure", "lora_fp32", "lora_bf16"):
        assert res[part]["peak_gib"] > 0 and res[part]["planned_peak_gib"] > 0
    assert res["generation"]["new_tokens_per_seq"] == 8
