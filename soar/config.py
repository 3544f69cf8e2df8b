"""Structured configuration for every soar stage.

Hydra composes these dataclasses with the YAML groups under ``conf/`` (``model``, ``data``,
``backend``, ``student``, ``filter``, ``experiment``). Each field's docstring is its documentation;
paper defaults come from Table 3 (``shared/docs/soar-paper.md`` §8).

    soar-rl model.path=out/world data=custom data.path=train.jsonl student.max_steps=20
    python -c "import soar; print(soar.compose(['student.lr=1e-4']).student.lr)"
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

PAPER_STUDENT_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves "
    "it. The assistant first shows the complete reasoning process step by step, then provides the "
    "final answer in \\boxed{}. The assistant must always follow the format: 'User: [question] "
    "Assistant: [detailed reasoning] The final answer is: \\boxed{[answer]}.\n\n"
    'User: {question} Assistant: "'
)


@dataclass
class LoraConfig:
    r: int = 0
    """LoRA rank; 0 trains the full model (the paper's setting; lr 1e-5 is a full-FT value)."""
    alpha: int = 16
    """LoRA scaling numerator (peft ``lora_alpha``)."""
    dropout: float = 0.0
    """LoRA dropout; 0 keeps sampling and training log-probs identical."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that receive adapters (Llama naming)."""


@dataclass
class ModelConfig:
    path: str = MISSING
    """Hugging Face hub id or local directory in HF format (config.json + weights + tokenizer)."""
    revision: Optional[str] = None
    """Hub revision (branch, tag or commit); recorded in manifests. Ignored for local paths."""
    dtype: str = "float32"
    """Weights dtype: float32 | bfloat16 | float16. CPU runs use float32."""
    max_context: Optional[int] = None
    """Context length to validate prompts against; None reads ``max_position_embeddings``."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained``; keep False unless the model needs custom code."""


@dataclass
class DataConfig:
    name: str = "custom"
    """Short name of the question source, used in provenance."""
    path: Optional[str] = None
    """A JSONL / JSON / parquet file, a ``save_to_disk`` folder, or a hub dataset id."""
    split: str = "train"
    """Split to read when ``path`` is a hub id or a DatasetDict folder."""
    problem_key: str = "question"
    """Column holding the question text."""
    answer_key: str = "answer"
    """Column holding the gold answer (a bare answer, not a solution)."""
    id_key: Optional[str] = "id"
    """Column holding a stable id; rows without one get ``<name>/<row index>``."""
    limit: Optional[int] = None
    """Keep only the first ``limit`` valid problems (None: all)."""
    on_bad_row: str = "skip"
    """A row with a missing/empty field: ``skip`` (reported with file, row, field) or ``error``."""
    prompt_template: str = PAPER_STUDENT_TEMPLATE
    """Student prompt with a ``{question}`` slot; the paper's prompt by default (§2)."""
    grader: str = "math_verify"
    """Grader name (``math_verify`` | ``integer``) or dotted path ``pkg.module:Class``."""
    eval_path: Optional[str] = None
    """Optional held-out questions (same format as ``path``) evaluated greedily by ``soar-rl``."""


@dataclass
class BackendConfig:
    name: str = "auto"
    """Generation backend: ``hf`` (transformers generate), ``vllm``, or ``auto`` (vllm if
    importable and implemented, else hf)."""
    batch_size: int = 256
    """Most sequences per HF ``generate`` call (prompts x samples); bounds memory."""


@dataclass
class StudentConfig:
    questions_per_step: int = 8
    """Questions per RLOO step (paper: batch size 8)."""
    group_size: int = 32
    """Samples per question; RLOO's leave-one-out baseline is taken within a group (paper: 32)."""
    max_steps: int = 10
    """Optimiser steps (paper inner loop: 10, +5 per promotion)."""
    lr: float = 1e-5
    """Peak AdamW learning rate (paper: 1e-5, full fine-tuning)."""
    warmup_steps: int = 0
    """Linear warm-up steps (paper: 0 in the inner loop, 20 for fresh-student runs)."""
    min_lr_ratio: float = 0.0
    """Cosine decay floor as a fraction of ``lr`` (not stated in the paper)."""
    weight_decay: float = 0.0
    """AdamW weight decay (not stated in the paper)."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas (not stated in the paper; torch defaults)."""
    max_grad_norm: Optional[float] = 1.0
    """Gradient clipping norm; None disables (not stated in the paper)."""
    kl_coef: float = 0.001
    """Coefficient of the per-token k3 KL to the reference policy (paper: 0.001)."""
    temperature: float = 1.0
    """Sampling temperature for rollouts (paper: 1.0)."""
    max_tokens: int = 1024
    """Most generated tokens per rollout (paper: 1024)."""
    stop: list[str] = field(default_factory=list)
    """Extra stop strings for rollouts (EOS always stops)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward; gradients accumulate to exactly the full-batch gradient."""
    loss_norm: str = "sequence"
    """``sequence``: sum of token log-probs per rollout, divided by the number of rollouts (the
    RLOO estimator); ``token``: divided by the total completion tokens of the step."""
    skip_zero_adv: bool = True
    """Skip the optimiser step when every advantage is 0 (no group has signal): otherwise Adam
    turns the tiny KL-only gradient into a full-size update."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings; ``lora.r=0`` is full fine-tuning."""
    eval_every: int = 0
    """Greedy evaluation on ``data.eval_path`` every N steps (0: only at start and end)."""
    eval_max_tokens: Optional[int] = None
    """Token budget for greedy evaluation (None: ``max_tokens``)."""
    save_every: int = 5
    """Checkpoint every N steps (and at the end); resume starts from the last one."""


@dataclass
class FilterConfig:
    k: int = 128
    """Samples per problem (paper: fail@128)."""
    temperature: float = 1.0
    """Sampling temperature (paper: 1.0)."""
    max_tokens: int = 1024
    """Most generated tokens per sample (paper: 1024)."""
    problems_per_batch: int = 2
    """Problems per generation batch; the manifest is appended once per batch."""
    test_frac: float = 0.5
    """Fraction of the 0/k problems that go to the hard test split (paper: 50/50)."""
    mixed_group_sizes: list[int] = field(default_factory=lambda: [8, 32])
    """Group sizes G for which the summary reports P(a group of G samples is mixed)."""


@dataclass
class RunConfig:
    name: str = "default"
    """Run name; the run directory is ``runs/<name>`` unless ``run.dir`` is set."""
    dir: Optional[str] = None
    """Fixed run directory (not Hydra's timestamped folder); holds config, metrics, checkpoints."""
    resume: str = "auto"
    """``auto``: resume if a checkpoint exists; ``never``: refuse a non-empty run dir; ``must``:
    fail unless a checkpoint exists."""
    threads: int = 0
    """torch intra-op threads (0: all cores). More threads than cores is a config error."""
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks: console, jsonl (always added), wandb, tensorboard."""
    progress: bool = True
    """Show tqdm progress bars."""


@dataclass
class SoarConfig:
    seed: int = 0
    """Run seed; every random choice derives from it (see ``soar.seeding``)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    run: RunConfig = field(default_factory=RunConfig)
    world: Any = None
    """Embedded-world settings (``conf/world``); None outside the embedded world."""


def conf_dir() -> Path:
    """The Hydra config folder: ``soar/conf`` in an installed wheel, ``conf/`` in a checkout."""
    packaged = Path(__file__).resolve().parent / "conf"  # wheel: conf/ is mapped into the package
    if (packaged / "config.yaml").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "conf"  # checkout or editable install


_registered = False


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (idempotent)."""
    global _registered
    if _registered:
        return
    from hydra.core.config_store import ConfigStore

    from soar.worlds.arith import ArithWorldConfig

    cs = ConfigStore.instance()
    cs.store(name="soar_schema", node=SoarConfig)
    cs.store(group="world", name="arith_schema", node=ArithWorldConfig)
    _registered = True


def compose(overrides: list[str] | None = None, config_name: str = "config"):
    """Compose a config without running a CLI, e.g. ``soar.compose(["experiment=arith_micro"])``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name=config_name, overrides=list(overrides or []))


