"""The memory plan: what every GPU of a stage holds at its peak, from the config and the model's shape
alone (``AutoConfig`` and a model built on the ``meta`` device: no weights, no GPU), checked before any
heavy work; and the host RAM a worker of a local CPU student pool holds (``worker_ram_gb``).

    soar-estimate --plan experiment=paper_math model.path=DIR               # soar-train's GPUs
    soar-estimate --plan --stage rl experiment=band_rl model.path=DIR       # soar-rl's (also eval, filter)

Every stage that loads a model on a GPU runs it first (``soar.stage.setup_stage``: ``check_plan``), and
``soar-estimate --plan`` prints it on any machine. A layout whose GPU does not fit is refused, naming the
GPU, the processes and engines on it, by how much it is over, its largest terms and the fields that
change them.

**Processes** (``RolePlan``: one process's torch memory). ``soar-train``: the ``driver`` (the baseline
student, the teacher with its reference and optimiser, the in-process students when
``resources.num_workers`` is 0) and, with ``resources.gpus_per_student`` > 0, each ``student worker`` (a
Ray worker: its baseline copy, the student it trains, those it trained earlier in the step).
``soar-rl``: the policy trainer (policy, a full-FT reference, optimiser; an LLM coach loaded with HF).
``soar-eval``: a fresh student's trainer, or the evaluated model. ``soar-filter``: the filtered model.
**Engines** (``EnginePlan``): each vLLM engine is its own process with its own reservation
(``backend.vllm.gpu_memory_utilization`` of the GPU); a ``tensor_parallel_size`` of t puts a 1/t shard
on each of GPUs 0..t-1 of its process.

**GPUs** (``GpuPlan``). Everything that shares a GPU is summed: GPU 0 holds the stage's main process,
its engines' shards and, unless ``resources.driver_gpu_apart`` (the driver's GPU kept out of Ray's pool,
``slurm/soar.sbatch``'s ``SOAR_DRIVER_GPUS``), as many student workers as Ray may place on one GPU
(``1 / resources.gpus_per_student``: Ray does not know the driver uses it); every other GPU of the pool
holds that many workers and their engines. An engine left to size itself
(``gpu_memory_utilization`` null) is planned with what its GPU leaves: capacity, less every process
there (with slack and context), less ``VLLM_MARGIN_GIB``, shared equally by the engines sized there;
``soar.vllm_backend`` starts it with no more than that (``planned_engine_bytes``). An engine must hold
its weights, ``VLLM_OVERHEAD_GIB`` and the KV cache of ``backend.batch_size`` sequences; less counts as
that need, so its GPU fails.

Terms (``model.dtype`` bytes e per value; N parameters; T trainable ones: N, or the LoRA adapters):
weights N·e per model copy; under ``precision=mixed`` (low-precision trainable values) fp32 master
copies 4·T, fp32 gradients 4·T and AdamW moments 8·T (16 bytes per trainable parameter), else
gradients and moments in the trainable dtype (3 values); a full-FT policy's reference copy (a KL term,
or distillation's frozen teacher; a SOAR student's reference is the baseline itself; LoRA's is the base
with the adapter off); activations at the micro-batch (``activation_bytes``); the log-prob chunk's logits
(``soar.config.LOGITS_CHUNK_ELEMENTS``); one layer's T x T attention scores should SDPA fall back to its
math kernel (``sdpa_math_bytes``); HF generation's KV cache at ``backend.batch_size`` sequences.
Sequences are ``prompt_tokens`` (a parameter: the paper's prompt with MATH questions is 125 Llama-3
tokens at the median, 446 at the 99th percentile, 1352 at most; HARP 144 / 640 / 2725) plus the role's
``max_tokens``. Phases do not overlap: a process's peak is what it always holds plus its largest phase,
and it needs ``peak x (1 + FRAGMENTATION) + CUDA_CONTEXT_GIB``.

The activation count is that of transformers' Llama code in bf16 (fp32 RMSNorm inputs; SDPA saving
q, repeated k/v, its output and log-sum-exp; the padding mask), checked against the tensors autograd
saves on CPU (``tests/test_memory_plan.py``); GPU kernels may differ. **Not measured on a GPU**:
``benchmarks/gpu_check.py`` puts these figures beside measured peaks when one is at hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from soar.config import INFERENCE_METHODS, LOGITS_CHUNK_ELEMENTS, ConfigError
from soar.machine import GIB, gpu_capacity_gib, in_ray_actor
from soar.resolve import resolve_backend

PROMPT_TOKENS = 512
"""Default prompt length the plan assumes (tokens, BOS included): above the 99th percentile of MATH's
prompts in the paper's template (446 Llama-3 tokens) and the teacher's prompt (142)."""
FRAGMENTATION = 0.05
"""Allocator slack on each process's planned torch peak: what the caching allocator reserves beyond what
tensors hold. soar launches its GPU work with ``expandable_segments`` (``soar.machine.use_expandable_segments``), under
which PyTorch maps one growing virtual segment per stream and freed blocks in it merge, so a large
request no longer needs a free segment of its own size (PyTorch DevLog, E. Yang, "When does
fragmentation occur in the CUDA caching allocator?", 2026-06-01,
docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator). What remains is free space held
between live tensors and the pool of allocations under 1 MiB, which never merges with the large one
(the same post). Neither source gives a figure for that: 5 % is assumed until
``benchmarks/gpu_check.py``'s ``max_memory_reserved / max_memory_allocated`` (recorded for every part,
under expandable segments) measures it."""
CUDA_CONTEXT_GIB = 1.0
"""Memory a CUDA process holds outside torch's allocator (context, kernels, cuBLAS workspaces): assumed."""
VLLM_OVERHEAD_GIB = 2.0
"""vLLM engine memory beyond weights and KV cache (profiling activations, CUDA graphs, its own
context): assumed, not measured on a GPU (the GPU machine this project borrows has no vllm)."""
VLLM_MARGIN_GIB = 2.0
"""Memory left free on a GPU when engines size themselves (``gpu_memory_utilization`` null)."""
WORKER_RAM_GB = 0.9
"""Measured resident memory of one idle torch student worker (imports, tokenizer, grader)."""
RAY_RAM_GB = 0.64
"""Measured resident memory of a local Ray instance (GCS, raylet, object store bookkeeping)."""
STAGES = ("train", "rl", "eval", "filter")
"""The stages that load models on a GPU, each with its plan."""


