"""One setup for the stages that load a model (``soar-rl``, ``soar-train``, ``soar-estimate``,
``soar-eval``): check the config, set torch's threads, build or find the model (``model.build``), run
the stage's own checks, open the run directory (locked and checked against what it holds, nothing
written), load the tokenizer and (optionally) the model, run the stage's ``prepare`` (its reads:
data, hard set, prompt lengths), and only then write the run's provenance (``RunDir.commit``): a
command that fails before that leaves the run directory as it was.
``check_prompts`` is the context check every stage applies to the prompts it will generate from.

    stage = setup_stage(cfg, "rl", prepare=read_questions)   # stage.prepared: what it returned
    try:
        stage.check_prompts(student_prompts, cfg.student.max_tokens, "student.max_tokens")
        ...
    finally:
        stage.close()
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from omegaconf import open_dict

from soar.machine import on_gpu, use_expandable_segments
from soar.memory_plan import STAGES, check_plan, set_stage
from soar.models import check_context, load_model, load_tokenizer, model_context, set_threads
from soar.run import RunDir
from soar.validation import validate
from soar.worlds.base import build_model_hook


def resolve_model_path(cfg) -> None:
    """Fill ``model.path`` from ``model.build`` when it is null (e.g. the world's cached pretraining)."""
    if not cfg.model.path and cfg.model.build:
        path = build_model_hook(cfg)
        with open_dict(cfg):
            cfg.model.path = str(path)


@dataclass
class Stage:
    """What ``setup_stage`` opened: the run directory, the tokenizer and the base model (None when
    not loaded), and the seconds it took."""

    cfg: Any
    run: RunDir
    tokenizer: Any
    model: Any = None
    seconds: dict[str, float] = field(default_factory=dict)
    prepared: Any = None
    """What the stage's ``prepare`` returned."""

    @property
    def context(self) -> int:
        """The model's context length (``model.max_context``, else the model config's)."""
        return model_context(self.model, self.cfg.model)

    def check_prompts(self, prompts: list[str], max_tokens: int, where: str, names: list[str] | None = None) -> int:
        """Fail early (``ConfigError`` naming ``where``, and the prompt by ``names`` when one is too long
        to tokenise) when the longest prompt plus ``max_tokens`` exceeds the model's context; returns
        the longest prompt's length in tokens."""
        return check_context(self.tokenizer, prompts, max_tokens, self.context, where, names)

    def close(self) -> None:
        self.run.close()


def setup_stage(cfg, stage: str, load_base: bool = True, checks: Callable[[], None] | None = None,
                prepare: Callable[[Stage], Any] | None = None) -> Stage:
    """Validate ``cfg`` for ``stage`` (``soar.validation.validate``), set threads, resolve ``model.build``,
    on a GPU set the allocator's ``expandable_segments`` (unless the user set it) and check the stage's
    memory plan (``soar.memory_plan.check_plan``, train | rl | eval | filter), run ``checks`` (the
    stage's own, before the run dir is opened), open the run dir (``RunDir``: refuses another stage's
    run, other settings, another model), load the tokenizer and, with ``load_base``, the model, run
    ``prepare(stage)`` (reads only; its result is ``stage.prepared``), then write the run's provenance
    (``RunDir.commit``). The caller closes the returned ``Stage``."""
    t0 = time.perf_counter()
    validate(cfg, stage)
    set_threads(cfg.run.threads)
    resolve_model_path(cfg)  # may pretrain the world model once (it is cached afterwards)
    set_stage(stage)  # the plan this process's engines are sized by
    if stage in STAGES and on_gpu(cfg):
        use_expandable_segments()  # before the first CUDA allocation; the plan's slack assumes it
        if cfg.resources.check_memory:
            check_plan(cfg, stage=stage)  # every GPU fits, before anything is loaded or written
    if checks is not None:
        checks()
    run = RunDir(cfg, stage)
    try:
        result = Stage(cfg, run, load_tokenizer(cfg.model), load_model(cfg.model) if load_base else None)
        if prepare is not None:
            result.prepared = prepare(result)
        run.commit()
    except BaseException:
        run.close()
        raise
    result.seconds["setup_s"] = time.perf_counter() - t0
    return result
