"""RLOO pieces against hand-computed values, and gradient accumulation == full batch."""

import math

import pytest
import torch

from soar.policy.rloo import k3_kl, pack_sequences, rloo_advantages, rloo_loss, token_logprobs

pytestmark = pytest.mark.timeout(120)


def test_rloo_advantages_hand_computed():
    rewards = torch.tensor([[120.0, 10.0, 0.0, 10.0]])
    # A_0 = 120 - (10+0+10)/3 ; A_1 = 10 - (120+0+10)/3 ; A_2 = 0 - 140/3 ; A_3 = A_1
    expected = torch.tensor([[120 - 20 / 3, 10 - 130 / 3, -140 / 3, 10 - 130 / 3]])
    assert torch.allclose(rloo_advantages(rewards), expected)


def test_rloo_advantages_sum_zero_shift_invariant_and_flat_groups():
    torch.manual_seed(0)
    r = torch.rand(5, 7) * 100
    a = rloo_advantages(r)
    assert torch.allclose(a.sum(-1), torch.zeros(5), atol=1e-4)
    assert torch.allclose(rloo_advantages(r + 37.0), a, atol=1e-4)
    assert (rloo_advantages(torch.full((2, 4), 10.0)) == 0).all()
    with pytest.raises(ValueError, match="RLOO needs >= 2"):
        rloo_advantages(torch.ones(3, 1))


def test_k3_kl_values():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.2)])
    kl = k3_kl(logp, ref)
    # r = ref/p = 0.5 -> 0.5 - ln 0.5 - 1 ; identical policies -> 0
    assert kl[0].item() == pytest.approx(0.5 - math.log(0.5) - 1, abs=1e-6)
    assert kl[1].item() == pytest.approx(0.0, abs=1e-7)
    assert (k3_kl(torch.randn(100), torch.randn(100)) >= 0).all()


def test_pack_sequences_masks_completion_positions():
    ids, attn, mask = pack_sequences([[5, 6, 7], [5]], [[8, 9], [10, 11, 12]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9], [5, 10, 11, 12, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # mask position t marks the prediction of token t+1
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]


def test_loss_terms_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    ref = logp.clone()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([2.0, -1.0])
    loss, pg, kl_sum = rloo_loss(logp, ref, mask, adv, kl_coef=0.1, normaliser=2.0)
    # pg = -(2*(-3) + (-1)*(-1.5)) / 2 = -(-6 + 1.5)/2 = 2.25 ; KL = 0 when policy == reference
    assert pg.item() == pytest.approx(2.25)
    assert kl_sum.item() == pytest.approx(0.0)
    assert loss.item() == pytest.approx(2.25)


@pytest.mark.parametrize("loss_norm", ["sequence", "token"])
def test_micro_batch_1_equals_8(loss_norm):
    """Gradient accumulation with micro-batch 1 gives the full-batch (micro-batch 8) gradient."""
    from types import SimpleNamespace

    from soar.models import build_char_tokenizer, build_tiny_llama
    from soar.policy.trainer import RLOOTrainer

    tok = build_char_tokenizer()
    grads = []
    for micro in (1, 8):
        model = build_tiny_llama(tok, hidden=32, layers=2, heads=2, max_positions=64, seed=1)
        ref = build_tiny_llama(tok, hidden=32, layers=2, heads=2, max_positions=64, seed=2)
        cfg = SimpleNamespace(lora=SimpleNamespace(r=0), lr=1e-3, adam_betas=[0.9, 0.999], weight_decay=0.0,
                              warmup_steps=0, max_steps=1, min_lr_ratio=0.0, micro_batch_size=micro,
                              loss_norm=loss_norm, kl_coef=0.01, max_grad_norm=None, temperature=1.0,
                              precision="mixed", gradient_checkpointing=False)
        trainer = RLOOTrainer(model, tok, grader=None, policy_cfg=cfg, prompt_template="{question}", seed=0, ref_model=ref)
        prompts = [tok(f"Q{i}:", add_special_tokens=False).input_ids for i in range(8)]
        comps = [tok("x" * (i + 1), add_special_tokens=False).input_ids for i in range(8)]
        adv = torch.linspace(-3, 3, 8)
        trainer.accumulate_gradients(prompts, comps, adv)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_token_logprobs_match_manual_softmax():
    from soar.models import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=32, layers=1, heads=2, max_positions=32, seed=3).eval()
    ids = torch.tensor([tok("abc", add_special_tokens=False).input_ids])
    lp = token_logprobs(model, ids, torch.ones_like(ids))
    logits = model(input_ids=ids).logits[0]
    manual = [torch.log_softmax(logits[t], -1)[ids[0, t + 1]].item() for t in range(2)]
    assert lp[0].tolist() == pytest.approx(manual, abs=1e-5)


