"""The ``World`` interface: what a task domain gives the SOAR stages, and the registry behind
``world=<name>`` (the pattern of tinker-cookbook's ``Env`` and nanochat's ``Task``).

A world is one module in ``soar/worlds/`` that subclasses ``World`` and registers it::

    @register_world
    class MyWorld(World):
        name = "mine"                   # world=mine, conf/world/mine.yaml (defaults: [mine_schema, _self_])
        config_class = MyWorldConfig    # its settings (cfg.world); the dataclass defaults are the only ones
        def build_model(self, cfg): ...             # model.build: world
        def build_pool(self, cfg, out_dir): ...     # data.build: world
        ...

Importing ``soar.worlds`` imports every module of that folder, so a second world is one new file. Its
prompts and grader are settings like any other: ``conf/world/<name>.yaml`` and its ``data`` config
(``conf/data/arith.yaml`` reads the student template from ``${world.student_template}``).

Three config fields hand work to the configured world when set to ``world``, or to a ``module:function``
of the user's: ``model.build`` (``build_model_hook``), ``data.build`` (``build_pool_hook``) and
``loop.answer_oracle`` (``answer_oracle_hook``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ClassVar

from omegaconf import OmegaConf

from soar.config import ConfigError
from soar.data import Problem
from soar.resolve import load_callable

WORLD_HOOK = "world"
"""The value of a config hook (``model.build``, ``data.build``, ``loop.answer_oracle``) that hands
it to the configured world (``cfg.world.name``)."""


class World:
    """A task domain: its model, its hard-set candidates, the real questions an oracle trains on, the
    exact answers to its questions and its ``soar-world`` commands. Methods take the run's composed config
    ``cfg``; ``self.config(cfg)`` is the world's own typed settings (``cfg.world``)."""

    name: ClassVar[str]
    """``world=<name>``; also the ``name`` field of its config."""
    config_class: ClassVar[type]
    """The dataclass of ``cfg.world`` (its defaults are the world's only defaults)."""

    def config(self, cfg) -> Any:
        """``cfg.world`` as ``config_class``, its dataclass defaults under the given values."""
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(self.config_class), cfg.world or {}))

    def build_model(self, cfg) -> Path:
        """``model.build: world`` (``soar.stage``): the base model folder (HF format), built, cached or shipped."""
        raise NotImplementedError

    def build_pool(self, cfg, out_dir: Path) -> Path:
        """``data.build: world`` (``soar-train``'s hard set, ``soar.prepare``): write the hard-set candidates
        (before fail@k) under ``out_dir``; their path."""
        raise NotImplementedError

    def oracle_problems(self, cfg, count: int) -> list[Problem]:
        """``soar-eval eval.method=oracle`` without ``eval.oracle_path``: ``count`` real questions that
        should teach the hard set (the paper: 128 MATH training questions); the same arguments give the
        same problems."""
        raise NotImplementedError

    def answer_oracle(self, cfg, question: str) -> str | None:
        """``loop.answer_oracle: world``: the exact answer to ``question``, None if it is not one of the
        world's. Measurement only (``teacher/answer_correct_frac``): never a reward."""
        return None

    def coach_advice(self, cfg, question: str, attempt: str, noise: float, rng) -> str | None:
        """``distill.coach: world``: a programmatic coach's advice for ``question``, computed from the
        question and (if the world's recipe reads it) the student's ``attempt``, never the reference answer;
        ``noise`` in [0, 1] (``distill.coach_noise``) makes it that wrong, drawing from ``rng`` (a numpy
        Generator). A stand-in for an LLM coach (``soar.coach``); None if it has none."""
        raise ConfigError(f"config error: distill.coach: world {self.name!r} has no programmatic coach "
                          "(World.coach_advice); use distill.coach=llm")

    def run(self, cfg, command: str) -> None:
        """``soar-world <command>`` (``pretrain``, ``problems``)."""
        raise NotImplementedError


WORLDS: dict[str, World] = {}
"""Registered worlds by name (every module of ``soar/worlds/`` is imported with the package)."""


def register_world(world_class: type[World]) -> type[World]:
    """Class decorator: register a world under its ``name`` (``soar.hydra_config`` registers its
    config class with Hydra)."""
    WORLDS[world_class.name] = world_class()
    return world_class


def get_world(name: str) -> World:
    """The world registered as ``name``."""
    if name not in WORLDS:
        raise ConfigError(f"config error: world: unknown world {name!r}; known: {', '.join(sorted(WORLDS))}")
    return WORLDS[name]


def configured_world(cfg) -> World:
    """The world ``cfg.world`` configures (``world=<name>``)."""
    if cfg.world is None or not cfg.world.get("name"):
        raise ConfigError("config error: world: no world is configured (world=<name>), but a hook or command needs one")
    return get_world(cfg.world.name)


def build_model_hook(cfg) -> Path:
    """``model.build``: the configured world's ``build_model(cfg)`` (``world``), or a ``module:function(cfg)``'s."""
    if cfg.model.build == WORLD_HOOK:
        return configured_world(cfg).build_model(cfg)
    return load_callable(cfg.model.build, "model.build")(cfg)


def build_pool_hook(cfg, out_dir: Path) -> Path:
    """``data.build``: the configured world's ``build_pool(cfg, out_dir)`` (``world``), or a
    ``module:function(cfg, out_dir)``'s."""
    if cfg.data.build == WORLD_HOOK:
        return configured_world(cfg).build_pool(cfg, out_dir)
    return load_callable(cfg.data.build, "data.build")(cfg, out_dir)


def answer_oracle_hook(cfg) -> Callable[[str], str | None] | None:
    """``loop.answer_oracle``: question -> its exact answer (or None), from the configured world
    (``world``) or a ``module:function(question)``; None when unset."""
    if not cfg.loop.answer_oracle:
        return None
    if cfg.loop.answer_oracle == WORLD_HOOK:
        world = configured_world(cfg)
        return lambda question: world.answer_oracle(cfg, question)
    return load_callable(cfg.loop.answer_oracle, "loop.answer_oracle")
