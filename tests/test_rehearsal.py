"""``experiment=paper_rehearsal``: paper_math's loop (the paper's prompts and format, math_verify,
MATH-500 read in place) with Llama-3.2's real tokenizer on a tiny Llama-3.2-architecture model, whole
on CPU: the hf backend here; vLLM and lockstep LoRA students in tests/test_rehearsal_vllm.py."""

from __future__ import annotations

import json

import pytest

import soar

pytestmark = pytest.mark.timeout(600)


def rehearsal_cfg(model_dir, run_dir, *extra):
    return soar.compose(["experiment=paper_rehearsal", f"model.path={model_dir}", f"run.dir={run_dir}",
                         "run.progress=false", *extra])


def check_run(run_dir, summary, steps: int = 2) -> list[dict]:
    """What every rehearsal writes: a MATH-500 hard set, teacher questions in PQ, promoted students
    that carry the real tokenizer, and metrics for every phase."""
    from soar.models import load_tokenizer
    from soar.rehearsal import INSTRUCT_EOS_IDS

    assert summary["steps"] == steps and len(summary["promotions"]) == steps  # tau=-1, window 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    hard = [json.loads(line) for line in (run_dir / "hard_set" / "hard_train.jsonl").read_text().splitlines()]
    assert hard and all(p["id"].startswith("test/") for p in hard)  # MATH-500's unique ids
    for r in rows:
        assert 0 < r["teacher/valid_frac"] <= 1
        assert "student/inner_reward_mean" in r and "teacher/pg_loss" in r and r["teacher/skipped_zero_adv"] == 0
        assert r["student/inner_skipped_frac"] == 0  # every student's backward ran
        assert r["compute/student_steps"] == 2 * 2 * r["student/inner_steps"]  # g * r * K
    assert [r["student/inner_steps"] for r in rows] == [1, 2][:steps]  # K +1 per promotion
    pq = [json.loads(line) for line in (run_dir / "pq.jsonl").read_text().splitlines()]
    assert len(pq) == 2 * steps and all(p["question"] for p in pq)
    promoted = run_dir / summary["promotions"][-1]["path"]
    tok = load_tokenizer(soar.compose(["model=custom", f"model.path={promoted}"]).model)
    assert len(tok) == 128256 and tok.bos_token_id == 128000 and tok.eos_token_id == 128009
    assert json.loads((promoted / "config.json").read_text())["eos_token_id"] == INSTRUCT_EOS_IDS
    return rows


def test_paper_rehearsal_on_hf(rehearsal_model_dir, tmp_path):
    run_dir = tmp_path / "hf"
    summary = soar.train(rehearsal_cfg(rehearsal_model_dir, run_dir))
    check_run(run_dir, summary)
