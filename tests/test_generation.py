"""HF generation backend: shapes, seeds, greedy, stop strings, finish reasons, log-probs."""

import pytest
import torch

from soar.generation import HFGenerator, SamplingParams, resolve_backend

from conftest import ARITH_TEMPLATE

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gen(tiny_model_dir):
    from types import SimpleNamespace

    from soar.models import load_model, load_tokenizer

    mcfg = SimpleNamespace(path=str(tiny_model_dir), revision=None, dtype="float32", trust_remote_code=False)
    return HFGenerator(load_model(mcfg), load_tokenizer(mcfg), batch_size=16)

PROMPTS = [ARITH_TEMPLATE.replace("{question}", q) for q in ("120+310", "555+555", "900+100")]


def test_n_samples_per_prompt_and_seed_determinism(gen):
    p = SamplingParams(n=5, temperature=1.0, max_tokens=16, seed=7)
    a, b = gen.generate(PROMPTS, p), gen.generate(PROMPTS, p)
    assert [len(x) for x in a] == [5, 5, 5]
    assert [[s.text for s in g] for g in a] == [[s.text for s in g] for g in b]
    c = gen.generate(PROMPTS, SamplingParams(n=5, temperature=1.0, max_tokens=16, seed=8))
    assert [[s.text for s in g] for g in a] != [[s.text for s in g] for g in c]


def test_batching_does_not_change_greedy_outputs(gen):
    """Left padding must not change results: a prompt alone == the same prompt in a padded batch."""
    p = SamplingParams(greedy=True, max_tokens=16)
    together = [g[0].text for g in gen.generate(PROMPTS, p)]
    alone = [gen.generate([q], p)[0][0].text for q in PROMPTS]
    assert together == alone
    assert all(t.startswith("\\boxed{") for t in together)


def test_greedy_is_argmax_and_logprobs_match_forward(gen):
    tok, model = gen.tokenizer, gen.model
    s = gen.generate([PROMPTS[0]], SamplingParams(greedy=True, max_tokens=8, logprobs=True))[0][0]
    ids = torch.tensor([tok(PROMPTS[0], add_special_tokens=False).input_ids + s.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    start = ids.shape[1] - len(s.token_ids)
    lp = torch.log_softmax(logits[start - 1:-1], -1)
    assert lp.argmax(-1).tolist() == s.token_ids
    assert s.logprobs == pytest.approx(lp.gather(-1, torch.tensor(s.token_ids)[:, None]).squeeze(-1).tolist(), abs=1e-4)


def test_finish_reasons_and_stop_strings(gen):
    short = gen.generate([PROMPTS[0]], SamplingParams(greedy=True, max_tokens=3))[0][0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    full = gen.generate([PROMPTS[0]], SamplingParams(greedy=True, max_tokens=30))[0][0]
    assert full.finish_reason == "stop" and full.token_ids[-1] == gen.tokenizer.eos_token_id
    cut = gen.generate([PROMPTS[0]], SamplingParams(greedy=True, max_tokens=30, stop=("{",)))[0][0]
    assert cut.text == "\\boxed" and cut.finish_reason == "stop"


def test_greedy_with_n_gt_1_is_rejected(gen):
    with pytest.raises(ValueError, match="greedy"):
        gen.generate(PROMPTS, SamplingParams(greedy=True, n=2))


def test_backend_resolution_per_role():
    import importlib.util

    import soar

    cfg = soar.compose(["backend=auto", "backend.teacher=hf", "backend.eval=vllm"])
    auto = "vllm" if importlib.util.find_spec("vllm") else "hf"
    assert [resolve_backend(cfg.backend, r) for r in ("filter", "teacher", "student", "eval")] == [auto, "hf", "hf", "vllm"]
    cfg.backend.filter = "tpu"
    with pytest.raises(ValueError, match="backend.filter"):
        resolve_backend(cfg.backend, "filter")
