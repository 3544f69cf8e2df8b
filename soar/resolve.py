"""What a config value names, resolved: the backend of a role (``resolve_backend``) and the function a
dotted path names (``load_callable``). The schema (``soar.config``) holds the values; this turns them into
what runs.
"""

from __future__ import annotations

import importlib
import importlib.util

from soar.config import ConfigError


def resolve_backend(backend_cfg, role: str) -> str:
    """The backend of ``role`` (``filter``, ``teacher``, ``student``, ``eval``): its own setting or
    ``backend.name``; ``auto`` is ``vllm`` when vLLM is importable, else ``hf``."""
    name = getattr(backend_cfg, role, None) or backend_cfg.name
    if name == "auto":
        name = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if name not in ("hf", "vllm"):
        raise ValueError(f"backend.{role}: unknown backend {name!r} (hf | vllm | auto)")
    return name


def load_callable(dotted: str, field_name: str):
    """``pkg.module:function`` (or ``pkg.module.function``) -> the function; errors name the field."""
    mod_name, _, attr = dotted.partition(":") if ":" in dotted else dotted.rpartition(".")
    try:
        fn = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"config error: {field_name}: cannot load {dotted!r} ({e})") from e
    if not callable(fn):
        raise ConfigError(f"config error: {field_name}: {dotted!r} is not callable")
    return fn
