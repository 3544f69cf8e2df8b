"""S copies of one Llama as stacked weights: every parameter gets a leading dimension of size S, and one
forward, backward or decode step serves all S copies with batched matrix products (``torch.bmm``).

    stack = StackedLlama(model, copies=16)        # model: a transformers LlamaForCausalLM
    tokens_SCT = stack.sample(stack.params, prompt_ids_SQP, prompt_mask_SQP, n=8, max_tokens=24, stop_ids=[2],
                              uniforms_SCT=u, temperature=1.0)
    tree = CompletionTree.build(completions_SQ, pad_id=0)     # each prompt's completions as a prefix tree
    logp_SQN = stack.tree_logprobs(stack.params, prompt_ids_SQP, prompt_mask_SQP, tree, temperature=1.0)

It is the math of ``transformers``' ``LlamaForCausalLM`` (RMSNorm, rotary embeddings from its own
``LlamaRotaryEmbedding``, grouped-query attention, SwiGLU, a tied or separate LM head), laid out for the
students of one outer step (``soar.students.stacked``):

- **Shared prompts.** A question's ``n`` samples share its prompt: it is run once per question, and its
  keys and values are read by every sample through a split attention (the prompt's keys per question,
  each sample's own keys per row, one softmax over both), never copied per sample.
- **Shared completion prefixes.** A prompt's samples often agree on their first tokens (in the embedded
  world every answer starts ``\boxed{`` and most share leading digits): the training and reference passes
  run each distinct prefix once, as a tree (``CompletionTree``), each node attending to its prompt and its
  ancestors. A token's log-probability is read from its parent's output, and the loss weighs each node by
  the rollouts through it, so the gradient is the per-rollout one (``soar.policy.rloo.weighted_rloo_loss``).
- **Layout.** Prompts are left-padded to a common width (positions count real tokens only, as
  ``transformers`` places a left-padded prompt), completions right-padded; a padded position may only see
  itself, so no attention row is empty.

Shape suffixes (beside ``soar``'s legend): ``S`` copies, ``Q`` prompts per copy, ``n`` samples per prompt,
``C`` = Q·n completion rows, ``U`` = S·Q prompts of all copies, ``P`` prompt width, ``W`` completion
positions, ``N`` tree nodes and ``I`` inner nodes (those with children) per prompt, ``V`` vocabulary, ``H``
hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from soar.samples import draw_tokens

SUPPORTED_MODEL_TYPES = ("llama",)


class StackedLlama:
    """The architecture of one ``LlamaForCausalLM`` and ``copies`` stacked copies of its weights
    (``params``: name -> tensor (S, *shape), leaves that require grad)."""

    def __init__(self, model, copies: int):
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        cfg = model.config
        act = getattr(cfg, "hidden_act", None)
        if cfg.model_type not in SUPPORTED_MODEL_TYPES or act != "silu":
            raise ValueError(f"stacked students support Llama models (silu MLP), not {cfg.model_type} ({act})")
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.layers, self.eps = cfg.num_hidden_layers, cfg.rms_norm_eps
        self.tied = "lm_head.weight" not in dict(model.named_parameters())  # a tied head is the embedding
        self.rotary = LlamaRotaryEmbedding(cfg).to(model.device)
        with torch.no_grad():
            self.params = {name: p.detach().unsqueeze(0).repeat(copies, *[1] * p.dim()).requires_grad_()
                           for name, p in model.named_parameters()}

    @property
    def copies(self) -> int:
        return next(iter(self.params.values())).shape[0]

    def copy_into(self, model, index: int):
        """``model`` (the architecture this stack came from) with copy ``index``'s weights loaded."""
        with torch.no_grad():
            named = dict(model.named_parameters())
            for name, value in self.params.items():
                named[name].copy_(value[index])
        return model

    # ---- the layers ----------------------------------------------------------------------------
    def _norm(self, x_SNH, weight_SH):
        # transformers' LlamaRMSNorm: normalise in float32, then scale by the weight
        x = x_SNH.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight_SH[:, None, :] * x.to(x_SNH.dtype)

    def _proj(self, params, name: str, x_SNI):
        out = torch.bmm(x_SNI, params[name + ".weight"].transpose(1, 2))
        bias = params.get(name + ".bias")
        return out if bias is None else out + bias[:, None, :]

    def _embed(self, params, ids_SN):
        table = params["model.embed_tokens.weight"]  # (S, V, H)
        return table.gather(1, ids_SN[..., None].expand(*ids_SN.shape, table.shape[-1]))

    def _logits(self, params, h_SNH):
        head = params["model.embed_tokens.weight" if self.tied else "lm_head.weight"]
        return torch.bmm(self._norm(h_SNH, params["model.norm.weight"]), head.transpose(1, 2))

    def _qkv(self, params, i: int, h_SNH, rows: int, width: int, rope):
        """Layer ``i``'s queries (B, heads, W, d), keys and values (B, kv_heads, W, d), rotary applied,
        for B = S·rows sequences of ``width`` positions."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        x = self._norm(h_SNH, params[f"model.layers.{i}.input_layernorm.weight"])
        pre, batch = f"model.layers.{i}.self_attn.", h_SNH.shape[0] * rows

        def heads(t, count):
            return t.view(batch, width, count, self.head_dim).transpose(1, 2)

        q = heads(self._proj(params, pre + "q_proj", x), self.heads)
        k = heads(self._proj(params, pre + "k_proj", x), self.kv_heads)
        v = heads(self._proj(params, pre + "v_proj", x), self.kv_heads)
        q, k = apply_rotary_pos_emb(q, k, *rope)
        return q, k, v

    def _rope(self, positions_BW, like):
        return self.rotary(like, positions_BW)

    def _finish_layer(self, params, i: int, h_SNH, attn_BhWd):
        """Residual stream after layer ``i``: the attention output projected and added, then the MLP."""
        S = h_SNH.shape[0]
        attn = attn_BhWd.transpose(1, 2).reshape(S, -1, self.heads * self.head_dim)
        h = h_SNH + self._proj(params, f"model.layers.{i}.self_attn.o_proj", attn)
        pre = f"model.layers.{i}.mlp."
        x = self._norm(h, params[f"model.layers.{i}.post_attention_layernorm.weight"])
        return h + self._proj(params, pre + "down_proj", F.silu(self._proj(params, pre + "gate_proj", x))
                              * self._proj(params, pre + "up_proj", x))

    def _split_attention(self, q, prompt_k, prompt_v, prompt_allowed_G11P, own_k, own_v, own_allowed_B1WK, n: int):
        """Attention of the U·n rows' queries q (U·n, heads, W, d) over their prompt's keys (U, kv, P, d),
        allowed where ``prompt_allowed`` (U, 1, 1, P), and their own keys (U·n, kv, K, d), allowed where
        ``own_allowed`` (U·n or 1, 1, W, K): one softmax over both parts, computed in two products so the prompt's keys
        are read once per prompt. Returns (U·n, heads, W, d)."""
        U, kv, P, d = prompt_k.shape
        rep, W = self.heads // kv, q.shape[2]
        scale = d ** -0.5
        # (U·n, heads, W, d) -> (U, kv, rep·n·W, d): every query of a prompt against its keys at once
        q_prompt = q.reshape(U, n, kv, rep, W, d).permute(0, 2, 3, 1, 4, 5).reshape(U, kv, rep * n * W, d)
        # the softmax in float32 (as transformers' eager attention), the products in the weights' dtype
        scores_p = (q_prompt @ prompt_k.transpose(-1, -2)).float() * scale  # (U, kv, rep·n·W, P)
        scores_p = scores_p.masked_fill(~prompt_allowed_G11P, float("-inf"))
        scores_o = (q.reshape(U * n, kv, rep * W, d) @ own_k.transpose(-1, -2)).float() * scale  # (U·n, kv, rep·W, K)
        scores_o = scores_o.masked_fill(~own_allowed_B1WK.repeat(1, 1, rep, 1), float("-inf"))
        # the same layout for both: (U, kv, rep, n, W, ·)
        scores_p = scores_p.view(U, kv, rep, n, W, P)
        scores_o = scores_o.view(U, n, kv, rep, W, -1).permute(0, 2, 3, 1, 4, 5)
        top = torch.maximum(scores_p.amax(-1, keepdim=True), scores_o.amax(-1, keepdim=True)).detach()
        weights_p, weights_o = (scores_p - top).exp(), (scores_o - top).exp()
        total = weights_p.sum(-1, keepdim=True) + weights_o.sum(-1, keepdim=True)
        dtype = prompt_v.dtype
        out_p = weights_p.reshape(U, kv, rep * n * W, P).to(dtype) @ prompt_v  # (U, kv, rep·n·W, d)
        out_o = weights_o.permute(0, 3, 1, 2, 4, 5).reshape(U * n, kv, rep * W, -1).to(dtype) @ own_v  # (U·n, kv, rep·W, d)
        out = out_p.view(U, kv, rep, n, W, d) + out_o.view(U, n, kv, rep, W, d).permute(0, 2, 3, 1, 4, 5)
        out = (out / total).to(dtype)
        return out.permute(0, 3, 1, 2, 4, 5).reshape(U * n, self.heads, W, d)

    def _decode_attention(self, q, prompt_kT, prompt_v, prompt_allowed_G11P, own_k, own_v, n: int):
        """``_split_attention`` for one new position per row (q: (U·n, heads, 1, d); the prompts' keys
        transposed, (U, kv, d, P); own keys (U·n, kv, K, d), all allowed), with the rows' own part as
        elementwise products, which beat many tiny matrix products."""
        U, kv, d, P = prompt_kT.shape
        rep = self.heads // kv
        scale = d ** -0.5
        q_rows = q.view(U * n, kv, rep, d)
        scores_p = (q_rows.view(U, n, kv, rep, d).transpose(1, 2).reshape(U, kv, n * rep, d)
                    @ prompt_kT).float() * scale  # (U, kv, n·rep, P)
        scores_p = scores_p.masked_fill(~prompt_allowed_G11P, float("-inf"))
        scores_p = scores_p.view(U, kv, n, rep, P).transpose(1, 2).reshape(U * n, kv, rep, P)
        scores_o = (q_rows[:, :, :, None, :] * own_k[:, :, None]).float().sum(-1) * scale  # (U·n, kv, rep, K)
        top = torch.maximum(scores_p.amax(-1, keepdim=True), scores_o.amax(-1, keepdim=True))
        weights_p, weights_o = (scores_p - top).exp(), (scores_o - top).exp()
        total = weights_p.sum(-1, keepdim=True) + weights_o.sum(-1, keepdim=True)
        dtype = prompt_v.dtype
        out_p = weights_p.view(U, n, kv, rep, P).transpose(1, 2).reshape(U, kv, n * rep, P).to(dtype) @ prompt_v
        out_p = out_p.view(U, kv, n, rep, d).transpose(1, 2).reshape(U * n, kv, rep, d)
        out_o = (weights_o[..., None].to(dtype) * own_v[:, :, None]).sum(-2)  # (U·n, kv, rep, d)
        return ((out_p + out_o) / total).to(dtype).reshape(U * n, self.heads, 1, d)

    # ---- prompts ------------------------------------------------------------------------------
    def prefill(self, params, prompt_ids_SQP, prompt_mask_SQP) -> "Prompts":
        """Run the (left-padded) prompts (``Prompts``: what their completions need of them)."""
        S, Q, P = prompt_ids_SQP.shape
        mask_UP = prompt_mask_SQP.reshape(S * Q, P).bool()
        device = mask_UP.device
        allowed = torch.ones(P, P, dtype=torch.bool, device=device).tril_() & mask_UP[:, None, :]
        allowed = (allowed | torch.eye(P, dtype=torch.bool, device=device))[:, None]  # (U, 1, P, P)
        h = self._embed(params, prompt_ids_SQP.reshape(S, Q * P))
        rope = self._rope((mask_UP.long().cumsum(-1) - 1).clamp_(min=0), h)
        keys, values = [], []
        for i in range(self.layers):
            q, k, v = self._qkv(params, i, h, Q, P, rope)
            keys.append(k)
            values.append(v)
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.head_dim ** -0.5,
                                                  enable_gqa=self.kv_heads != self.heads)
            h = self._finish_layer(params, i, h, attn)
        return Prompts(keys, values, mask_UP[:, None, None, :], self._logits(params, h.view(S, Q, P, -1)[:, :, -1]),
                       prompt_mask_SQP.sum(-1))

    # ---- log-probs of given completions ---------------------------------------------------------
    def completion_logprobs(self, params, prompts: "Prompts", completion_ids_SQnC, temperature: float):
        """log p_T(c_t | prompt, c_<t) of every completion token (S, Q, n, C) under softmax(logits / T), given
        the prompts' ``prefill`` (positions past a completion's end: mask them)."""
        S, Q, n, C = completion_ids_SQnC.shape
        keys, values, prompt_allowed, first_SQV = prompts.keys, prompts.values, prompts.allowed_G11P, prompts.first_SQV
        logits = first_SQV[:, :, None, None, :].expand(S, Q, n, 1, first_SQV.shape[-1])
        if C > 1:  # tokens 1.. are predicted by the completion's own positions 0..C-2
            W, device = C - 1, completion_ids_SQnC.device
            positions = (prompts.length_SQ[:, :, None, None] + torch.arange(W, device=device))
            h = self._embed(params, completion_ids_SQnC[..., :-1].reshape(S, Q * n * W))
            rope = self._rope(positions.expand(S, Q, n, W).reshape(S * Q * n, W), h)
            causal = torch.ones(W, W, dtype=torch.bool, device=device).tril_()[None, None]
            for i in range(self.layers):
                q, k, v = self._qkv(params, i, h, Q * n, W, rope)
                h = self._finish_layer(params, i, h, self._split_attention(q, keys[i], values[i], prompt_allowed,
                                                                           k, v, causal, n))
            logits = torch.cat([logits, self._logits(params, h).view(S, Q, n, W, -1)], dim=3)
        return log_probs(logits, completion_ids_SQnC, temperature)

    # ---- log-probs of completions given as prefix trees --------------------------------------------
    def tree_logprobs(self, params, prompts: "Prompts", tree: "CompletionTree", temperature: float):
        """log p_T(token | prompt, ancestors) of every node of each prompt's completion tree (S, Q, N) under
        softmax(logits / T), given the prompts' ``prefill``: each inner node runs once, attending to its
        prompt and its ancestors; a node's log-prob is read from its parent's output (the prompt's last
        position for a first token). Padding nodes hold garbage (their weights are 0)."""
        S, Q = prompts.length_SQ.shape
        keys, values, prompt_allowed = prompts.keys, prompts.values, prompts.allowed_G11P
        sources = prompts.first_SQV[:, :, None]  # (S, Q, 1 + I, V): what predicts the tree's tokens
        width = tree.inner_SQI.shape[-1]  # I
        if width > 0:
            positions = (prompts.length_SQ[:, :, None] + tree.depth_SQI).reshape(S * Q, width)
            h = self._embed(params, tree.inner_SQI.reshape(S, Q * width))
            rope = self._rope(positions, h)
            allowed = tree.allowed_SQII.reshape(S * Q, 1, width, width)
            for i in range(self.layers):
                q, k, v = self._qkv(params, i, h, Q, width, rope)
                h = self._finish_layer(params, i, h, self._split_attention(q, keys[i], values[i], prompt_allowed,
                                                                           k, v, allowed, 1))
            sources = torch.cat([sources, self._logits(params, h).view(S, Q, width, -1)], dim=2)
        index = tree.source_SQN[..., None].expand(*tree.source_SQN.shape, sources.shape[-1])
        return log_probs(sources.gather(2, index), tree.token_SQN, temperature)

    # ---- sampling ------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, params, prompt_ids_SQP, prompt_mask_SQP, n: int, max_tokens: int, stop_ids: list[int],
               uniforms_SCT: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
        """Completions (S, R, max_tokens), row q·n + i being sample i of prompt q, drawn with
        ``uniforms_SCT[:, row, t]`` (``soar.samples.draw_tokens``; greedy when None). Rows that still agree
        (same prompt, same tokens so far) are run once: each step runs one representative of every distinct
        unfinished prefix, whose keys and values all its rows then share. Rows are extended past their stop
        (callers cut at the first stop id); decoding ends when every row has stopped (later positions hold
        0) or at ``max_tokens``."""
        S, Q, P = prompt_ids_SQP.shape
        R, device = Q * n, prompt_ids_SQP.device
        B = S * R
        prompts = self.prefill(params, prompt_ids_SQP, prompt_mask_SQP)
        prompt_allowed, first_SQV = prompts.allowed_G11P, prompts.first_SQV
        keys_T = [k.transpose(-1, -2).contiguous() for k in prompts.keys]  # read every step: laid out once
        values = [v.contiguous() for v in prompts.values]
        vocab = first_SQV.shape[-1]
        own_k, own_v = [], []  # per layer, each row's own keys and values: (B, kv, max_tokens, d), filled per step
        for k in values:
            own_k.append(k.new_empty(B, self.kv_heads, max_tokens, self.head_dim))
            own_v.append(k.new_empty(B, self.kv_heads, max_tokens, self.head_dim))
        rows = torch.arange(B, device=device)
        prompt_len_B = prompt_mask_SQP.sum(-1).reshape(-1)[rows // n]
        rep_B = rows // n * n  # the row that stands for this row's prefix: first the prompt's first sample
        stops = torch.tensor(stop_ids, device=device)
        drawn = []  # per step, (B,) tokens
        stopped = torch.zeros(B, dtype=torch.bool, device=device)
        logits_BV = first_SQV[:, :, None].expand(S, Q, n, vocab).reshape(B, -1)
        for t in range(max_tokens):
            if uniforms_SCT is None:
                drawn.append(logits_BV.argmax(-1))
            else:
                drawn.append(draw_tokens(logits_BV, uniforms_SCT[:, :, t].reshape(-1), temperature))
            stopped |= torch.isin(drawn[-1], stops)
            if t + 1 == max_tokens or bool(stopped.all()):
                break
            # rows whose prefixes through token t agree: one group each, its lowest row its representative
            _, group_B = torch.unique(rep_B * vocab + drawn[-1], return_inverse=True)
            first = torch.full((int(group_B.max()) + 1,), B, device=device).scatter_reduce_(0, group_B, rows, "amin")
            rep_B = first[group_B]
            live = torch.unique(rep_B[~stopped])  # the prefixes that need a next token, sorted: by copy
            counts = torch.bincount(live // R, minlength=S)
            D = int(counts.max())
            start = torch.cumsum(counts, 0) - counts
            slot_live = (live // R) * D + torch.arange(live.numel(), device=device) - start[live // R]
            run_SD = torch.repeat_interleave(live[start.clamp(max=live.numel() - 1)], D).view(S, D).clone()
            run_SD.view(-1)[slot_live] = live  # unused slots repeat a copy's first live prefix (or any row)
            slot_of = torch.zeros(B, dtype=torch.long, device=device)
            slot_of[live] = slot_live
            row_slot_B = slot_of[rep_B]  # stopped rows read some slot: their next tokens are never used
            run = run_SD.view(-1)
            h = self._embed(params, drawn[-1][run].view(S, D))
            rope = self._rope((prompt_len_B[run] + t)[:, None], h)
            for i in range(self.layers):
                q, k, v = self._qkv(params, i, h, D, 1, rope)
                own_k[i][:, :, t] = k[row_slot_B, :, 0]  # every row of a group gets its representative's
                own_v[i][:, :, t] = v[row_slot_B, :, 0]
                # attention for every row at once (dense per prompt, no gathers), then the runs' rows
                attn = self._decode_attention(q[row_slot_B], keys_T[i], values[i], prompt_allowed,
                                              own_k[i][:, :, : t + 1], own_v[i][:, :, : t + 1], n)
                h = self._finish_layer(params, i, h, attn[run])
            logits_BV = self._logits(params, h).reshape(S * D, -1)[row_slot_B]
        return F.pad(torch.stack(drawn, -1), (0, max_tokens - len(drawn))).view(S, R, max_tokens)


@dataclass
class Prompts:
    """What completions need of their (left-padded) prompts, from ``StackedLlama.prefill``: per layer the
    prompts' keys and values (U, kv_heads, P, d), the mask of their real positions (U, 1, 1, P), the logits
    of the token after each prompt (S, Q, V) and their lengths (S, Q)."""

    keys: list
    values: list
    allowed_G11P: torch.Tensor
    first_SQV: torch.Tensor
    length_SQ: torch.Tensor

    def select(self, index_Sc: torch.Tensor) -> "Prompts":
        """The prompts ``index_Sc[s]`` of each copy s, in that order."""
        S, Q = self.length_SQ.shape

        def rows(t):  # (S·Q, ...) -> (S·c, ...)
            chosen = t.view(S, Q, *t.shape[1:]).gather(1, index_Sc.view(*index_Sc.shape, *[1] * (t.dim() - 1))
                                                        .expand(*index_Sc.shape, *t.shape[1:]))
            return chosen.reshape(-1, *t.shape[1:])

        return Prompts([rows(k) for k in self.keys], [rows(v) for v in self.values], rows(self.allowed_G11P),
                       self.first_SQV.gather(1, index_Sc[..., None].expand(*index_Sc.shape, self.first_SQV.shape[-1])),
                       self.length_SQ.gather(1, index_Sc))


@dataclass
class CompletionTree:
    """Each prompt's completions as a prefix tree, padded to one size: node x of prompt (s, q) is a distinct
    prefix, ``token_SQN`` its last token, predicted by ``source_SQN`` (0: the prompt's last position; 1 + i:
    inner node i). Inner nodes (those with children) are what the model runs: ``inner_SQI`` their tokens,
    ``depth_SQI`` their offsets after the prompt, ``allowed_SQII`` ancestor-or-self. ``paths`` lists, per
    prompt, each completion's nodes in order (how ``soar.policy.rloo.weighted_rloo_loss`` weighs them)."""

    token_SQN: torch.Tensor
    source_SQN: torch.Tensor
    inner_SQI: torch.Tensor
    depth_SQI: torch.Tensor
    allowed_SQII: torch.Tensor
    paths: list

    @classmethod
    def build(cls, completions_SQ: list[list[list[list[int]]]], pad_id: int) -> "CompletionTree":
        """From ``completions_SQ[s][q]``: the list of that prompt's completions (token ids)."""
        S, Q = len(completions_SQ), len(completions_SQ[0])
        groups = [_prefix_tree(completions) for student in completions_SQ for completions in student]
        N = max(1, max(len(g[0]) for g in groups))
        n_inner = max(len(g[2]) for g in groups)
        token, source = np.full((S * Q, N), pad_id), np.zeros((S * Q, N), dtype=np.int64)
        inner, depth = np.full((S * Q, n_inner), pad_id), np.zeros((S * Q, n_inner), dtype=np.int64)
        allowed = np.broadcast_to(np.eye(n_inner, dtype=bool), (S * Q, n_inner, n_inner)).copy()  # padding: itself
        for g, (tokens, sources, inner_nodes, depths, ancestors, _) in enumerate(groups):
            token[g, : len(tokens)], source[g, : len(sources)] = tokens, sources
            inner[g, : len(inner_nodes)], depth[g, : len(depths)] = inner_nodes, depths
            allowed[g, : len(inner_nodes), : len(inner_nodes)] = ancestors
        paths = [[g[5] for g in groups[s * Q:(s + 1) * Q]] for s in range(S)]

        def as_tensor(a, *shape):
            return torch.from_numpy(a).reshape(S, Q, *shape)

        return cls(as_tensor(token, N), as_tensor(source, N), as_tensor(inner, n_inner), as_tensor(depth, n_inner),
                   as_tensor(allowed, n_inner, n_inner), paths)

    def weights(self, adv_SQn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per node (S, Q, N): the sum of the advantages of the completions through it (``adv_SQn`` per
        completion), and their count: the token weights of ``soar.policy.rloo.weighted_rloo_loss``."""
        pg = torch.zeros(self.token_SQN.shape, dtype=torch.float32)
        count = torch.zeros(self.token_SQN.shape, dtype=torch.float32)
        for s, student in enumerate(self.paths):
            for q, paths in enumerate(student):
                for path, adv in zip(paths, adv_SQn[s][q].tolist()):
                    pg[s, q, path] += adv
                    count[s, q, path] += 1.0
        return pg.to(self.token_SQN.device), count.to(self.token_SQN.device)

    def to(self, device) -> "CompletionTree":
        return CompletionTree(*(t.to(device) for t in (self.token_SQN, self.source_SQN, self.inner_SQI, self.depth_SQI,
                                                        self.allowed_SQII)), self.paths)


def _prefix_tree(completions: list[list[int]]):
    """One prompt's tree: node tokens, their sources, inner-node tokens, depths and ancestor-or-self matrix,
    and each completion's path of nodes."""
    index: dict[tuple[int, int], int] = {}  # (parent node or -1, token) -> node
    tokens, parents, depths, paths = [], [], [], []
    for completion in completions:
        node, path = -1, []
        for t, token in enumerate(completion):
            key = (node, token)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(token)
                parents.append(node)
                depths.append(t)
            node = index[key]
            path.append(node)
        paths.append(path)
    has_child = sorted({p for p in parents if p >= 0})  # parents come before their children
    inner_of = {node: i for i, node in enumerate(has_child)}
    ancestors = np.zeros((len(has_child), len(has_child)), dtype=bool)
    for i, node in enumerate(has_child):
        parent = parents[node]
        if parent >= 0:
            ancestors[i] = ancestors[inner_of[parent]]
        ancestors[i, i] = True
    sources = [0 if p < 0 else 1 + inner_of[p] for p in parents]
    return (tokens, sources, [tokens[x] for x in has_child], [depths[x] for x in has_child], ancestors, paths)


def log_probs(logits, targets, temperature: float):
    """log softmax(logits / T) at ``targets`` (logits: targets' shape + (V,)), in float32."""
    logits = logits.float()
    logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, -1)
    return logp.gather(-1, targets[..., None]).squeeze(-1)
