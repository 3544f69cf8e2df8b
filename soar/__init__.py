"""soar: an open implementation of SOAR (arXiv 2601.18778), teaching models to teach themselves.

Python API (lazy imports keep ``import soar`` fast)::

    import soar
    cfg = soar.compose(["model.path=out/model", "data.path=train.jsonl", "student.max_steps=20"])
    soar.train(cfg)             # = soar-train (the SOAR loop)
    soar.train_rl(cfg)          # = soar-rl
    soar.fail_at_k(cfg)         # = soar-filter
"""

__version__ = "0.1.0"

from soar.config import ConfigError, SoarConfig, compose, validate  # noqa: E402


def train(cfg) -> dict:
    """Run the SOAR outer loop (the ``soar-train`` stage); returns its summary."""
    from soar.loop import run_train

    return run_train(cfg)


def train_rl(cfg) -> dict:
    """Train one student with RLOO (the ``soar-rl`` stage); returns its summary."""
    from soar.students.trainer import run_rl

    return run_rl(cfg)


def fail_at_k(cfg) -> dict:
    """Run the fail@k filter (the ``soar-filter`` stage); returns its summary."""
    from soar.filters.failk import run_filter_stage

    return run_filter_stage(cfg)


__all__ = ["ConfigError", "SoarConfig", "compose", "validate", "train", "train_rl", "fail_at_k"]
