"""soar: an open implementation of SOAR (arXiv 2601.18778), teaching models to teach themselves.

Layers, bottom to top. A module imports only from its own layer or below, never in a cycle, and the
teacher and student roles never import each other (``tests/test_imports.py`` walks every import against
``LAYERS``):

    0 config      config (the schema), its default prompt texts (soar.default_prompts), resolving what a value
                  names (soar.resolve: a role's backend, a dotted function), seeding, faults, signals, stats, the
                  students an outer step trains (soar.student_tasks, which the ${student_tasks:} resolver reads)
    1 foundations grading, the students' rollout rewards (soar.student_rewards), the leak check (soar.leak),
                  data, models, samples / generation / vllm_backend, run dirs, the metrics log (soar.metrics_log),
                  the console (soar.console), state, diversity, prompt/stop token ids (soar.tokens), the machine
                  (soar.machine: RAM, GPUs, the allocator setting), the GPU memory plan (soar.memory_plan),
                  stacked_llama, a team's pure parts (soar.team: credit, sandbox, formats, episode, metrics)
    2 policy      the RLOO policy teachers and students share (soar.policy: rloo, trainer, distill, scores)
    3 roles       teachers (prompts, parsing, sampling, update), students (trainer, executor, pool, lockstep,
                  stacked, promotion), the teacher's rewards (soar.rewards: students scoring the teacher's datasets),
                  worlds (the World interface, one domain module per world, light enough to compose a config
                  with, and the modules of their torch parts: pretraining, team formats), the Llama-3.2
                  rehearsal model, the coach of context distillation (soar.coach), a team's chain
                  (soar.team.rollout)
    4 stages      validation, Hydra's configuration (soar.hydra_config), run data, the stage setup
                  (soar.stage), soar-rl (soar.rl), soar-filter (filters), prepare, the step dump, the outer
                  loop (soar.loop), soar-team (soar.team.train, its checks and memory plan)
    5 products    evaluate (soar-eval), its results over seeds (soar.eval_tables), export (soar-export), report
                  (soar-report), estimate
    6 interface   cli (the soar-* commands) and this package's API

Shape suffixes name a value's axes, outermost first (``rewards_QG``: questions x samples), one letter one
meaning: ``Q`` questions, ``G`` samples per question (a question's RLOO group, ``student.group_size``),
``J`` the teacher's groups of a step (``teacher.groups_per_step``), ``K`` datasets (``teacher.datasets`` per
group), ``R`` students per dataset (``inner.replicates``), ``A`` advised questions, ``E`` episodes (a team's),
``B`` sequences of a batch, ``T`` tokens, ``V`` vocabulary, ``H`` hidden size; ``soar.stacked_llama`` adds
the letters of its stacked layout.

The design card's folders map to modules of this one package: ``students/`` is ``soar/students/``,
``teachers/`` is ``soar/teachers/``, ``filters/`` is ``soar/filters/``; ``conf/`` stays at the top of
the repository and ships inside the wheel as ``soar/conf``.

Python API::

    import soar
    cfg = soar.compose(["model.path=out/model", "data.path=train.jsonl", "student.max_steps=20"])
    soar.validate(cfg, "rl")    # what the stage checks first
    soar.train(cfg)             # = soar-train (the SOAR loop)
    soar.train_rl(cfg)          # = soar-rl
    soar.fail_at_k(cfg)         # = soar-filter

This file runs in every process that imports any module of the package (each grader worker imports
``soar.grading``), so it imports only the schema: the API's functions import their modules (torch and
the rest) when first called. These, the commands' stages (``soar.cli``) and a world's model build are the
package's only imports inside functions: composing a config (``compose``, any command's ``--cfg job``)
imports no torch and no role.
"""

__version__ = "0.1.0"

LAYERS: dict[str, int] = {
    "soar.config": 0, "soar.default_prompts": 0, "soar.resolve": 0, "soar.seeding": 0, "soar.faults": 0, "soar.signals": 0,
    "soar.stats": 0, "soar.student_tasks": 0,
    "soar.grading": 1, "soar.student_rewards": 1, "soar.data": 1, "soar.models": 1, "soar.samples": 1, "soar.generation": 1,
    "soar.vllm_backend": 1, "soar.run": 1, "soar.metrics_log": 1, "soar.console": 1, "soar.state": 1, "soar.diversity": 1,
    "soar.tokens": 1,
    "soar.machine": 1, "soar.memory_plan": 1, "soar.stacked_llama": 1, "soar.leak": 1,
    "soar.team": 1, "soar.team.credit": 1, "soar.team.sandbox": 1, "soar.team.formats": 1, "soar.team.episode": 1,
    "soar.team.metrics": 1,
    "soar.policy": 2, "soar.policy.rloo": 2, "soar.policy.scores": 2, "soar.policy.trainer": 2, "soar.policy.distill": 2,
    "soar.teachers": 3, "soar.teachers.prompts": 3, "soar.teachers.parse": 3, "soar.teachers.sampling": 3,
    "soar.teachers.update": 3, "soar.students": 3, "soar.students.trainer": 3, "soar.students.executor": 3,
    "soar.students.pool": 3, "soar.students.lockstep": 3, "soar.students.stacked": 3, "soar.students.promotion": 3,
    "soar.rewards": 3,
    "soar.worlds": 3, "soar.worlds.base": 3, "soar.worlds.arith": 3, "soar.worlds.arith_pretrain": 3,
    "soar.worlds.arith_team": 3, "soar.worlds.arith_team_formats": 3, "soar.worlds.arith_team_pretrain": 3,
    "soar.rehearsal": 3, "soar.coach": 3, "soar.team.rollout": 3,
    "soar.validation": 4, "soar.hydra_config": 4, "soar.rundata": 4, "soar.stage": 4, "soar.rl": 4,
    "soar.filters": 4, "soar.filters.failk": 4, "soar.prepare": 4, "soar.step_dump": 4, "soar.loop": 4,
    "soar.team.checks": 4, "soar.team.plan": 4, "soar.team.train": 4,
    "soar.evaluate": 5, "soar.eval_tables": 5, "soar.export": 5, "soar.report": 5, "soar.estimate": 5,
    "soar.cli": 6, "soar": 6,
}
"""Each module's layer (above); a new module needs a row here. A world module is layer 3."""

from soar.config import ConfigError, SoarConfig  # noqa: E402


def compose(overrides: list[str] | None = None, config_name: str = "config"):
    """Compose a config from Hydra overrides, e.g. ``soar.compose(["experiment=arith_micro"])``
    (``soar.hydra_config.compose``)."""
    from soar.hydra_config import compose

    return compose(overrides, config_name)


def validate(cfg, stage: str) -> None:
    """Check ``cfg`` for ``stage`` (rl | filter | train | eval | world | plan) before any heavy work; a
    problem is a ``ConfigError`` naming the field (``soar.validation.validate``)."""
    from soar.validation import validate

    validate(cfg, stage)


def train(cfg) -> dict:
    """Run the SOAR outer loop (the ``soar-train`` stage); returns its summary."""
    from soar.loop import run_train

    return run_train(cfg)


def train_rl(cfg) -> dict:
    """Train one student with RLOO (the ``soar-rl`` stage); returns its summary."""
    from soar.rl import run_rl

    return run_rl(cfg)


def fail_at_k(cfg) -> dict:
    """Run the fail@k filter (the ``soar-filter`` stage); returns its summary."""
    from soar.filters.failk import run_filter_stage

    return run_filter_stage(cfg)


__all__ = ["LAYERS", "ConfigError", "SoarConfig", "compose", "validate", "train", "train_rl", "fail_at_k"]