def test_token_logprobs_at_a_temperature_score_the_sampled_policy():
    """At T != 1 the trained log-probs are those of softmax(logits / T), the distribution the rollouts
    came from; ``raw`` also returns the T = 1 ones (what an engine reports) from the same pass."""
    from soar.models import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=32, layers=1, heads=2, max_positions=32, seed=3).eval()
    ids = torch.tensor([tok("abcd", add_special_tokens=False).input_ids])
    logits = model(input_ids=ids).logits[0].detach()
    tempered, raw = token_logprobs(model, ids, torch.ones_like(ids), temperature=0.5, raw=True)
    assert tempered[0].tolist() == pytest.approx(
        [torch.log_softmax(logits[t] / 0.5, -1)[ids[0, t + 1]].item() for t in range(3)], abs=1e-5)
    assert raw[0].tolist() == pytest.approx(token_logprobs(model, ids, torch.ones_like(ids))[0].tolist(), abs=1e-6)
    assert not torch.allclose(tempered, raw)
    assert tempered.requires_grad and not raw.requires_grad


def _logprob_grads(model, fn, ids, attn, **kw):
    model.zero_grad(set_to_none=True)
    logp, raw = fn(model, ids, attn, raw=True, **kw)
    weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)
    (logp * weights).sum().backward()
    return logp.detach(), raw, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["fp32", "bf16", "lora"])
def test_chunked_logprobs_equal_full_logits_values_and_gradients(kind):
    """``token_logprobs`` goes through the LM head a few positions at a time (recomputed in backward):
    the same log-probs, T = 1 log-probs and parameter gradients as the full-vocabulary logits."""
    from peft import LoraConfig, get_peft_model

    from soar.models import build_char_tokenizer, build_tiny_llama
    from soar.policy.rloo import decoder_and_head, full_token_logprobs

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=32, layers=2, heads=2, max_positions=64, seed=4)
    if kind == "bf16":
        model = model.to(torch.bfloat16)
    if kind == "lora":
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert decoder_and_head(model) is not None
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, len(tok), (3, 20), generator=gen)
    attn = torch.ones_like(ids)
    attn[2, 15:] = 0  # a padded row
    full = _logprob_grads(model, full_token_logprobs, ids, attn, temperature=0.7)
    chunked = _logprob_grads(model, token_logprobs, ids, attn, temperature=0.7, chunk_elements=3 * len(tok) * 4)
    tol = dict(rtol=1e-2, atol=1e-2) if kind == "bf16" else dict(rtol=1e-5, atol=1e-6)
    assert torch.allclose(chunked[0], full[0], **tol) and torch.allclose(chunked[1], full[1], **tol)
    assert full[2].keys() == chunked[2].keys() and len(full[2]) > 0
    for name, grad in full[2].items():
        assert torch.allclose(chunked[2][name].float(), grad.float(), **tol), name
    with torch.no_grad():  # no grad: no checkpointing, same values
        assert torch.allclose(token_logprobs(model, ids, attn, chunk_elements=len(tok)),
                              full_token_logprobs(model, ids, attn), **tol)


