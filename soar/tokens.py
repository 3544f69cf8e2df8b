"""The token ids a prompt is conditioned on, and the ids that end a completion: one definition for
every backend and trainer, so what a generator samples from is exactly what a trainer scores.

- ``encode_prompt``: the prompt's ids as the tokenizer encodes a document, i.e. with the BOS it adds
  by default (Llama-3's ``<|begin_of_text|>``; none for the world's character tokenizer), exactly
  once: a prompt whose text already starts with the BOS string (e.g. rendered by a chat template)
  does not get a second one. The hf backend, the vLLM backend (``TokensPrompt``: vLLM would add the
  BOS itself to a text prompt) and the trainers' log-prob passes all use it.
- ``stop_token_ids``: the tokenizer's EOS plus the model's other end-of-sequence ids
  (``generation_config.eos_token_id`` / ``config.eos_token_id``, e.g. Llama-3.2-Instruct's
  ``<|end_of_text|>``, ``<|eom_id|>``, ``<|eot_id|>``), which vLLM stops on by default.
"""

from __future__ import annotations


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer's default encoding starts a text with its BOS token."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    return tokenizer("a").input_ids[:1] == [bos] and tokenizer("a", add_special_tokens=False).input_ids[:1] != [bos]


def encode_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's ids without special tokens, with the tokenizer's BOS in front (once) when it adds one."""
    bos = [tokenizer.bos_token_id] if adds_bos(tokenizer) else []
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        out.append(ids if not bos or ids[:1] == bos else bos + ids)
    return out


def encode_prompt(tokenizer, text: str) -> list[int]:
    return encode_prompts(tokenizer, [text])[0]


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS first, then the model's other EOS ids
    (generation config, then model config), without duplicates. ``model`` may be a peft model."""
    ids = _as_list(getattr(tokenizer, "eos_token_id", None))
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        ids += _as_list(getattr(source, "eos_token_id", None))
    return list(dict.fromkeys(ids))
