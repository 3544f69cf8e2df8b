"""Everything ``soar-train`` (and ``soar-estimate``'s calibration) needs before the outer loop, on top
of ``soar.stage.setup_stage`` (config checks, the base model, the run dir): the question pool
(``data.path`` or ``data.build``), the fail@k hard set (``loop.hard_set``: a hard-set folder, a fail@k
manifest or a JSONL; or built in ``<run>/hard_set`` with the resumable filter), and the context checks
of the teacher's and the students' prompts (``setup_train``)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from soar.config import ConfigError
from soar.data import DataError, Problem, load_problem_records, load_problems, render_prompt, write_jsonl
from soar.filters.failk import (
    UNRECORDED_SPLIT_SEED,
    filter_to_hard_set,
    manifest_split_seed,
    read_manifest_rows,
    split_hard,
)
from soar.stage import Stage
from soar.worlds.base import build_pool_hook

log = logging.getLogger("soar.prepare")


@dataclass
class HardSet:
    train: list[Problem]
    test: list[Problem]
    source: str


def setup_train(cfg, stage: Stage) -> HardSet:
    """The hard set of a ``soar-train`` run opened by ``setup_stage`` (built in its run dir unless
    given), then the context checks: the teacher's prompt plus ``teacher.max_tokens``, and every hard
    question's student prompt plus ``student.max_tokens``. Records its time in ``stage.seconds``."""
    t0 = time.perf_counter()
    hard = hard_set(cfg, stage.run.path, stage.model, stage.tokenizer, cfg.run.progress)
    stage.seconds["hard_set_s"] = time.perf_counter() - t0
    stage.check_prompts([cfg.teacher.prompt], cfg.teacher.max_tokens, "teacher.max_tokens")
    stage.check_prompts([render_prompt(cfg.data.prompt_template, p.question) for p in hard.train + hard.test],
                        cfg.student.max_tokens, "student.max_tokens")
    return hard


def hard_set(cfg, run_path: Path, model, tokenizer, progress: bool = True) -> HardSet:
    folder = run_path / "hard_set"
    if cfg.loop.hard_set and has_hard_split(folder):  # resumed: the split the run started with
        train, test = read_hard_split(cfg, folder)
        source = str(cfg.loop.hard_set)
    elif cfg.loop.hard_set:
        train, test, source = given_hard_set(cfg, run_path)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "summary.json").exists():
            path = cfg.data.path
            if not path:
                path = build_pool_hook(cfg, run_path / "problems")
            filter_to_hard_set(cfg, load_problems(cfg.data, str(path)), model, tokenizer, folder, progress)
        train, test = read_hard_split(cfg, folder)
        source = str(folder)
    if cfg.inner.reward_questions > len(train):
        raise ConfigError(f"config error: inner.reward_questions: M={cfg.inner.reward_questions} is larger than the "
                          f"hard train split ({len(train)} problems in {source})")
    log.info("hard set from %s: %d train / %d test", source, len(train), len(test))
    return HardSet(train, test, source)


def has_hard_split(folder: Path) -> bool:
    return all((folder / f"hard_{s}.jsonl").is_file() for s in ("train", "test"))


def read_hard_split(cfg, folder: Path) -> tuple[list[Problem], list[Problem]]:
    """(train, test) of a folder holding ``hard_train.jsonl`` and ``hard_test.jsonl``."""
    return tuple(load_problem_records(cfg.data, folder / f"hard_{s}.jsonl") for s in ("train", "test"))


def given_hard_set(cfg, run_path: Path | None = None,
                   field: str = "loop.hard_set") -> tuple[list[Problem], list[Problem], str]:
    """The hard set at ``field`` (``loop.hard_set``, or ``eval.hard_set``) as (train, test, source): a
    folder with ``hard_{train,test}.jsonl``; a fail@k manifest (a ``manifest.jsonl`` or a folder with
    only one), whose 0-pass ids are taken from ``data``; or a JSONL of problems with or without a
    ``split`` column. The split is the hard set's, whatever the run's seed: the folder's files, the
    ``split`` column, else ``split_hard`` from the manifest's recorded seed (``manifest_split_seed``:
    the split ``soar-filter`` writes for it) or, recording none, ``UNRECORDED_SPLIT_SEED``. A derived
    split is written to ``<run>/hard_set`` for the record (and a resumed run reads it from there)."""
    given = Path(OmegaConf.select(cfg, field)).expanduser()
    if given.is_dir() and has_hard_split(given):
        return *read_hard_split(cfg, given), str(given)
    if given.is_dir() and (given / "manifest.jsonl").exists():
        given = given / "manifest.jsonl"
    if not given.is_file():
        raise ConfigError(f"config error: {field}: {given} holds neither hard_train.jsonl and hard_test.jsonl "
                          "nor a manifest.jsonl")
    manifest = _read_manifest(given, field)
    split_seed = UNRECORDED_SPLIT_SEED
    if manifest is not None:
        if not cfg.data.path:
            raise ConfigError(f"config error: data.path: {field}={given} is a fail@k manifest; its problems come "
                              "from data (e.g. data=math)")
        try:
            split_seed = manifest_split_seed(list(manifest.values()), given)
        except DataError as exc:
            raise ConfigError(f"config error: {field}: {exc}") from None
        pool = {p.id: p for p in load_problems(cfg.data)}
        hard_ids = [pid for pid, row in manifest.items() if row["passes"] == 0]
        missing = [pid for pid in hard_ids if pid not in pool]
        if missing:
            raise ConfigError(f"config error: {field}: {len(missing)} ids of {given} are not in data "
                              f"({cfg.data.path}), e.g. {missing[:3]}")
        problems = [pool[pid] for pid in hard_ids]
    else:
        problems = load_problem_records(cfg.data, given)
    splits = {p.id: p.meta.get("split") for p in problems}
    if any(v is not None for v in splits.values()):
        odd = [pid for pid, v in splits.items() if v not in ("train", "test")]
        if odd:
            raise ConfigError(f"config error: {field}: {given}: field 'split' of id {odd[0]!r} is "
                              f"{splits[odd[0]]!r} (expected train or test in every row)")
        train_ids, test_ids = ([pid for pid, v in splits.items() if v == s] for s in ("train", "test"))
    else:
        train_ids, test_ids = split_hard(list(splits), cfg.filter.test_frac, split_seed)
        log.info("%s: hard split drawn with the hard set's seed %s (filter.test_frac=%s)", given, split_seed,
                 cfg.filter.test_frac)
    by_id = {p.id: p for p in problems}
    train, test = [by_id[i] for i in train_ids], [by_id[i] for i in test_ids]
    if run_path is not None:
        folder = run_path / "hard_set"
        folder.mkdir(parents=True, exist_ok=True)
        for name, split in (("train", train), ("test", test)):
            write_jsonl(folder / f"hard_{name}.jsonl", [{**p.to_dict(), "meta": json.dumps(p.meta)} for p in split])
    return train, test, str(given)


def _read_manifest(path: Path, field: str) -> dict[str, dict] | None:
    """A fail@k manifest's rows by id (a cut last line is ignored), or None if ``path`` is not one."""
    try:
        rows, _ = read_manifest_rows(path)
    except ValueError as exc:
        raise ConfigError(f"config error: {field}: {exc}") from None
    if not all(isinstance(row, dict) and {"id", "passes", "outcomes"} <= row.keys() for row in rows):
        return None
    return {str(row["id"]): row for row in rows}