MEMORY_SCRIPT = """
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from soar.policy.rloo import full_token_logprobs, token_logprobs
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True))
ids = torch.randint(0, 128256, (2, 513))
attn = torch.ones_like(ids)
def peak_mb():  # VmHWM: this process's own peak RSS (ru_maxrss would start at the forking parent's RSS)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
def step(fn, **kw):
    logp = fn(model, ids, attn, temperature=0.9, **kw)
    logp.sum().backward()
    model.zero_grad(set_to_none=True)
start = peak_mb()  # the chunked pass first: any one-off allocation counts against it
step(token_logprobs, chunk_elements=2**22)
chunked = peak_mb()
step(full_token_logprobs)
print(chunked - start, peak_mb() - chunked)
"""


@pytest.mark.timeout(180)
def test_chunked_logprobs_bound_peak_memory_at_llama3_vocabulary():
    """At Llama-3's vocabulary (128,256) and 2 x 512 positions, one fp32 copy of the full logits is
    525 MB: the chunked forward/backward (2^22 logits = 16 MB a chunk) grows the peak by under 150 MB
    (measured: 82 MB, one-off allocations such as the tied embedding's 33 MB gradient included), while
    the full-logits path (the only one before the fix) grows it by over one copy (measured: 1412 MB).
    Peak RSS of a fresh process (VmHWM: ``ru_maxrss`` survives exec, so in a child of a large pytest
    process, e.g. one holding a vLLM engine, it starts above both peaks and reads 0). A fixed malloc mmap threshold
    returns every large block to the system when freed: glibc's adaptive one keeps freed blocks of up
    to 32 MB in the heap, which grew the peak RSS by ~600 MB of free memory here."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True, timeout=170,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"})
    assert out.returncode == 0, out.stderr[-2000:]
    chunked_mb, full_mb = map(float, out.stdout.split())
    one_copy_mb = 2 * 512 * 128256 * 4 / 2**20
    assert chunked_mb < 150, (chunked_mb, full_mb)
    assert full_mb > one_copy_mb, (chunked_mb, full_mb)  # the measurement sees what it bounds


def test_gradient_checkpointing_gives_the_same_gradients():
    """``gradient_checkpointing`` recomputes activations in backward: the same loss gradient (full FT
    and LoRA), less memory (``soar.memory_plan``)."""
    from soar.config import LoraConfig, StudentConfig
    from soar.models import build_char_tokenizer, build_tiny_llama
    from soar.policy.trainer import RLOOTrainer

    tok = build_char_tokenizer()
    prompts = [tok(f"Q{i}:", add_special_tokens=False).input_ids for i in range(4)]
    comps = [tok("xy" * (i + 1), add_special_tokens=False).input_ids for i in range(4)]
    for lora in (LoraConfig(), LoraConfig(r=4, target_modules=["q_proj", "down_proj"])):
        grads = []
        for checkpointing in (False, True):
            model = build_tiny_llama(tok, hidden=32, layers=2, heads=2, max_positions=64, seed=1)
            ref = build_tiny_llama(tok, hidden=32, layers=2, heads=2, max_positions=64, seed=1) if lora.r == 0 else None
            cfg = StudentConfig(micro_batch_size=2, kl_coef=0.01, gradient_checkpointing=checkpointing, lora=lora)
            trainer = RLOOTrainer(model, tok, None, cfg, "{question}", 0, ref_model=ref)
            assert trainer.model.is_gradient_checkpointing == checkpointing
            trainer.accumulate_gradients(prompts, comps, torch.linspace(-1, 1, 4))
            grads.append({n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None})
        assert grads[0].keys() == grads[1].keys() and grads[0]
        for name, g in grads[0].items():
            assert torch.allclose(g, grads[1][name], rtol=1e-5, atol=1e-7), name