@dataclass
class ModelShape:
    """What memory depends on in a causal LM's config (Llama naming)."""

    params: int
    """Parameters, tied embeddings counted once."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    largest_param: int
    """Elements of the largest parameter tensor (the embedding)."""
    linear_in_out: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per decoder-layer ``nn.Linear`` leaf name (``q_proj``, ...): (in_features, out_features)."""

    def adapter_params(self, rank: int, targets) -> int:
        """LoRA parameters: rank x (in + out) per targeted linear layer."""
        return self.layers * sum(rank * (i + o) for name, (i, o) in self.linear_in_out.items() if name in targets)

    def adapted_inputs(self, targets) -> int:
        """Per token and layer, the input features of the targeted linear layers."""
        return sum(i for name, (i, _) in self.linear_in_out.items() if name in targets)

    def kv_bytes_per_token(self, e: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * e


def model_shape(source, trust_remote_code: bool = False) -> ModelShape:
    """The shape of ``source``: a ``transformers`` config, or a model folder / hub id (its
    ``config.json``; a hub id needs the hub or its cache), built on the ``meta`` device."""
    import torch  # here, not at the top: --cfg job and the plan's stage list stay light (tests/test_config.py)
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(source, (str, Path)):
        try:
            config = AutoConfig.from_pretrained(str(source), trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"config error: model.path: the memory plan needs the model's config.json and cannot read "
                              f"it from {source} ({' '.join(str(exc).split())[:300]}); set model.path to a local copy")
    else:
        config = source
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    layer = model.get_decoder().layers[0]
    linears = {name.rsplit(".", 1)[-1]: (m.in_features, m.out_features) for name, m in layer.named_modules()
               if isinstance(m, torch.nn.Linear)}
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    return ModelShape(params=sum(p.numel() for p in model.parameters()), layers=text.num_hidden_layers,
                      hidden=text.hidden_size, intermediate=text.intermediate_size, heads=heads,
                      kv_heads=getattr(text, "num_key_value_heads", None) or heads,
                      head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads, vocab=text.vocab_size,
                      largest_param=max(p.numel() for p in model.parameters()), linear_in_out=linears)


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def teacher_prompt_tokens(prompt: str) -> int:
    """The teacher prompt's length in tokens, from its characters alone: one token per 3 (English
    runs ~4-5 characters per Llama-3 token: the paper's prompt is 142 tokens), plus BOS."""
    return math.ceil(len(prompt) / 3) + 1


def activation_bytes(shape: ModelShape, e: int, micro_batch: int, seq: int, checkpointing: bool = False,
                     fp32_adapter_inputs: int = 0) -> int:
    """Bytes autograd keeps for backward over one micro-batch of ``micro_batch`` x ``seq`` tokens in the
    decoder of a Llama-architecture model with ``e``-byte activations. Per token and layer: two RMSNorms
    (an fp32 copy of the input 4h, 1/rms, the normalised output e·h), attention (its input copies 2·e·h;
    q, repeated k and v, output 4·e·h; fp32 log-sum-exp per head), the SwiGLU MLP (gate, up, silu(gate),
    their product: 4·e·i), the padding mask (e·seq), rotary cos/sin; with fp32 LoRA adapters on a low-precision model,
    an fp32 copy of each adapted layer's input (``fp32_adapter_inputs`` features). With
    ``checkpointing`` only each layer's input is kept, plus one layer's activations while it is
    recomputed. The final norm and the token ids once."""
    h, i = shape.hidden, shape.intermediate
    per_token_layer = (8 * h + 8 + e * (8 * h + 4 * i) + 4 * shape.heads + e * seq + 2 * e * shape.head_dim
                       + 4 * fp32_adapter_inputs)
    tokens = micro_batch * seq
    layers = e * h * shape.layers + per_token_layer if checkpointing else per_token_layer * shape.layers
    return tokens * (layers + 4 * h + 4 + e * h + 8)


def logits_chunk_bytes(shape: ModelShape, e: int, micro_batch: int, seq: int) -> int:
    """The LM head's chunk while log-probs are computed (``soar.policy.rloo.token_logprobs``): its
    output (e) and, in fp32, the logits, their log-softmax and its gradient."""
    return min(LOGITS_CHUNK_ELEMENTS, micro_batch * seq * shape.vocab) * (e + 12)


def generation_bytes(shape: ModelShape, e: int, batch: int, seq: int) -> int:
    """HF ``generate``: the KV cache of ``batch`` sequences of ``seq`` tokens, and a few fp32 copies of
    a step's logits (sampling)."""
    return batch * seq * shape.kv_bytes_per_token(e) + 3 * batch * shape.vocab * 4


def sdpa_math_bytes(shape: ModelShape, micro_batch: int, seq: int) -> int:
    """One layer's attention scores should SDPA fall back to its math kernel (a mask or shape its fused
    kernels refuse): per sequence and head a seq x seq matrix of scores, their softmax (kept for backward)
    and its gradient, each in fp32 (torch's math path computes half-precision inputs in fp32). With
    gradient checkpointing that is the layer being recomputed; without, a fallback would also keep every
    layer's softmax (not counted: ``benchmarks/gpu_check.py`` records which kernel the training shapes
    get)."""
    return micro_batch * shape.heads * seq * seq * 12


@dataclass
class Term:
    what: str
    bytes: int
    fields: tuple[str, ...] = ()
    """Config fields that change it."""

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclass
class RolePlan:
    """One process's torch memory on its GPU."""

    name: str
    held: list[Term]
    """Held throughout."""
    phases: dict[str, list[Term]]
    """Transient memory by phase (phases do not overlap)."""

    @property
    def peak_phase(self) -> str | None:
        return max(self.phases, key=lambda p: sum(t.bytes for t in self.phases[p])) if self.phases else None

    @property
    def peak_gib(self) -> float:
        """Planned torch allocation at the peak (``torch.cuda.max_memory_allocated``)."""
        phase = self.peak_phase
        return (sum(t.bytes for t in self.held) + (sum(t.bytes for t in self.phases[phase]) if phase else 0)) / GIB

    @property
    def needs_gib(self) -> float:
        """GPU memory the process needs: its peak with allocator slack, and its CUDA context."""
        return self.peak_gib * (1 + FRAGMENTATION) + CUDA_CONTEXT_GIB

    def terms(self) -> list[Term]:
        """Held terms and the peak phase's, largest first."""
        phase = self.peak_phase
        return sorted(self.held + (self.phases[phase] if phase else []), key=lambda t: -t.bytes)

    def to_dict(self) -> dict:
        return {"role": self.name, "peak_gib": round(self.peak_gib, 2), "needs_gib": round(self.needs_gib, 2),
                "peak_phase": self.peak_phase, "held_gib": {t.what: round(t.gib, 3) for t in self.held},
                "phases_gib": {p: {t.what: round(t.gib, 3) for t in terms} for p, terms in self.phases.items()}}


@dataclass
class EnginePlan:
    """A vLLM engine (its own process) and its reservation on each GPU it spans."""

    name: str
    model_path: str
    role: str
    """The process that starts it (``RolePlan.name``)."""
    need: Term
    """What one shard must hold: weights / tp, ``VLLM_OVERHEAD_GIB``, the KV cache / tp."""
    utilization: float | None
    tensor_parallel: int = 1
    budget_bytes: int = 0
    """Per GPU: ``utilization`` x the GPU, or (null) what its GPU leaves (``place_engines``)."""

    @property
    def bytes(self) -> int:
        """Its reservation per GPU: the budget, or its need when the budget is smaller (so the GPU fails)."""
        return max(self.budget_bytes, self.need.bytes)

    @property
    def gib(self) -> float:
        return self.bytes / GIB

    @property
    def fits_budget(self) -> bool:
        return self.budget_bytes >= self.need.bytes

    def describe(self) -> str:
        shard = f", {self.tensor_parallel}-way tensor parallel" if self.tensor_parallel > 1 else ""
        how = "sized to what the GPU leaves" if self.utilization is None else f"{self.utilization} of the GPU"
        return (f"{self.name} ({how}: {self.budget_bytes / GIB:.1f} GiB{shard}; needs {self.need.gib:.1f}: "
                f"{self.need.what})")


@dataclass
class GpuPlan:
    """Everything one GPU (or each of ``count`` alike) holds."""

    label: str
    capacity_gib: float
    processes: list[tuple[RolePlan, int]]
    """(process, how many of it on this GPU)."""
    engines: list[EnginePlan] = field(default_factory=list)
    """Engines (or shards) on this GPU, one per process that starts one (a worker's engine counted per worker)."""
    engine_copies: list[int] = field(default_factory=list)
    count: int = 1

    @property
    def needs_gib(self) -> float:
        return (sum(n * role.needs_gib for role, n in self.processes)
                + sum(n * engine.gib for engine, n in zip(self.engines, self.engine_copies)))

    @property
    def fits(self) -> bool:
        return self.needs_gib <= self.capacity_gib

    def parts(self) -> list[tuple[str, float]]:
        """(what, GiB) of each process and engine on it."""
        out = [(f"{n} x {role.name}" if n > 1 else role.name, n * role.needs_gib) for role, n in self.processes]
        return out + [(f"{n} x {engine.name}" if n > 1 else engine.name, n * engine.gib)
                      for engine, n in zip(self.engines, self.engine_copies)]

    def to_dict(self) -> dict:
        return {"gpu": self.label, "count": self.count, "capacity_gib": self.capacity_gib,
                "needs_gib": round(self.needs_gib, 2), "fits": self.fits,
                "parts_gib": {what: round(gib, 2) for what, gib in self.parts()}}


@dataclass
class MemoryPlan:
    stage: str
    roles: list[RolePlan]
    engines: list[EnginePlan]
    gpus: list[GpuPlan]

    @property
    def fits(self) -> bool:
        return all(gpu.fits for gpu in self.gpus)

    def role(self, name: str) -> RolePlan | None:
        return next((r for r in self.roles if r.name == name), None)

    def to_dict(self) -> dict:
        return {"stage": self.stage, "fits": self.fits, "gpus": [g.to_dict() for g in self.gpus],
                "roles": [r.to_dict() for r in self.roles],
                "engines": [{"engine": e.name, "role": e.role, "model": e.model_path, "gib_per_gpu": round(e.gib, 2),
                             "need_gib": round(e.need.gib, 2), "tensor_parallel": e.tensor_parallel}
                            for e in self.engines]}


def policy_terms(shape: ModelShape, p, e: int, role: str) -> tuple[list[Term], list[Term]]:
    """A policy trainer's (``soar.policy.trainer.RLOOTrainer``) optimiser-side terms: (held while it
    trains: master copies and AdamW moments; transient in its update: gradients)."""
    if p.lora.r > 0:
        trainable = shape.adapter_params(p.lora.r, p.lora.target_modules)
        t = 4 if p.lora.autocast_adapter_dtype else e
    else:
        trainable, t = shape.params, e
    fields = (f"{role}.precision", f"{role}.lora.r")
    if p.precision == "mixed" and t < 4:
        held = [Term(f"{role} fp32 master weights", 4 * trainable, fields),
                Term(f"{role} AdamW moments (fp32)", 8 * trainable, fields)]
        grads = [Term(f"{role} fp32 gradients", 4 * trainable + t * min(shape.largest_param, trainable), fields)]
    else:
        held = [Term(f"{role} AdamW moments", 2 * t * trainable, fields)]
        grads = [Term(f"{role} gradients", t * trainable, fields)]
    return held, grads


def adapter_bytes(shape: ModelShape, p, e: int) -> int:
    """A LoRA policy's adapter weights (fp32 with ``lora.autocast_adapter_dtype``); 0 for full FT."""
    if p.lora.r == 0:
        return 0
    return shape.adapter_params(p.lora.r, p.lora.target_modules) * (4 if p.lora.autocast_adapter_dtype else e)


def update_terms(shape: ModelShape, p, e: int, role: str, seq: int) -> list[Term]:
    """A policy update's activations and log-prob chunk at its micro-batch."""
    fp32_inputs = shape.adapted_inputs(p.lora.target_modules) if p.lora.r > 0 and p.lora.autocast_adapter_dtype \
        and e < 4 else 0
    return [Term(f"{role} activations ({p.micro_batch_size} x {seq} tokens)",
                 activation_bytes(shape, e, p.micro_batch_size, seq, p.gradient_checkpointing, fp32_inputs),
                 (f"{role}.micro_batch_size", f"{role}.gradient_checkpointing", f"{role}.max_tokens")),
            Term(f"{role} log-prob logits chunk", logits_chunk_bytes(shape, e, p.micro_batch_size, seq)),
            Term(f"{role} attention scores if SDPA falls back to its math kernel (one layer)",
                 sdpa_math_bytes(shape, p.micro_batch_size, seq), (f"{role}.micro_batch_size",))]


def _uses_vllm(cfg, roles) -> bool:
    return any(resolve_backend(cfg.backend, role) == "vllm" for role in roles)


def _kv_term(shape: ModelShape, e: int, batch: int, seq: int) -> Term:
    return Term(f"KV cache ({batch} x {seq} tokens)", generation_bytes(shape, e, batch, seq), ("backend.batch_size",))


def engine_plan(cfg, name: str, role: str, model_path: str, shape: ModelShape, e: int, seq: int,
                tensor_parallel: int = 1) -> EnginePlan:
    """An engine of ``model_path`` started by ``role``, holding ``backend.batch_size`` sequences of ``seq``
    tokens (no fewer than HF would batch)."""
    tp = max(1, tensor_parallel)
    kv = cfg.backend.batch_size * seq * shape.kv_bytes_per_token(e)
    need = Term(f"weights {shape.params * e / tp / GIB:.1f} + overhead {VLLM_OVERHEAD_GIB:.0f} + KV cache of "
                f"{cfg.backend.batch_size} x {seq} tokens {kv / tp / GIB:.1f}",
                int((shape.params * e + kv) / tp + VLLM_OVERHEAD_GIB * GIB),
                ("backend.vllm.gpu_memory_utilization", "backend.batch_size"))
    return EnginePlan(name, model_path, role, need, cfg.backend.vllm.gpu_memory_utilization, tp)


def trainer_terms(shape: ModelShape, e: int, p, role: str, seq: int, reference: bool) -> tuple[list[Term], list[Term]]:
    """One ``RLOOTrainer``'s (held, update phase): its policy, a reference copy when ``reference`` (full FT
    only), the optimiser's held terms, then gradients, activations, logits chunk and attention reserve."""
    weights = shape.params * e
    held = [Term(f"{role} policy", weights + adapter_bytes(shape, p, e), (f"{role}.lora.r",))]
    if reference and p.lora.r == 0:
        held.append(Term(f"{role} reference copy", weights, (f"{role}.kl_coef", f"{role}.lora.r")))
    opt_held, grads = policy_terms(shape, p, e, role)
    return held + opt_held, grads + update_terms(shape, p, e, role, seq)


def _train_plan(cfg, shape: ModelShape, e: int, prompt_tokens: int) -> tuple[list[RolePlan], list, list]:
    """``soar-train``: the driver and, with GPU workers, a student worker; their engines."""
    weights = shape.params * e
    s, t, res = cfg.student, cfg.teacher, cfg.resources
    student_seq, teacher_seq = prompt_tokens + s.max_tokens, teacher_prompt_tokens(t.prompt) + t.max_tokens
    eval_seq = prompt_tokens + (s.eval_max_tokens or s.max_tokens)
    grounded = t.reward == "grounded"

    held = [Term("baseline student (also the students' KL reference)", weights, ()),
            Term("teacher policy", weights + adapter_bytes(shape, t, e), ("teacher.lora.r",))]
    if t.lora.r == 0 and t.kl_coef > 0:
        held.append(Term("teacher reference copy", weights, ("teacher.kl_coef", "teacher.lora.r")))
    teacher_held, teacher_grads = policy_terms(shape, t, e, "teacher")
    phases: dict[str, list[Term]] = {}
    if t.frozen:  # the masters are built with the trainer; AdamW's moments only at a first step
        held += [x for x in teacher_held if "master" in x.what]
    else:
        held += teacher_held
        phases["teacher update"] = teacher_grads + update_terms(shape, t, e, "teacher", teacher_seq)
    if not _uses_vllm(cfg, ["teacher"]):
        phases["teacher sampling (hf)"] = [_kv_term(shape, e, cfg.backend.batch_size, teacher_seq)]
    if not _uses_vllm(cfg, ["eval"]):
        phases["evaluation (hf)"] = [_kv_term(shape, e, cfg.backend.batch_size, eval_seq)]
    in_process = grounded and res.num_workers == 0
    if in_process:
        phases.update(_student_phases(cfg, shape, e, weights, student_seq, kept=cfg.inner.replicates + 1,
                                      lockstep=res.lockstep, where="in-process "))
    driver = RolePlan("driver", held, phases)
    roles, engines, worker_engines = [driver], [], []
    if _uses_vllm(cfg, ["teacher", "eval"] + (["student"] if in_process else [])):
        engines.append(engine_plan(cfg, "driver's vLLM engine", "driver", cfg.model.path, shape, e,
                                   max(student_seq, teacher_seq), cfg.backend.vllm.tensor_parallel_size))
    if grounded and res.num_workers > 0 and res.gpus_per_student > 0:
        tasks = t.groups_per_step * t.datasets * cfg.inner.replicates  # the step's students
        per_worker = math.ceil(tasks / res.num_workers)
        phases = _student_phases(cfg, shape, e, weights, student_seq, kept=per_worker - 1, lockstep=False, where="")
        roles.append(RolePlan("student worker", [Term("baseline student (also the KL reference)", weights, ())],
                              phases))
        if _uses_vllm(cfg, ["student", "eval"]):
            worker_engines.append(engine_plan(cfg, "worker's vLLM engine", "student worker", cfg.model.path, shape, e,
                                              student_seq, cfg.backend.vllm.tensor_parallel_size))
    return roles, engines, worker_engines


def _student_phases(cfg, shape: ModelShape, e: int, weights: int, seq: int, kept: int, lockstep: bool,
                    where: str) -> dict[str, list[Term]]:
    """The phases of training students one at a time (or, ``lockstep``, all of a step's LoRA students
    together) next to ``kept`` trained students that await the promotion decision."""
    s = cfg.student
    lora = s.lora.r > 0
    policy = adapter_bytes(shape, s, e) if lora else weights  # LoRA students share the baseline (sharing_copy)
    student_held, grads = policy_terms(shape, s, e, "student")
    n_live = cfg.teacher.groups_per_step * cfg.teacher.datasets * cfg.inner.replicates if lockstep else 1
    live = [Term(f"{where}student{'s' if n_live > 1 else ''} in training ({n_live}, policy{'' if lora else ' copy'})",
                 n_live * policy, ("student.lora.r", "resources.num_workers"))]
    live += [Term(f"{x.what} x {n_live}" if n_live > 1 else x.what, n_live * x.bytes, x.fields) for x in student_held]
    if kept > 0 and not lockstep:
        live.append(Term(f"{kept} trained students kept for the promotion decision", kept * policy,
                         ("resources.num_workers", "student.lora.r", "inner.replicates")))
    rollouts = min(cfg.backend.batch_size, s.questions_per_step * s.group_size)
    return {f"{where}student rollouts (hf)" if not _uses_vllm(cfg, ["student"]) else f"{where}student rollouts":
            live + ([] if _uses_vllm(cfg, ["student"]) else [_kv_term(shape, e, rollouts, seq)]),
            f"{where}student update": live + grads + update_terms(shape, s, e, "student", seq)}


def _rl_plan(cfg, shape: ModelShape, e: int, prompt_tokens: int) -> tuple[list[RolePlan], list, list]:
    """``soar-rl``: the policy trainer (its rollouts and evaluation on hf: ``soar.rl``), and the coach of
    distillation: loaded in the same process (``backend.coach=hf``) or a vLLM engine of its own."""
    s, d = cfg.student, cfg.distill
    seq = prompt_tokens + s.max_tokens
    distilling = d.coach is not None
    frozen_teacher = distilling and d.teacher == "frozen"
    held, update = trainer_terms(shape, e, s, "student", seq, s.kl_coef > 0 or frozen_teacher)
    rollouts = min(cfg.backend.batch_size, s.questions_per_step * s.group_size)
    phases = {"rollouts (hf)": [_kv_term(shape, e, rollouts, seq)], "update": update,
              "evaluation (hf)": [_kv_term(shape, e, cfg.backend.batch_size, prompt_tokens + (s.eval_max_tokens
                                                                                               or s.max_tokens))]}
    engines = []
    if d.coach == "llm":
        coach_cfg = d.coach_model if d.coach_model.path else cfg.model
        coach_shape = shape if not d.coach_model.path else model_shape(coach_cfg.path, coach_cfg.trust_remote_code)
        ce = DTYPE_BYTES[coach_cfg.dtype]
        coach_seq = seq + d.coach_max_tokens  # the question, the rollout, the reference, then the advice
        if _uses_vllm(cfg, ["coach"]):
            engines.append(engine_plan(cfg, "coach's vLLM engine", "soar-rl", coach_cfg.path, coach_shape, ce, coach_seq,
                                       cfg.backend.vllm.tensor_parallel_size))
        else:
            held.append(Term(f"coach model (hf, {coach_cfg.path})", coach_shape.params * ce, ("backend.coach",)))
            phases["coach advice (hf)"] = [_kv_term(coach_shape, ce, cfg.backend.batch_size, coach_seq)]
    return [RolePlan("soar-rl", held, phases)], engines, []


def _eval_plan(cfg, shape: ModelShape, e: int, prompt_tokens: int) -> tuple[list[RolePlan], list, list]:
    """``soar-eval``: a fresh student trained from the base (``soar.evaluate.train_fresh_student``: the base,
    the policy and, full FT with a KL term, a reference copy), or one model evaluated."""
    s = cfg.student
    seq = prompt_tokens + s.max_tokens
    eval_seq = prompt_tokens + (s.eval_max_tokens or s.max_tokens)
    weights = shape.params * e
    engines = []
    if cfg.eval.method in INFERENCE_METHODS:
        held, phases = [Term("evaluated model", weights, ())], {}
    else:
        trainer_held, update = trainer_terms(shape, e, s, "student", seq, s.kl_coef > 0)
        held = [Term("base model", weights, ())] + trainer_held
        phases = {"update": update}
        if not _uses_vllm(cfg, ["student"]):
            phases["rollouts (hf)"] = [_kv_term(shape, e, min(cfg.backend.batch_size,
                                                               s.questions_per_step * s.group_size), seq)]
    if _uses_vllm(cfg, ["eval"]) or (cfg.eval.method not in INFERENCE_METHODS and _uses_vllm(cfg, ["student"])):
        engines.append(engine_plan(cfg, "vLLM engine", "soar-eval", cfg.model.path, shape, e, max(seq, eval_seq),
                                   cfg.backend.vllm.tensor_parallel_size))
    if not _uses_vllm(cfg, ["eval"]):
        phases["evaluation (hf)"] = [_kv_term(shape, e, cfg.backend.batch_size, eval_seq)]
    return [RolePlan("soar-eval", held, phases)], engines, []


def _filter_plan(cfg, shape: ModelShape, e: int, prompt_tokens: int) -> tuple[list[RolePlan], list, list]:
    """``soar-filter``: the model (loaded with HF by the stage) and its fail@k generation, on hf or vLLM."""
    seq = prompt_tokens + cfg.filter.max_tokens
    held = [Term("filtered model (hf)", shape.params * e, ())]
    if _uses_vllm(cfg, ["filter"]):
        engine = engine_plan(cfg, "vLLM engine", "soar-filter", cfg.model.path, shape, e, seq,
                             cfg.backend.vllm.tensor_parallel_size)
        return [RolePlan("soar-filter", held, {})], [engine], []
    phases = {"fail@k generation (hf)": [_kv_term(shape, e, cfg.backend.batch_size, seq)]}
    return [RolePlan("soar-filter", held, phases)], [], []


_STAGE_PLANS = {"train": _train_plan, "rl": _rl_plan, "eval": _eval_plan, "filter": _filter_plan}


def plan(cfg, shape: ModelShape | None = None, prompt_tokens: int = PROMPT_TOKENS,
         capacity_gib: float | None = None, stage: str = "train") -> MemoryPlan:
    """``stage``'s plan: its processes and engines, placed on GPUs (``place``)."""
    if stage not in _STAGE_PLANS:
        raise ConfigError(f"config error: the memory plan has no stage {stage!r}: one of {', '.join(STAGES)}")
    shape = shape or model_shape(cfg.model.path, cfg.model.trust_remote_code)
    capacity_gib = capacity_gib or gpu_capacity_gib(cfg)
    roles, engines, worker_engines = _STAGE_PLANS[stage](cfg, shape, DTYPE_BYTES[cfg.model.dtype], prompt_tokens)
    return MemoryPlan(stage, roles, engines + worker_engines, place(cfg, roles, engines, worker_engines, capacity_gib))


def place(cfg, roles: list[RolePlan], engines: list[EnginePlan], worker_engines: list[EnginePlan],
          capacity_gib: float) -> list[GpuPlan]:
    """The GPUs: GPU 0 with the main process (``roles[0]``), its engines' first shards and, when the
    driver's GPU is in Ray's pool, as many student workers as Ray may put on a GPU; the pool's other GPUs
    with that many workers (and an engine each); the other shards of tensor-parallel engines."""
    res = cfg.resources
    main, workers = roles[0], roles[1] if len(roles) > 1 else None
    gpu0 = GpuPlan("GPU 0 (the driver's)" if main.name == "driver" else f"GPU 0 ({main.name})", capacity_gib,
                   [(main, 1)], list(engines), [1] * len(engines))
    gpus = [gpu0]
    if workers is not None:
        share = res.gpus_per_student
        per_gpu = min(res.num_workers, max(1, math.floor(1 / share + 1e-9)) if share < 1 else 1)
        worker_gpus = math.ceil(res.num_workers / per_gpu)
        if not res.driver_gpu_apart:
            gpu0.processes.append((workers, per_gpu))
            gpu0.engines += worker_engines
            gpu0.engine_copies += [per_gpu] * len(worker_engines)
            worker_gpus -= 1
        if worker_gpus > 0:
            gpus.append(GpuPlan("each student worker GPU", capacity_gib, [(workers, per_gpu)], list(worker_engines),
                                [per_gpu] * len(worker_engines), count=worker_gpus))
    shards = [engine for engine in engines if engine.tensor_parallel > 1]
    if shards:
        tp = max(engine.tensor_parallel for engine in shards)
        if len(gpus) > 1:  # a sharded driver engine also lands on the workers' GPUs
            gpus[1].engines += shards
            gpus[1].engine_copies += [1] * len(shards)
        else:
            label = "GPU 1" if tp == 2 else f"GPUs 1-{tp - 1}"
            gpus.append(GpuPlan(f"{label} (engine shards)", capacity_gib, [], list(shards), [1] * len(shards),
                                count=tp - 1))
    _size_engines(gpus, capacity_gib)
    return gpus


def _size_engines(gpus: list[GpuPlan], capacity_gib: float) -> None:
    """Each engine's budget per GPU: ``gpu_memory_utilization`` x the GPU, or (null) an equal share of what
    the processes there leave, less ``VLLM_MARGIN_GIB``; a tensor-parallel engine gets the smallest of its
    GPUs' shares (vLLM takes one value for all of them)."""
    capacity = capacity_gib * GIB
    budgets: dict[int, list[int]] = {}
    for gpu in gpus:
        sized = sum(n for engine, n in zip(gpu.engines, gpu.engine_copies) if engine.utilization is None)
        fixed = sum(n * int(engine.utilization * capacity) for engine, n in zip(gpu.engines, gpu.engine_copies)
                    if engine.utilization is not None)
        left = capacity - sum(n * role.needs_gib * GIB for role, n in gpu.processes) - fixed - VLLM_MARGIN_GIB * GIB
        for engine in gpu.engines:
            share = int(engine.utilization * capacity) if engine.utilization is not None else int(max(left, 0) / sized)
            budgets.setdefault(id(engine), []).append(share)
    for gpu in gpus:
        for engine in gpu.engines:
            engine.budget_bytes = min(budgets[id(engine)])


def vllm_memory_fraction(total_bytes: int, free_bytes: int, held_bytes: int, training_bytes: int,
                         margin_bytes: int = int(VLLM_MARGIN_GIB * GIB)) -> float:
    """``backend.vllm.gpu_memory_utilization`` when it is null: the share of the GPU's ``total_bytes``
    an engine may take when it starts, given the GPU's ``free_bytes`` now, the ``held_bytes`` this
    process's tensors hold now and the ``training_bytes`` its training needs at its peak (the memory
    plan's role peak without the engine): what is free, less what training has yet to allocate and a
    margin. vLLM requires its share of the total to be free at start; this leaves training its part.
    ``soar.vllm_backend`` caps it at the plan's budget (``planned_engine_bytes``): processes sharing the
    GPU may not have allocated their part yet."""
    to_come = max(training_bytes - held_bytes, 0)
    return max(free_bytes - to_come - margin_bytes, 0) / total_bytes


def check_plan(cfg, shape: ModelShape | None = None, prompt_tokens: int = PROMPT_TOKENS,
               capacity_gib: float | None = None, stage: str = "train", memory: MemoryPlan | None = None
               ) -> MemoryPlan:
    """The plan (or the given ``memory``), or a ``ConfigError`` naming each GPU that does not fit: what
    shares it, by how much it is over, its largest terms and the fields to change."""
    memory = memory or plan(cfg, shape, prompt_tokens, capacity_gib, stage)
    over = [gpu for gpu in memory.gpus if not gpu.fits]
    if over:
        lines = []
        for gpu in over:
            parts = " + ".join(f"{what} {gib:.1f}" for what, gib in gpu.parts())
            terms = sorted([t for role, _ in gpu.processes for t in role.terms()]
                           + [e.need for e in gpu.engines if not e.fits_budget], key=lambda t: -t.bytes)
            top = [t for t in terms if t.bytes > 0][:5]
            fields = list(dict.fromkeys(f for t in top for f in t.fields))
            lines.append(f"{gpu.label}: {parts} = {gpu.needs_gib:.1f} GiB of {gpu.capacity_gib:.0f}, over by "
                         f"{gpu.needs_gib - gpu.capacity_gib:.1f} GiB; largest terms: "
                         + ", ".join(f"{t.what} {t.gib:.1f}" for t in top) + f"; change {', '.join(fields)}")
        raise ConfigError(f"config error: the {memory.stage} stage's memory plan does not fit (soar-estimate --plan "
                          "shows every term; resources.gpu_memory_gb sets the GPU size): " + "; ".join(lines))
    return memory


def plan_report(memory: MemoryPlan) -> str:
    """The plan as text: each GPU's sum, then each process's terms and each engine, in GiB."""
    out = ["| GPU | processes and engines (GiB, with slack and context) | needs | of | verdict |",
           "|---|---|---|---|---|"]
    for gpu in memory.gpus:
        label = gpu.label + (f" (x{gpu.count})" if gpu.count > 1 else "")
        parts = " + ".join(f"{what} {gib:.1f}" for what, gib in gpu.parts())
        out.append(f"| {label} | {parts} | {gpu.needs_gib:.1f} | {gpu.capacity_gib:.0f} | "
                   f"{'fits' if gpu.fits else f'over by {gpu.needs_gib - gpu.capacity_gib:.1f}'} |")
    for role in memory.roles:
        out.append(f"{role.name}: peak {role.peak_gib:.1f} GiB ({role.peak_phase or 'held'}), needs {role.needs_gib:.1f} "
                   f"with slack {FRAGMENTATION:.0%} and context {CUDA_CONTEXT_GIB:.0f}")
        out += [f"  held   {t.gib:7.2f}  {t.what}" for t in role.held]
        for phase, terms in role.phases.items():
            out.append(f"  {phase}: {sum(t.bytes for t in terms) / GIB:.2f}")
            out += [f"         {t.gib:7.2f}  {t.what}" for t in terms]
    out += [f"engine {e.gib:7.2f}  {e.describe()}" for e in memory.engines]
    return "\n".join(out)


def worker_ram_gb(model_path: str | None) -> float:
    """Host RAM (GiB) one worker of a local CPU student pool holds: ``WORKER_RAM_GB`` and 5 copies of the
    model's weight files (baseline, student, reference, Adam moments); a hub id's weights count 0.
    ``soar.validation`` checks the pool against the RAM available (``soar.machine.available_ram_gb``)."""
    weights_gb = 0.0
    if model_path and Path(model_path).expanduser().is_dir():
        weights_gb = sum(f.stat().st_size for f in Path(model_path).expanduser().iterdir()
                         if f.suffix in (".safetensors", ".bin")) / 2**30
    return WORKER_RAM_GB + 5 * weights_gb


_STAGE = {"name": "train"}
"""The stage this process set up (``soar.stage.setup_stage``: ``set_stage``): whose plan its engines follow."""


def set_stage(stage: str) -> None:
    if stage in STAGES:
        _STAGE["name"] = stage


def _process_role(cfg) -> tuple[MemoryPlan, RolePlan | None]:
    memory = plan(cfg, stage=_STAGE["name"])
    return memory, memory.role("student worker") if in_ray_actor() else memory.roles[0]


def process_training_bytes(cfg) -> int:
    """This process's planned torch peak on its GPU (bytes, with the allocator's slack): a student
    worker's in a Ray actor, else the stage's main process. What a vLLM engine started here must leave
    free (``soar.vllm_backend.gpu_memory_utilization``)."""
    _, role = _process_role(cfg)
    return 0 if role is None else int(role.peak_gib * (1 + FRAGMENTATION) * GIB)


def planned_engine_bytes(cfg, model_path: str) -> int | None:
    """The plan's budget per GPU for the engine of ``model_path`` that this process starts; None when the
    plan has none (the engine then follows ``vllm_memory_fraction`` alone)."""
    memory, role = _process_role(cfg)
    if role is None:
        return None
    match = [e for e in memory.engines if e.role == role.name and str(e.model_path) == str(model_path)]
    return match[0].budget_bytes if match else None
