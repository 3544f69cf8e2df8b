"""What generators exchange: ``SamplingParams`` in, ``Sample`` out, the ``Generator`` protocol, and the
seeded draw that turns a row's logits into its next token.

A module of its own so both backends (``soar.generation``'s HF one and ``soar.vllm_backend``) and the
stacked students (``soar.students.stacked``) build on it without importing each other;
``soar.generation`` re-exports the first three.

Sampling is by inverse CDF from one uniform per (row, step): row ``r`` of a request (prompt ``r // n``,
sample ``r % n``) takes at step ``t`` the first token whose cumulative probability under
softmax(logits / T) exceeds ``U[r, t]``, and ``U`` is a pure function of the request's seed. A row's
tokens therefore depend on its seed, its index and its logits only, not on the batch it shares with
other rows: the hf backend gives the same samples at any ``backend.batch_size``, and the g·r students
trained as one stacked model sample exactly what each would sample alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    """Samples per prompt."""
    temperature: float = 1.0
    """Sampling temperature; ignored when ``greedy``."""
    max_tokens: int = 1024
    """Most generated tokens."""
    seed: int = 0
    """Seed of this call; same seed, prompts and weights give the same samples on one machine."""
    greedy: bool = False
    """Argmax decoding (``n`` must be 1)."""
    stop: tuple[str, ...] = ()
    """Stop strings (EOS always stops); the text is cut before the stop string."""
    logprobs: bool = False
    """Return the model's (temperature-1) log-prob of each generated token."""


@dataclass
class Sample:
    text: str
    """Decoded completion without special tokens, cut at a stop string."""
    token_ids: list[int]
    """Generated token ids, including a final EOS when the model emitted one."""
    finish_reason: str
    """``stop`` (EOS or a stop string) or ``length`` (hit ``max_tokens``)."""
    logprobs: list[float] | None = field(default=None)
    """Per-token log-probs of ``token_ids`` when requested."""


class Generator(Protocol):
    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]: ...

    def sync_weights(self, model) -> None:
        """Generate from ``model``'s current weights from now on (after an update, or another model)."""


def sampling_uniforms(seed: int, rows: int, steps: int) -> torch.Tensor:
    """``U[row, step]`` in [0, 1): the draws of a request of ``rows`` rows seeded ``seed``, one per token."""
    return torch.rand((rows, steps), generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def draw_tokens(logits_RV: torch.Tensor, uniforms_R: torch.Tensor, temperature: float) -> torch.Tensor:
    """One token per row from softmax(logits / temperature) by inverse CDF: the first index whose
    cumulative probability exceeds ``uniforms_R`` (scaled by the row's total, so rounding in the sum never
    runs past the vocabulary; zero-probability tokens are never drawn)."""
    logits = logits_RV.float()
    cdf_RV = torch.softmax(logits / temperature if temperature != 1.0 else logits, -1).cumsum(-1)
    threshold_R1 = uniforms_R.to(cdf_RV.device, cdf_RV.dtype)[:, None] * cdf_RV[:, -1:]
    return torch.searchsorted(cdf_RV, threshold_R1, right=True).squeeze(-1).clamp_(max=cdf_RV.shape[-1] - 1)
