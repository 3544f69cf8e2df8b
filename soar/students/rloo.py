"""The pure pieces of RLOO (Ahmadian et al. 2024) as used for SOAR students: advantages, the k3 KL
estimator, per-token log-probs and the policy-gradient loss. No state, so tests pin them by hand.

Shape suffixes: ``_QG`` = (questions, samples per question), ``_BT`` = (sequences, tokens).
"""

from __future__ import annotations

import torch


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


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, temperature: float = 1.0,
                   raw: bool = False):
    """log p_T(x_t | x_<t) for t >= 1 under the policy sampled at ``temperature`` (softmax of logits / T,
    as vLLM and HF sample, and as TRL and verl score rollouts); shape (B, T-1), aligned with
    ``input_ids_BT[:, 1:]``. With ``raw``, also the T = 1 log-probs from the same forward pass (what
    vLLM returns as a sampled token's log-prob), as a detached second tensor."""
    logits = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT).logits[:, :-1].float()
    targets = input_ids_BT[:, 1:, None]
    logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, -1).gather(-1, targets).squeeze(-1)
    if not raw:
        return logp
    if temperature == 1.0:
        return logp, logp.detach()
    return logp, torch.log_softmax(logits.detach(), -1).gather(-1, targets).squeeze(-1)


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
