"""What generators exchange: ``SamplingParams`` in, ``Sample`` out, and the ``Generator`` protocol.

A module of its own so both backends (``soar.generation``'s HF one and ``soar.vllm_backend``) build on
it without importing each other; ``soar.generation`` re-exports all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


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
