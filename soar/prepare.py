"""Everything ``soar-train`` needs before the outer loop: the base model (downloaded, local, or built
by ``model.build``), the question pool (``data.path`` or ``data.build``), and the fail@k hard set
(``loop.hard_set``, or built in ``<run>/hard_set`` with the resumable filter)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import open_dict

from soar.config import ConfigError, load_callable
from soar.data import Problem, load_problems

log = logging.getLogger("soar.prepare")


@dataclass
class HardSet:
    train: list[Problem]
    test: list[Problem]
    source: str


def resolve_model_path(cfg) -> None:
    """Fill ``model.path`` from ``model.build`` when it is null (e.g. the world's cached pretraining)."""
    if not cfg.model.path and cfg.model.build:
        path = load_callable(cfg.model.build, "model.build")(cfg)
        with open_dict(cfg):
            cfg.model.path = str(path)


def hard_set(cfg, run_path: Path, model, tokenizer, progress: bool = True) -> HardSet:
    if cfg.loop.hard_set:
        folder = Path(cfg.loop.hard_set).expanduser()
    else:
        from filters.failk import filter_to_hard_set

        folder = run_path / "hard_set"
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "summary.json").exists():
            path = cfg.data.path
            if not path:
                path = load_callable(cfg.data.build, "data.build")(cfg, run_path / "problems")
            filter_to_hard_set(cfg, load_problems(cfg.data, str(path)), model, tokenizer, folder, progress)
    files = {split: folder / f"hard_{split}.jsonl" for split in ("train", "test")}
    for split, f in files.items():
        if not f.exists():
            raise ConfigError(f"config error: loop.hard_set: {f} is missing (expected hard_train.jsonl and hard_test.jsonl)")
    train, test = (load_problems(cfg.data, str(files[s])) for s in ("train", "test"))
    if cfg.inner.reward_questions > len(train):
        raise ConfigError(f"config error: inner.reward_questions: M={cfg.inner.reward_questions} is larger than the "
                          f"hard train split ({len(train)} problems in {files['train']})")
    log.info("hard set from %s: %d train / %d test", folder, len(train), len(test))
    return HardSet(train, test, str(folder))
