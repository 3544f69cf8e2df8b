"""soar: an open implementation of SOAR (arXiv 2601.18778), teaching models to teach themselves.

Layers, bottom to top. A module imports only from its own layer or below, and never in a cycle
(``tests/test_imports.py`` walks every import, including those inside functions, against ``LAYERS``):

    0 config      config (the schema, hooks' registry of world configs), seeding, faults, signals
    1 foundations grading, data, models, samples / generation / vllm_backend, run dirs, run data,
                  state, diversity, prompt/stop token ids (soar.tokens), the stage setup (soar.stage),
                  the World interface (soar.worlds.base), the GPU memory plan (soar.memory_plan)
    2 trainer     students.rloo, students.trainer (RLOO, soar-rl), filters (fail@k, soar-filter)
    3 roles       teachers (prompts, parsing, sampling, rewards, update), students (pool, lockstep,
                  promotion), worlds (arith: one World), the Llama-3.2 rehearsal model (soar.rehearsal)
    4 loop        loop (the SOAR outer loop, soar-train), prepare (hard set, train setup)
    5 products    evaluate (soar-eval), export (soar-export), report (soar-report), estimate
    6 interface   cli (the soar-* commands) and this package's API

The design card's folders map to modules of this one package: ``students/`` is ``soar/students/``,
``teachers/`` is ``soar/teachers/``, ``filters/`` is ``soar/filters/``; ``conf/`` stays at the top of
the repository and ships inside the wheel as ``soar/conf``.

Python API (lazy imports keep ``import soar`` fast)::

    import soar
    cfg = soar.compose(["model.path=out/model", "data.path=train.jsonl", "student.max_steps=20"])
    soar.train(cfg)             # = soar-train (the SOAR loop)
    soar.train_rl(cfg)          # = soar-rl
    soar.fail_at_k(cfg)         # = soar-filter
"""

__version__ = "0.1.0"

LAYERS: dict[str, int] = {
    "soar.config": 0, "soar.seeding": 0, "soar.faults": 0, "soar.signals": 0, "soar.stats": 0,
    "soar.grading": 1, "soar.data": 1, "soar.models": 1, "soar.samples": 1, "soar.generation": 1,
    "soar.vllm_backend": 1, "soar.run": 1, "soar.rundata": 1, "soar.state": 1, "soar.diversity": 1,
    "soar.stage": 1, "soar.tokens": 1, "soar.memory_plan": 1, "soar.worlds": 1, "soar.worlds.base": 1,
    "soar.stacked_llama": 1,
    "soar.students.rloo": 2, "soar.students.trainer": 2, "soar.filters": 2, "soar.filters.failk": 2,
    "soar.teachers": 3, "soar.teachers.prompts": 3, "soar.teachers.parse": 3, "soar.teachers.sampling": 3,
    "soar.teachers.rewards": 3, "soar.teachers.update": 3, "soar.students": 3, "soar.students.pool": 3,
    "soar.students.lockstep": 3, "soar.students.batched": 3, "soar.students.promotion": 3, "soar.worlds.arith": 3,
    "soar.rehearsal": 3,
    "soar.loop": 4, "soar.prepare": 4,
    "soar.evaluate": 5, "soar.export": 5, "soar.report": 5, "soar.estimate": 5,
    "soar.cli": 6, "soar": 6,
}
"""Each module's layer (above); a new module needs a row here. A world module is layer 3."""

from soar.config import ConfigError, SoarConfig, compose, validate  # noqa: E402


def train(cfg) -> dict:
    """Run the SOAR outer loop (the ``soar-train`` stage); returns its summary."""
    from soar.loop import run_train

    return run_train(cfg)


def train_rl(cfg) -> dict:
    """Train one student with RLOO (the ``soar-rl`` stage); returns its summary."""
    from soar.students.trainer import run_rl  # lazy, as every stage here: ``import soar`` stays light

    return run_rl(cfg)


def fail_at_k(cfg) -> dict:
    """Run the fail@k filter (the ``soar-filter`` stage); returns its summary."""
    from soar.filters.failk import run_filter_stage

    return run_filter_stage(cfg)


__all__ = ["LAYERS", "ConfigError", "SoarConfig", "compose", "validate", "train", "train_rl", "fail_at_k"]
