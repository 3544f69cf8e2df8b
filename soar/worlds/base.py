"""The ``World`` interface: everything a task domain gives the SOAR loop, and the registry behind
``world=<name>`` (the pattern of tinker-cookbook's ``Env`` and nanochat's ``Task``).

A world is one module in ``soar/worlds/`` that subclasses ``World`` and calls ``register_world``::

    @register_world
    class MyWorld(World):
        name = "mine"                   # world=mine, conf/world/mine.yaml (defaults: [mine_schema, _self_])
        config_class = MyWorldConfig    # its settings (cfg.world); the dataclass defaults are the only ones
        grader = "integer"
        def build_model(self, cfg): ...             # model.build: world
        def family(self, cfg, family, count, prefix): ...   # problem pools and families
        ...

``soar.config.discover_worlds`` imports every module of ``soar/worlds/``, so a second world is one
new file. The config hooks ``model.build``, ``data.build`` and ``loop.answer_oracle`` take ``world``
(the configured world's method) or, as before, a dotted ``module:function`` (``resolve_hook``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, ClassVar

from soar.config import ConfigError, discover_worlds, load_callable, register_world_config
from soar.data import Problem, write_jsonl

WORLD_HOOK = "world"
"""The value of a config hook (``model.build``, ``data.build``, ``loop.answer_oracle``) that hands
it to the configured world (``cfg.world.name``)."""


class World:
    """A task domain: its model, problem pools and families, prompt templates, grader, answer oracle
    and frontier report. Methods take the run's composed config ``cfg``; ``self.config(cfg)`` is the
    world's own typed settings (``cfg.world``)."""

    name: ClassVar[str]
    """``world=<name>``; also the ``name`` field of its config."""
    config_class: ClassVar[type]
    """The dataclass of ``cfg.world`` (its defaults are the world's only defaults)."""
    grader: ClassVar[str] = "math_verify"
    """Grader of its answers (``data.grader``)."""
    families: ClassVar[tuple[str, ...]] = ("pool",)
    """Problem families ``family`` knows; ``pool`` is the hard-set candidates (before fail@k)."""

    def config(self, cfg) -> Any:
        """``cfg.world`` as ``config_class``, its dataclass defaults under the given values."""
        from omegaconf import OmegaConf

        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(self.config_class), cfg.world or {}))

    # ---- model ---------------------------------------------------------------------------------
    def build_model(self, cfg) -> Path:
        """The base model folder (HF format) for ``model.build: world``: built, cached or shipped."""
        raise NotImplementedError

    # ---- problems ------------------------------------------------------------------------------
    def family(self, cfg, family: str, count: int, prefix: str) -> list[Problem]:
        """``count`` problems of ``family`` (one of ``families``), ids ``<prefix>/...``; the same
        arguments give the same problems."""
        raise NotImplementedError

    def family_sizes(self, cfg) -> dict[str, int]:
        """How many problems of each family ``write_families`` writes."""
        raise NotImplementedError

    def write_families(self, cfg, out_dir: Path) -> dict[str, Path]:
        """Write every family as ``<out_dir>/<family>.jsonl`` (ids never collide: one prefix each)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {}
        for name, count in self.family_sizes(cfg).items():
            paths[name] = out_dir / f"{name}.jsonl"
            write_jsonl(paths[name], [p.to_dict() for p in self.family(cfg, name, count, name)])
        return paths

    def build_pool(self, cfg, out_dir: Path) -> Path:
        """``data.build: world``: write the hard-set candidates (and the other families); their path."""
        return self.write_families(cfg, out_dir)["pool"]

    # ---- prompts -------------------------------------------------------------------------------
    def student_template(self, cfg) -> str:
        """The student prompt, with a ``{question}`` slot (``data.prompt_template``)."""
        raise NotImplementedError

    def teacher_prompt(self, cfg) -> str:
        """The teacher prompt (``teacher.prompt``)."""
        raise NotImplementedError

    # ---- measurement only ----------------------------------------------------------------------
    def answer_oracle(self, cfg, question: str) -> str | None:
        """The exact answer to ``question``, None if it is not one of the world's. Measurement only
        (``teacher/answer_correct_frac``): never a reward."""
        return None

    def frontier_report(self, cfg, model_path: str | Path) -> dict:
        """What is known of ``model_path``'s frontier in this world (e.g. accuracy by difficulty)."""
        return {}

    # ---- soar-world ----------------------------------------------------------------------------
    def run(self, cfg, command: str) -> None:
        """``soar-world <command>`` (``pretrain``, ``problems``)."""
        raise NotImplementedError


WORLDS: dict[str, World] = {}
"""Registered worlds by name."""


def register_world(world_class: type[World]) -> type[World]:
    """Class decorator: register a world under its ``name`` (and its config class with Hydra)."""
    WORLDS[world_class.name] = world_class()
    register_world_config(world_class.name, world_class.config_class)
    return world_class


def get_world(name: str) -> World:
    """The world registered as ``name`` (world modules are discovered on first use)."""
    if name not in WORLDS:
        discover_worlds()
    if name not in WORLDS:
        raise ConfigError(f"config error: world: unknown world {name!r}; known: {', '.join(sorted(WORLDS))}")
    return WORLDS[name]


def configured_world(cfg) -> World:
    """The world ``cfg.world`` configures (``world=<name>``)."""
    if cfg.world is None or not cfg.world.get("name"):
        raise ConfigError("config error: world: a hook is set to 'world' but no world is configured (world=<name>)")
    return get_world(cfg.world.name)


_HOOKS = {"model.build": "build_model", "data.build": "build_pool", "loop.answer_oracle": "answer_oracle"}


def resolve_hook(cfg, field_name: str) -> Callable:
    """The callable behind a config hook (``model.build``, ``data.build``, ``loop.answer_oracle``):
    ``world`` gives the configured world's method (``build_model(cfg)``, ``build_pool(cfg, out_dir)``,
    ``answer_oracle(question)``); a dotted ``module:function`` is loaded as is, with the hook's
    plain signature (``(cfg)``, ``(cfg, out_dir)``, ``(question)``)."""
    section, key = field_name.split(".")
    value = getattr(getattr(cfg, section), key)
    if value != WORLD_HOOK:
        return load_callable(value, field_name)
    method = getattr(configured_world(cfg), _HOOKS[field_name])
    return functools.partial(method, cfg) if field_name == "loop.answer_oracle" else method


def hook_world(cfg, field_name: str) -> World | None:
    """The world behind a hook: ``world``, or a dotted path into a world module (older run configs,
    e.g. ``soar.worlds.arith:build_pool``); None when the hook is unset or names other code."""
    section, key = field_name.split(".")
    value = str(getattr(getattr(cfg, section), key) or "")
    if value == WORLD_HOOK:
        return configured_world(cfg)
    module = value.partition(":")[0] if ":" in value else value.rpartition(".")[0]
    if module.startswith("soar.worlds.") and cfg.world is not None:
        return get_world(module.rsplit(".", 1)[1])
    return None
