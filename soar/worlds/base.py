"""The ``World`` interface: a task domain's model, problems, prompts, grading and (where it has one) an
exact-answer oracle, and the registry behind ``world=<name>`` (the pattern of tinker-cookbook's ``Env`` and
nanochat's ``Task``).

A world is one module that subclasses ``World`` and registers it, plus one YAML::

    @register_world
    class MyWorld(World):
        name = "mine"                   # world=mine
        config_class = MyWorldConfig    # its settings (cfg.world); the dataclass defaults are the only ones
        def build_model(self, cfg): ...             # model.build: world
        def build_pool(self, cfg, out_dir): ...     # data.build: world
        ...

The YAML (``conf/world/mine.yaml``, or ``config_file`` beside a module outside the package) is
``# @package _global_`` with ``defaults: [/world/mine_schema@world, _self_]``: its ``world:`` node sets the
world's fields, and its ``model:`` and ``data:`` nodes the model and data defaults the world brings
(``model.build: world``, ``data.build: world``, its grader, ``data.prompt_template:
${world.student_template}``): they apply after the model and data groups and before an experiment and the
command line. (``conf/world/arith.yaml`` predates this and sets the world alone: the presets choose
``model=arith`` and ``data=arith``.)

The package's worlds are imported by ``soar.worlds``; a world of another package is named by an entry
point of group ``soar.worlds`` (``[project.entry-points."soar.worlds"] mine = "mypackage.mine"``). Every
world module is imported whenever a config is composed, so it imports no torch and no role code at its
top: what needs them (pretraining its model) is a module of its own, imported inside the method that
needs it (``ArithWorld.pretrain``).

Three config fields hand work to the configured world when set to ``world``, or to a ``module:function``
of the user's: ``model.build`` (``build_model_hook``), ``data.build`` (``build_pool_hook``) and
``loop.answer_oracle`` (``answer_oracle_hook``). ``soar-world pretrain|problems`` (``soar.cli``) calls
``pretrain`` and ``problem_files``; a world's programmatic coach is ``soar.coach.WORLD_COACHES``.
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
    """A task domain: its model, its hard-set candidates, the real questions an oracle trains on and the
    exact answers to its questions (its prompts and grader are settings of its YAML). Methods take the
    run's composed config ``cfg``; ``self.config(cfg)`` is the world's own typed settings (``cfg.world``)."""

    name: ClassVar[str]
    """``world=<name>``; also the ``name`` field of its config."""
    config_class: ClassVar[type]
    """The dataclass of ``cfg.world`` (its defaults are the world's only defaults)."""
    config_file: ClassVar[Path | None] = None
    """The world's YAML when it is not ``conf/world/<name>.yaml`` (a world outside the package ships it
    beside its module); ``soar.hydra_config`` registers it as ``world=<name>``."""

    def config(self, cfg) -> Any:
        """``cfg.world`` as ``config_class``, its dataclass defaults under the given values."""
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(self.config_class), cfg.world or {}))

    def build_model(self, cfg) -> Path:
        """``model.build: world`` (``soar.stage``): the base model folder (HF format), built, cached or shipped."""
        raise NotImplementedError

    def pretrain(self, cfg) -> Path:
        """``soar-world pretrain``: build the world model (or reuse this world's own build of it), never a
        copy the package ships; its folder. By default ``build_model``."""
        return self.build_model(cfg)

    def build_pool(self, cfg, out_dir: Path) -> Path:
        """``data.build: world`` (``soar-train``'s hard set, ``soar.prepare``): write the hard-set candidates
        (before fail@k) under ``out_dir``; their path."""
        raise NotImplementedError

    def problem_files(self, cfg, out_dir: Path) -> dict[str, Path]:
        """``soar-world problems``: write the world's problem files under ``out_dir``; name -> path. By
        default the hard-set candidates alone (``pool``)."""
        return {"pool": self.build_pool(cfg, out_dir)}

    def oracle_problems(self, cfg, count: int) -> list[Problem]:
        """``soar-eval eval.method=oracle`` without ``eval.oracle_path``: ``count`` real questions that
        should teach the hard set (the paper: 128 MATH training questions); the same arguments give the
        same problems."""
        raise NotImplementedError

    def answer_oracle(self, cfg, question: str) -> str | None:
        """``loop.answer_oracle: world``: the exact answer to ``question``, None if it is not one of the
        world's. Measurement only (``teacher/answer_correct_frac``): never a reward."""
        return None


WORLDS: dict[str, World] = {}
"""Registered worlds by name (``soar.worlds`` imports the package's worlds and those of entry points)."""


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
