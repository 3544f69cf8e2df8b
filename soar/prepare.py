"""Everything ``soar-train`` (and ``soar-estimate``'s calibration) needs before the outer loop, on top
of ``soar.stage.setup_stage`` (config checks, the base model, the run dir): the question pool
(``data.path`` or ``data.build``), the fail@k hard set (``loop.hard_set``: a hard-set folder, a fail@k
manifest or a JSONL; or built in ``<run>/hard_set`` with the resumable filter), and the context checks
of the teacher's and the students' prompts. ``read_train_inputs`` (``setup_stage``'s ``prepare``)
reads and checks all it can before the run dir is written; ``setup_train`` then builds what must be
built in the run dir and records the hard set's hash (``hard_set.json``), which every later command
on the run must match."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from soar.config import ConfigError
from soar.data import (
    DataError,
    Problem,
    dedupe_questions,
    load_problem_records,
    load_problems,
    problems_hash,
    render_prompt,
    text_key,
    write_jsonl,
)
from soar.filters.failk import (
    UNRECORDED_SPLIT_SEED,
    check_filter_prompts,
    check_manifest_row,
    filter_to_hard_set,
    manifest_split_seed,
    read_manifest_rows,
    split_hard,
    ungradable,
)
from soar.grading import make_grader
from soar.stage import Stage
from soar.worlds.base import build_pool_hook

log = logging.getLogger("soar.prepare")


@dataclass
class HardSet:
    train: list[Problem]
    test: list[Problem]
    source: str
    ungradable: list[str] = field(default_factory=list)
    """Ids left out because the grader cannot grade their gold (``soar.filters.failk.ungradable``)."""
    duplicates: list[str] = field(default_factory=list)
    """Ids left out as repeats of another row's question (``soar.data.dedupe_questions``)."""
    derived: bool = False
    """The split was drawn here (from a manifest or a JSONL): ``setup_train`` writes it to ``<run>/hard_set``."""

    @property
    def sha256(self) -> str:
        """The content (ids, questions, answers) of both splits: what a resumed run must still train on."""
        return hashlib.sha256(f"{problems_hash(self.train)}:{problems_hash(self.test)}".encode()).hexdigest()[:16]


@dataclass
class TrainInputs:
    """What ``read_train_inputs`` found: the hard set when it can be read, else the pool to filter
    (None: ``data.build`` writes it into the run dir)."""

    hard: HardSet | None
    pool: list[Problem] | None = None


def read_train_inputs(stage: Stage) -> TrainInputs:
    """``setup_stage``'s ``prepare`` for ``soar-train``: everything it can check before the run dir is
    written. The teacher's prompt fits the context; the hard set (a resumed run's, or ``loop.hard_set``)
    is read and checked (``check_hard_set``: its size against ``inner.reward_questions``, the students'
    prompts, its hash against the run's record), or the pool to filter is read and its prompts checked."""
    cfg, run_path = stage.cfg, stage.run.path
    stage.check_prompts([cfg.teacher.prompt], cfg.teacher.max_tokens, "teacher.max_tokens")
    hard = read_hard_set(cfg, run_path)
    if hard is not None:
        check_hard_set(cfg, stage, hard)
        return TrainInputs(hard)
    pool = load_problems(cfg.data) if cfg.data.path else None
    if pool is not None:
        check_filter_prompts(cfg, pool, stage.model, stage.tokenizer)
    return TrainInputs(None, pool)


def setup_train(cfg, stage: Stage) -> HardSet:
    """The hard set of a ``soar-train`` run opened by ``setup_stage(..., prepare=read_train_inputs)``:
    the one read there (a derived split written to ``<run>/hard_set``), else built in the run dir with
    fail@k and checked; its hash recorded in ``hard_set.json`` when the run first has it. Records its
    time in ``stage.seconds``."""
    t0 = time.perf_counter()
    inputs: TrainInputs = stage.prepared
    hard = inputs.hard
    if hard is None:
        hard = build_hard_set(cfg, stage.run.path, stage.model, stage.tokenizer, inputs.pool, cfg.run.progress)
        check_hard_set(cfg, stage, hard)
    elif hard.derived:
        write_hard_split(stage.run.path / "hard_set", hard)
    stage.run.record_once("hard_set.json", {"source": hard.source, "sha256": hard.sha256, "train": len(hard.train),
                                            "test": len(hard.test), "ungradable_golds": hard.ungradable,
                                            "duplicate_questions": len(hard.duplicates)})
    if hard.ungradable:
        log.warning("hard set: %d problems left out, their gold answers ungradable (%s): %s", len(hard.ungradable),
                    cfg.data.grader, ", ".join(hard.ungradable))
    stage.seconds["hard_set_s"] = time.perf_counter() - t0
    return hard