class ConfigError(ValueError):
    """A configuration problem; the message names the offending field."""


def _fail(field_name: str, message: str) -> None:
    raise ConfigError(f"config error: {field_name}: {message}")


def validate(cfg, stage: str) -> None:
    """Check sizes, paths and resources before any heavy work. ``stage``: rl | filter | world.

    Context-length checks need the tokenizer and live in ``soar.models.check_context``.
    """
    cores = os.cpu_count() or 1
    if cfg.run.threads < 0 or cfg.run.threads > cores:
        _fail("run.threads", f"{cfg.run.threads} threads requested but this machine has {cores} cores")
    if cfg.run.resume not in ("auto", "never", "must"):
        _fail("run.resume", f"must be auto, never or must, got {cfg.run.resume!r}")
    if cfg.backend.name not in ("auto", "hf", "vllm"):
        _fail("backend.name", f"must be auto, hf or vllm, got {cfg.backend.name!r}")
    if cfg.backend.batch_size < 1:
        _fail("backend.batch_size", "must be >= 1")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16"):
        _fail("model.dtype", f"must be float32, bfloat16 or float16, got {cfg.model.dtype!r}")
    if stage in ("rl", "filter"):
        if cfg.model.path in (None, "", "???"):
            _fail("model.path", "is required (a hub id or a local HF folder)")
        if _looks_local(cfg.model.path) and not Path(cfg.model.path).exists():
            _fail("model.path", f"local path {cfg.model.path} does not exist")
        if cfg.data.path in (None, "", "???"):
            _fail("data.path", "is required (JSONL/parquet file, save_to_disk folder or hub id)")
        if _looks_local(cfg.data.path) and not Path(cfg.data.path).exists():
            _fail("data.path", f"file {cfg.data.path} does not exist")
        if "{question}" not in cfg.data.prompt_template:
            _fail("data.prompt_template", "must contain a {question} slot")
        if cfg.data.on_bad_row not in ("skip", "error"):
            _fail("data.on_bad_row", f"must be skip or error, got {cfg.data.on_bad_row!r}")
        if cfg.data.limit is not None and cfg.data.limit < 1:
            _fail("data.limit", "must be >= 1 or null")
    if stage == "rl":
        s = cfg.student
        if s.group_size < 2:
            _fail("student.group_size", f"RLOO needs >= 2 samples per question, got {s.group_size}")
        for name in ("questions_per_step", "max_steps", "max_tokens", "micro_batch_size", "save_every"):
            if getattr(s, name) < 1:
                _fail(f"student.{name}", f"must be >= 1, got {getattr(s, name)}")
        if s.lr <= 0:
            _fail("student.lr", "must be > 0")
        if s.warmup_steps < 0 or s.warmup_steps >= s.max_steps and s.warmup_steps > 0:
            _fail("student.warmup_steps", f"must be in [0, max_steps={s.max_steps})")
        if s.temperature <= 0:
            _fail("student.temperature", "must be > 0 for sampling (greedy is used for evaluation)")
        if s.loss_norm not in ("sequence", "token"):
            _fail("student.loss_norm", f"must be sequence or token, got {s.loss_norm!r}")
        if s.kl_coef < 0:
            _fail("student.kl_coef", "must be >= 0")
        if s.lora.r < 0:
            _fail("student.lora.r", "must be >= 0 (0 = full fine-tuning)")
        if cfg.data.eval_path and _looks_local(cfg.data.eval_path) and not Path(cfg.data.eval_path).exists():
            _fail("data.eval_path", f"file {cfg.data.eval_path} does not exist")
    if stage == "filter":
        f = cfg.filter
        if f.k < 1:
            _fail("filter.k", f"must be >= 1, got {f.k}")
        if f.max_tokens < 1:
            _fail("filter.max_tokens", "must be >= 1")
        if f.problems_per_batch < 1:
            _fail("filter.problems_per_batch", "must be >= 1")
        if not 0.0 < f.test_frac < 1.0:
            _fail("filter.test_frac", f"must be in (0, 1), got {f.test_frac}")
        if f.temperature <= 0:
            _fail("filter.temperature", "must be > 0")


def _looks_local(path: str | None) -> bool:
    """Hub ids look like ``org/name``; anything absolute, relative-dotted or with a suffix is local."""
    if not path:
        return False
    p = str(path)
    return p.startswith(("/", ".", "~")) or p.endswith((".jsonl", ".json", ".parquet")) or p.count("/") >= 2
