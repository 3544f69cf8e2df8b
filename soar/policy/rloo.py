"""The pure pieces of RLOO (Ahmadian et al. 2024) as SOAR's students and teacher use them: advantages,
the k3 KL estimator, per-token log-probs and the policy-gradient loss, and what a policy's step returns
(``StepResult``). No state, so tests pin them by hand.

Shape suffixes (the legend is ``soar/__init__.py``'s): ``_QG`` = (questions, samples per question),
``_BT`` = (sequences, tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from soar.config import LOGITS_CHUNK_ELEMENTS


@dataclass
class StepResult:
    metrics: dict
    rewards_QG: torch.Tensor
    skipped: bool


def rloo_advantages(rewards_QG: torch.Tensor) -> torch.Tensor:
    """A_i = R_i - mean_{j != i} R_j within each row (a question's group, or a teacher's g sets)."""
    g = rewards_QG.shape[-1]
    if g < 2:
        raise ValueError(f"RLOO needs >= 2 samples per group, got {g}")
    others_mean = (rewards_QG.sum(-1, keepdim=True) - rewards_QG) / (g - 1)
    return rewards_QG - others_mean


def k3_kl(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0."""
    delta = ref_logp_BT - logp_BT
    return torch.exp(delta) - delta - 1.0


CHUNKED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""``config.model_type``s whose logits are exactly ``get_output_embeddings()(decoder output)`` (no
soft-capping or scaling after the head), so ``token_logprobs`` may compute them a chunk at a time."""


def decoder_and_head(model):
    """(decoder, LM head) of a causal LM (a peft model's base: its adapters live inside the base's
    modules), or None where the logits are not just the head over the decoder's output."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in CHUNKED_MODEL_TYPES or not hasattr(base, "get_decoder"):
        return None
    return base.get_decoder(), base.get_output_embeddings()


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, temperature: float = 1.0,
                   raw: bool = False, chunk_elements: int = LOGITS_CHUNK_ELEMENTS):
    """log p_T(x_t | x_<t) for t >= 1 under the policy sampled at ``temperature`` (softmax of logits / T,
    as vLLM and HF sample, and as TRL and verl score rollouts); shape (B, T-1), aligned with
    ``input_ids_BT[:, 1:]``. With ``raw``, also the T = 1 log-probs from the same forward pass (what
    vLLM returns as a sampled token's log-prob), as a detached second tensor.

    The vocabulary logits are never materialised for the whole micro-batch: the decoder's hidden
    states go through the LM head ``chunk_elements`` logits at a time, each chunk under activation
    checkpointing (its logits are recomputed in backward), so the extra memory is one chunk's, not
    B x T x V fp32 values and their log-softmax copy. Values and gradients are those of
    ``full_token_logprobs`` (which models outside ``CHUNKED_MODEL_TYPES`` still use)."""
    parts = decoder_and_head(model)
    if parts is None:
        return full_token_logprobs(model, input_ids_BT, attention_mask_BT, temperature, raw)
    decoder, head = parts
    hidden_BTH = decoder(input_ids=input_ids_BT, attention_mask=attention_mask_BT,
                         use_cache=False).last_hidden_state[:, :-1]
    targets_BT = input_ids_BT[:, 1:]
    batch, width = targets_BT.shape
    step = max(1, chunk_elements // max(batch * head.weight.shape[0], 1))
    checkpointed = torch.is_grad_enabled() and hidden_BTH.requires_grad
    chunks = []
    for start in range(0, width, step):
        args = (head, hidden_BTH[:, start:start + step], targets_BT[:, start:start + step], temperature, raw)
        if checkpointed:
            chunks.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            chunks.append(_chunk_logprobs(*args))
    logp = torch.cat([c[0] for c in chunks], dim=1)
    if not raw:
        return logp
    return logp, torch.cat([c[1] for c in chunks], dim=1).detach()


def _chunk_logprobs(head, hidden_BCH, targets_BC, temperature: float, raw: bool):
    """One chunk of ``token_logprobs``: (tempered log-probs, T = 1 log-probs or the same tensor)."""
    return _gathered_logprobs(head(hidden_BCH).float(), targets_BC[..., None], temperature, raw)


def _gathered_logprobs(logits, targets, temperature: float, raw: bool):
    logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, -1).gather(-1, targets).squeeze(-1)
    if not raw or temperature == 1.0:
        return logp, logp
    return logp, torch.log_softmax(logits.detach(), -1).gather(-1, targets).squeeze(-1)