def recorded_hard_sets(run) -> dict[str, dict]:
    """Where the run ``run`` (a ``RunDir``) recorded the hard set it trained on: ``hard_set.json``, and the
    checkpoint it resumes from (``state.json``'s ``hard_set_sha256``, which every checkpoint keeps, so
    deleting ``hard_set.json`` does not erase the record); ``{where: {"sha256", "train", "test"}}``."""
    records = {}
    if (run.path / "hard_set.json").exists():
        records["hard_set.json"] = json.loads((run.path / "hard_set.json").read_text())
    if run.resume_from is not None:
        state = json.loads((run.resume_from / "state.json").read_text())  # intact: RunDir checked it
        if state.get("hard_set_sha256"):
            records[f"{run.resume_from.relative_to(run.path).as_posix()}/state.json"] = {
                "sha256": state["hard_set_sha256"]}
    return records


def check_hard_set(cfg, stage: Stage, hard: HardSet) -> None:
    """A hard set the loop can use: at least ``inner.reward_questions`` train problems, every student
    prompt within the context, and, in a run that recorded one, the hard set it started with."""
    for where, recorded in recorded_hard_sets(stage.run).items():
        if recorded.get("sha256") != hard.sha256:
            field = "loop.hard_set" if cfg.loop.hard_set else "run.dir"
            sizes = f", {recorded['train']} train / {recorded['test']} test" if "train" in recorded else ""
            raise ConfigError(f"config error: {field}: the hard set {hard.source} is not the one {stage.run.path} "
                              f"started with ({where}: sha256 {recorded.get('sha256')}{sizes}; now {hard.sha256}, "
                              f"{len(hard.train)} / {len(hard.test)}); restore it, or choose a new run.dir")
    if cfg.inner.reward_questions > len(hard.train):
        reuse = "" if cfg.loop.hard_set else (f"; a new run.dir with loop.hard_set={stage.run.path / 'hard_set'} reuses "
                                              "this hard set")
        raise ConfigError(f"config error: inner.reward_questions: M={cfg.inner.reward_questions} is larger than the "
                          f"hard train split ({len(hard.train)} problems in {hard.source}){reuse}")
    problems = hard.train + hard.test
    stage.check_prompts([render_prompt(cfg.data.prompt_template, p.question) for p in problems],
                        cfg.student.max_tokens, "student.max_tokens", [p.id for p in problems])
    log.info("hard set from %s: %d train / %d test", hard.source, len(hard.train), len(hard.test))


def read_hard_set(cfg, run_path: Path) -> HardSet | None:
    """The run's hard set when it can be read without writing: the split a resumed run started with,
    or ``loop.hard_set``'s; None when fail@k must build it in the run dir."""
    folder = run_path / "hard_set"
    if cfg.loop.hard_set and has_hard_split(folder):  # resumed: the split the run started with
        return HardSet(*read_hard_split(cfg, folder), str(cfg.loop.hard_set))
    if cfg.loop.hard_set:
        return read_given_hard_set(cfg)
    if (folder / "summary.json").exists():  # built by this run's fail@k
        summary = json.loads((folder / "summary.json").read_text())
        return HardSet(*read_hard_split(cfg, folder), str(folder), summary.get("ungradable_golds", []),
                       summary.get("duplicate_ids", []))
    return None


def build_hard_set(cfg, run_path: Path, model, tokenizer, pool: list[Problem] | None, progress: bool = True) -> HardSet:
    """fail@k on ``pool`` (None: the pool ``data.build`` writes into the run dir) in ``<run>/hard_set``
    (resumable: its manifest keeps every finished batch)."""
    folder = run_path / "hard_set"
    folder.mkdir(parents=True, exist_ok=True)
    if pool is None:
        pool = load_problems(cfg.data, str(build_pool_hook(cfg, run_path / "problems")))
    summary = filter_to_hard_set(cfg, pool, model, tokenizer, folder, progress)
    return HardSet(*read_hard_split(cfg, folder), str(folder), summary["ungradable_golds"], summary["duplicate_ids"])


def hard_set(cfg, run_path: Path, model, tokenizer, progress: bool = True) -> HardSet:
    """The run's hard set, read (``read_hard_set``; a derived split written to ``<run>/hard_set``) or
    built (``build_hard_set``): ``setup_train`` without the run-dir bookkeeping."""
    hard = read_hard_set(cfg, run_path)
    if hard is None:
        pool = load_problems(cfg.data) if cfg.data.path else None
        return build_hard_set(cfg, run_path, model, tokenizer, pool, progress)
    if hard.derived:
        write_hard_split(run_path / "hard_set", hard)
    return hard


def has_hard_split(folder: Path) -> bool:
    return all((folder / f"hard_{s}.jsonl").is_file() for s in ("train", "test"))


def read_hard_split(cfg, folder: Path) -> tuple[list[Problem], list[Problem]]:
    """(train, test) of a folder holding ``hard_train.jsonl`` and ``hard_test.jsonl``."""
    return tuple(load_problem_records(cfg.data, folder / f"hard_{s}.jsonl") for s in ("train", "test"))


