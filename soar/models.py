"""Model and tokenizer loading, policy export (a peft adapter merged into a copy of its base), plus the
project's own character-level Llama (no download).

    from soar.models import build_char_tokenizer, build_tiny_llama, export_policy, load_model, load_tokenizer
"""

from __future__ import annotations

import copy
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from soar.config import ConfigError
from soar.tokens import encode_prompts

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))  # newline + printable ASCII


def build_char_tokenizer():
    """A fast tokenizer with one token per character (printable ASCII + newline + 4 specials)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *CHARS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # [\s\S] (not ".") so newlines in templates are single tokens too.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )
    tok.padding_side = "left"  # generation pads on the left; training sets its own layout
    return tok


def build_tiny_llama(tokenizer, hidden: int = 128, layers: int = 4, heads: int = 4,
                     intermediate: int | None = None, max_positions: int = 2048, seed: int = 0):
    """A small randomly initialised ``LlamaForCausalLM`` sized for CPU experiments."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@contextmanager
def quiet_transformers():
    """transformers' progress bars ("Loading weights", "Writing model shards") off while soar loads or
    saves a model itself: the bar would sit among soar's own lines, and print its frames into a log.
    ``transformers.utils.logging.disable_progress_bar``, restored afterwards; where the bars are already
    off, or ``HF_HUB_DISABLE_PROGRESS_BARS`` decides them, nothing changes."""
    from transformers.utils import logging as hf_logging

    if not hf_logging.is_progress_bar_enabled() or "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ:
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


@contextmanager
def _model_load_errors(model_cfg, what: str):
    """A model folder or hub id that cannot be loaded is the user's to fix: one ``ConfigError`` naming
    ``model.path`` instead of transformers' chained tracebacks. A local folder's ``config.json`` is
    checked first, so a broken one is named with its JSON error."""
    folder = Path(model_cfg.path).expanduser()
    if folder.is_dir():
        config = folder / "config.json"
        if not config.is_file():
            raise ConfigError(f"config error: model.path: {folder} has no config.json (not a Hugging Face model folder)")
        try:
            json.loads(config.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config error: model.path: {config} is not valid JSON ({exc})") from None
        for weights in sorted(folder.glob("*.safetensors")):
            _check_safetensors_size(weights)
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, ValueError, SafetensorError) as exc:  # missing or corrupt files, an unknown architecture
        raise ConfigError(f"config error: model.path: cannot load the {what} from {model_cfg.path}: "
                          f"{' '.join(str(exc).split()) or type(exc).__name__}") from exc