def full_token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, temperature: float = 1.0,
                        raw: bool = False):
    """``token_logprobs`` from the model's full (B, T, V) logits: for models whose logits are more than
    the head over the decoder's output, and the reference the chunked path is tested against."""
    logits = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, use_cache=False).logits[:, :-1].float()
    logp, raw_logp = _gathered_logprobs(logits, input_ids_BT[:, 1:, None], temperature, raw)
    return (logp, raw_logp.detach()) if raw else logp


def distill_token_weights(logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor, mask_BT: torch.Tensor,
                          coef: float) -> torch.Tensor:
    """On-policy context distillation as per-token policy-gradient weights: ``-coef * (log pi(x_t) - log
    pi_teacher(x_t))`` on the tokens of ``mask_BT``, detached. ``x_t`` is the policy's own sampled token and
    ``log pi - log pi_teacher`` the per-token reverse-KL estimate KL(pi || pi_teacher) at that position;
    since E_pi[grad log pi] = 0, -sum(w * log pi) has, in expectation over the policy's samples, the
    gradient of ``coef`` times the per-token reverse KL (each position's own KL, no sum over later
    tokens), as in on-policy distillation (Agarwal et al. 2024; Thinking Machines 2025). Added to the
    RLOO weights, ``weighted_rloo_loss`` mixes the two."""
    return -coef * (logp_BT.detach() - teacher_logp_BT) * mask_BT


def completion_values(values_BT: torch.Tensor, prompt_ids: list[list[int]], completion_ids: list[list[int]]
                      ) -> list[list[float]]:
    """Each completion's own values out of a ``pack_sequences`` layout (the inverse of
    ``pack_completion_values``): row i, positions ``len(prompt_i) - 1`` onwards, one per completion token."""
    return [values_BT[i, len(p) - 1: len(p) - 1 + len(c)].tolist()
            for i, (p, c) in enumerate(zip(prompt_ids, completion_ids))]


def pack_completion_values(prompt_ids: list[list[int]], values: list[list[float]], width: int) -> torch.Tensor:
    """Per-completion-token values (e.g. an engine's log-probs) laid out like ``pack_sequences``'s mask."""
    out = torch.zeros((len(values), width - 1), dtype=torch.float32)
    for i, (p, v) in enumerate(zip(prompt_ids, values)):
        out[i, len(p) - 1: len(p) - 1 + len(v)] = torch.tensor(v, dtype=torch.float32)
    return out


def pack_sequences(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int):
    """Right-padded prompt+completion tensors and a mask over completion positions (shifted by 1)."""
    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(lengths), width), dtype=torch.long)
    comp_mask = torch.zeros((len(lengths), width - 1), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attn[i, : len(p) + len(c)] = 1
        comp_mask[i, len(p) - 1: len(p) + len(c) - 1] = 1.0  # positions predicting completion tokens
    return ids, attn, comp_mask


def rloo_loss(logp_BT, ref_logp_BT, comp_mask_BT, adv_B, kl_coef: float, normaliser: float):
    """Policy-gradient + KL loss of one micro-batch, divided by a constant of the *whole* batch, so
    accumulating micro-batches gives exactly the full-batch gradient.

    Returns (loss, pg_term, kl_sum) where kl_sum is the unnormalised sum of per-token KL.
    """
    return weighted_rloo_loss(logp_BT, ref_logp_BT, adv_B[:, None] * comp_mask_BT, comp_mask_BT, kl_coef, normaliser)


def weighted_rloo_loss(logp, ref_logp, pg_weight, kl_weight, kl_coef: float, normaliser: float):
    """``rloo_loss`` as sums over scored tokens: -sum(pg_weight * logp) / normaliser + kl_coef *
    sum(kl_weight * k3) / normaliser. A rollout's tokens weigh its advantage and 1; on a prefix tree of
    rollouts (``soar.stacked_llama.CompletionTree``) a shared token weighs the sum of the advantages of
    the rollouts through it and their count, which gives the same loss and gradient.

    Returns (loss, pg_term, kl_sum) where kl_sum is the unnormalised sum of per-token KL.
    """
    pg = -(pg_weight * logp).sum() / normaliser
    kl_sum = (k3_kl(logp, ref_logp) * kl_weight).sum() if ref_logp is not None else logp.new_zeros(())
    loss = pg + kl_coef * kl_sum / normaliser
    return loss, pg, kl_sum