def given_hard_set(cfg, run_path: Path | None = None,
                   field: str = "loop.hard_set") -> tuple[list[Problem], list[Problem], str]:
    """``read_given_hard_set`` as (train, test, source); a derived split is written to
    ``<run_path>/hard_set`` for the record (and a resumed run reads it from there)."""
    hard = read_given_hard_set(cfg, field)
    if run_path is not None and hard.derived:
        write_hard_split(run_path / "hard_set", hard)
    return hard.train, hard.test, hard.source


def write_hard_split(folder: Path, hard: HardSet) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, split in (("train", hard.train), ("test", hard.test)):
        write_jsonl(folder / f"hard_{name}.jsonl", [{**p.to_dict(), "meta": json.dumps(p.meta)} for p in split])


def read_given_hard_set(cfg, field: str = "loop.hard_set") -> HardSet:
    """The hard set at ``field`` (``loop.hard_set``, or ``eval.hard_set``): a folder with
    ``hard_{train,test}.jsonl``; a fail@k manifest (a ``manifest.jsonl`` or a folder with only one),
    whose 0-pass ids are taken from ``data``; or a JSONL of problems with or without a ``split``
    column. The split is the hard set's, whatever the run's seed: the folder's files, the ``split``
    column, else ``split_hard`` from the manifest's recorded seed (``manifest_split_seed``: the split
    ``soar-filter`` writes for it) or, recording none, ``UNRECORDED_SPLIT_SEED``. Problems whose gold
    the grader cannot grade are left out (``HardSet.ungradable``); a train problem also in test is
    refused, naming the ids. Reads only."""
    given = Path(OmegaConf.select(cfg, field)).expanduser()
    if given.is_dir() and has_hard_split(given):
        train, test = read_hard_split(cfg, given)
        return _checked_hard_set(cfg, field, train, test, str(given))
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
    duplicates = []
    if all(v is None for v in splits.values()):  # the split is drawn here: each question once, before it
        problems, duplicates = dedupe_questions(problems, str(given))
        splits = {p.id: None for p in problems}
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
    hard = _checked_hard_set(cfg, field, [by_id[i] for i in train_ids], [by_id[i] for i in test_ids], str(given))
    hard.derived = True
    hard.duplicates = duplicates + hard.duplicates
    return hard


def _checked_hard_set(cfg, field: str, train: list[Problem], test: list[Problem], source: str) -> HardSet:
    """Train and test share no id and no question (as text: ``soar.data.text_key``, whatever the ids); a
    question repeated within a split is kept once; problems whose gold the grader cannot grade are left
    out."""
    overlap = sorted({p.id for p in train} & {p.id for p in test})
    if overlap:
        raise ConfigError(f"config error: {field}: {source}: {len(overlap)} ids are in both hard train and hard test "
                          f"({', '.join(overlap[:10])}{', ...' if len(overlap) > 10 else ''}); a test problem must "
                          "never be trained on")
    train, repeated_train = dedupe_questions(train, f"{source} (hard train)")
    test, repeated_test = dedupe_questions(test, f"{source} (hard test)")
    in_test = {text_key(p.question): p.id for p in test}
    shared = [f"{p.id} = {in_test[text_key(p.question)]}" for p in train if text_key(p.question) in in_test]
    if shared:
        raise ConfigError(f"config error: {field}: {source}: {len(shared)} questions of hard train are also in hard test "
                          f"under other ids (compared as text: {', '.join(shared[:5])}{', ...' if len(shared) > 5 else ''}"
                          "); a test problem must never be trained on")
    grader = make_grader(cfg.data.grader)
    try:
        bad = set(ungradable(train + test, grader))
    finally:
        getattr(grader, "close", lambda: None)()
    if bad:
        log.warning("%s: %d problems have a gold answer the grader (%s) cannot grade; left out: %s", source, len(bad),
                    cfg.data.grader, ", ".join(sorted(bad)))
    return HardSet([p for p in train if p.id not in bad], [p for p in test if p.id not in bad], source,
                   [p.id for p in train + test if p.id in bad], repeated_train + repeated_test)


def _read_manifest(path: Path, field: str) -> dict[str, dict] | None:
    """A fail@k manifest's rows by id (a cut last line is ignored), or None if ``path`` is not one."""
    try:
        rows, _ = read_manifest_rows(path)
    except ValueError as exc:
        raise ConfigError(f"config error: {field}: {exc}") from None
    if not all(isinstance(row, dict) and {"id", "passes", "outcomes"} <= row.keys() for row in rows):
        return None
    for n, row in enumerate(rows):
        try:
            check_manifest_row(row, n + 1, path)
        except DataError as exc:
            raise ConfigError(f"config error: {field}: {exc}") from None
    return {str(row["id"]): row for row in rows}