def _check_safetensors_size(path: Path) -> None:
    """A ``.safetensors`` file is as long as its header says (a copy cut short made safetensors raise
    "incomplete metadata" from deep inside ``from_pretrained``); names the file and both sizes."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(header_len)) if 8 + header_len <= size else None
        if header is None:
            raise ValueError(f"its {header_len}-byte header does not fit")
        data_end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError) as exc:  # json.JSONDecodeError is a ValueError
        raise ConfigError(f"config error: model.path: {path} is not a readable safetensors file ({exc}); "
                          "copy it again") from None
    if size < 8 + header_len + data_end:
        raise ConfigError(f"config error: model.path: {path} is truncated ({size:,} of {8 + header_len + data_end:,} "
                          "bytes); copy it again")


def load_tokenizer(model_cfg):
    from transformers import AutoTokenizer

    with _model_load_errors(model_cfg, "tokenizer"):
        tok = AutoTokenizer.from_pretrained(
            model_cfg.path, revision=model_cfg.revision, trust_remote_code=model_cfg.trust_remote_code
        )
    if tok.pad_token is None:  # Llama-3 ships without a pad token
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(model_cfg):
    from transformers import AutoModelForCausalLM

    with _model_load_errors(model_cfg, "model"), quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(
            model_cfg.path,
            revision=model_cfg.revision,
            dtype=_DTYPES[model_cfg.dtype],
            trust_remote_code=model_cfg.trust_remote_code,
        )
    model.generation_config.pad_token_id = model.config.pad_token_id
    device = getattr(model_cfg, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device)


def model_context(model, model_cfg) -> int:
    return int(model_cfg.max_context or model.config.max_position_embeddings)


def check_context(tokenizer, prompts: list[str], max_tokens: int, context: int, where: str,
                  names: list[str] | None = None) -> int:
    """Fail early if the longest prompt plus the generation budget exceeds the model context, naming
    that prompt by ``names`` (e.g. problem ids) when given, and what fixes it: a prompt that fills the
    context by itself is left out or shortened; otherwise ``where`` lowered to what fits. A prompt too
    long to fit whatever its tokens is refused before tokenising (a 50 MB question took 20 GB to
    tokenise)."""
    _check_prompt_chars(tokenizer, prompts, context, where, names)
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]  # BOS included
    if not lengths:
        return 0
    i = max(range(len(lengths)), key=lengths.__getitem__)
    longest, which = lengths[i], f"the prompt of {names[i]!r}" if names else "the longest prompt"
    if longest >= context:
        raise ConfigError(f"config error: {where}: {which} has {longest} tokens, as many as the model context "
                          f"({context}) holds or more, before any is generated; leave it out or shorten it")
    if longest + max_tokens > context:
        raise ConfigError(
            f"config error: {where}: {which} ({longest} tokens) + max tokens ({max_tokens}) = "
            f"{longest + max_tokens} exceeds the model context ({context}); lower {where} to "
            f"{context - longest} or less, or shorten that prompt or the template"
        )
    return longest


def _check_prompt_chars(tokenizer, prompts: list[str], context: int, where: str, names: list[str] | None) -> None:
    """No token spans more characters than the vocabulary's longest token string (a byte-level token's
    string has one character per byte), so a prompt longer than ``context`` times that cannot fit."""
    if not prompts:
        return
    i = max(range(len(prompts)), key=lambda j: len(prompts[j]))
    chars = len(prompts[i])
    if chars <= context:  # fits whatever the vocabulary (the token check decides); skips reading it
        return
    per_token = max(map(len, tokenizer.get_vocab()), default=1)
    if chars > context * per_token:
        which = f"the prompt of {names[i]!r}" if names else f"prompt {i}"
        raise ConfigError(f"config error: {where}: {which} has {chars:,} characters, more than the model context "
                          f"({context} tokens of at most {per_token} characters each) can hold; leave it out or "
                          "shorten it")


def set_threads(threads: int) -> int:
    """Set torch's intra-op threads (0 = all cores); returns the number used."""
    n = threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def model_fingerprint(model_cfg) -> str:
    """Model id + revision for provenance (local folders: resolved path)."""
    p = Path(model_cfg.path).expanduser()
    ident = str(p.resolve()) if p.exists() else model_cfg.path
    return f"{ident}@{model_cfg.revision or 'main'}"


def export_policy(model):
    """A standalone copy of a policy: a peft model's adapter merged into a copy of its base."""
    if is_peft(model):
        return copy.deepcopy(model).merge_and_unload()
    return copy.deepcopy(model)


def is_peft(model) -> bool:
    peft = sys.modules.get("peft")  # never imported: cannot be a peft model (and no import cost)
    return peft is not None and isinstance(model, peft.PeftModel)


def save_policy(model, tokenizer, out_dir) -> None:
    """HF-format policy (merged) plus the adapter itself under ``adapter/`` for a peft model."""
    with quiet_transformers():  # a promotion's save, between the outer loop's step lines
        if is_peft(model):
            model.save_pretrained(str(out_dir) + "/adapter")
        export_policy(model).save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)


__all__ = ["build_char_tokenizer", "build_tiny_llama", "load_tokenizer", "load_model",
           "check_context", "set_threads", "model_context", "model_fingerprint", "export_policy", "is_peft",
           "save_policy"]
