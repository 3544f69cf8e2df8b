"""fail@k filter: the problems a model never solves in k samples (paper §4: k=128, T=1.0, 1024
tokens, the student prompt), split 50/50 into hard train/test.

    soar-filter model.path=PATH data=custom data.path=problems.jsonl filter.k=128 run.name=hard

Writes to the run dir: ``manifest.jsonl`` (append-only, one row per problem, resumable),
``hard_set/`` (``datasets.save_to_disk``), ``hard_train.jsonl``, ``hard_test.jsonl``, ``summary.json``,
and every band's problems (``write_bands``): ``bands/{all_zero,mixed,all_one,heldout}.jsonl`` and
``bands/dataset/`` (one split each), with ``filter.heldout_per_source`` problems per source (or
``filter.heldout_frac`` of each source) held out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from soar.config import BANDS, ConfigError
from soar.console import progress_bar
from soar.data import (
    DataError,
    Problem,
    dedupe_questions,
    load_problem_records,
    load_problems,
    quiet_datasets,
    render_prompt,
    write_jsonl,
    write_pool,
)
from soar.generation import SamplingParams, make_generator
from soar.grading import make_grader
from soar.hydra_config import data_group
from soar.models import check_context, model_context, model_fingerprint
from soar.seeding import derive_seed
from soar.stage import setup_stage
from soar.worlds.base import build_pool_hook

log = logging.getLogger("soar.filters")
PROVENANCE_FIELDS = ("model", "template_sha", "sampling", "seed", "k", "grader")


def band(passes: int, k: int) -> str:
    return "all_zero" if passes == 0 else "all_one" if passes == k else "mixed"


def prob_group_mixed(p: float, group: int) -> float:
    """Probability that ``group`` samples at pass rate ``p`` are neither all right nor all wrong
    (only then does RLOO get a gradient)."""
    return 1.0 - p ** group - (1.0 - p) ** group


UNRECORDED_SPLIT_SEED = 0
"""Split seed of a hard set that records none: a manifest whose rows carry no ``seed``, a JSONL of
problems without a ``split`` column. Never the reading run's seed: runs of any seed that read one
hard set must get one split, or one run's Q_R could be another's hard test."""


def split_hard(ids: list[str], test_frac: float, seed: int) -> tuple[list[str], list[str]]:
    """Deterministic train/test split of the hard ids (order-independent: sorted, then seeded). The
    seed is the hard set's (``manifest_split_seed``), not that of a run reading it."""
    ordered = sorted(ids)
    perm = np.random.default_rng(derive_seed(seed, "hard_split")).permutation(len(ordered))
    n_test = int(round(len(ordered) * test_frac))
    test = {ordered[i] for i in perm[:n_test]}
    return [i for i in ordered if i not in test], [i for i in ordered if i in test]


def read_manifest_rows(path: Path) -> tuple[list[dict], int]:
    """A fail@k manifest's rows and its line count; a cut last line (a kill mid-write) is dropped,
    any other line that is not JSON is an error."""
    rows, lines = [], path.read_text().splitlines()
    for n, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n != len(lines) - 1:
                raise DataError(f"{path}: line {n + 1} is not JSON (only the last line may be cut by a kill)") from None
    return rows, len(lines)


def check_manifest_row(row: dict, n: int, path: Path) -> None:
    """A manifest row (``n``: its 1-based line) agrees with itself: ``outcomes`` a list of 0/1, one per
    sample (``k`` of them when the row records ``k``), and ``passes`` their sum. An edited ``passes``
    would decide what is hard; a ``DataError`` names the file, row, id and field."""
    outcomes, passes, where = row.get("outcomes"), row.get("passes"), f"{path}: row {n} (id {row.get('id')!r})"
    if not isinstance(outcomes, list) or any(o not in (0, 1) or isinstance(o, float) for o in outcomes):
        raise DataError(f"{where}: field 'outcomes' must be a list of 0 and 1, got {str(outcomes)[:60]}")
    if "k" in row and len(outcomes) != row["k"]:
        raise DataError(f"{where}: field 'outcomes' has {len(outcomes)} samples but field 'k' is {row['k']}")
    if passes != sum(outcomes):
        raise DataError(f"{where}: field 'passes' is {passes!r} but its outcomes hold {sum(outcomes)} passes; "
                        "the manifest was edited: restore it or run the filter again")


def ungradable(problems: list[Problem], grader) -> list[str]:
    """Ids of the problems whose gold answer the grader cannot grade: the gold itself, boxed, is not
    graded correct (``\\boxed{}``, ``two`` or a 5,000-digit integer for the integer grader). Such a
    problem fails 0/k whatever the model writes, so it is never "hard": the hard sets leave it out."""
    grades = grader.grade_batch([f"\\boxed{{{p.answer}}}" for p in problems], [p.answer for p in problems])
    return [p.id for p, g in zip(problems, grades) if not g.correct]


def manifest_split_seed(rows: list[dict], path: Path) -> int:
    """The seed a fail@k manifest's hard set is split with: the seed its filter ran with, which every
    row records and with which ``soar-filter`` split it (``build_hard_set``), so every run given the
    manifest gets the split ``soar-filter`` wrote; ``UNRECORDED_SPLIT_SEED`` if no row records one."""
    seeds = [row.get("seed") for row in rows]
    for n, seed in enumerate(seeds):
        if seed != seeds[0]:
            raise DataError(f"{path}: row {n + 1}: field 'seed' is {seed!r} but row 1 has {seeds[0]!r} (one fail@k "
                            "run's manifest records one seed, from which its hard split is drawn)")
    return UNRECORDED_SPLIT_SEED if not seeds or seeds[0] is None else seeds[0]


@dataclass
class Manifest:
    """Append-only JSONL of per-problem outcomes; rows of an unfinished batch are dropped on open."""

    path: Path
    provenance: dict

    def load(self, batch_of: dict[str, int]) -> dict[str, dict]:
        if not self.path.exists():
            return {}
        rows, n_lines = read_manifest_rows(self.path)
        for n, row in enumerate(rows):
            check_manifest_row(row, n + 1, self.path)
            for field in PROVENANCE_FIELDS:
                if row.get(field) != self.provenance[field]:
                    raise DataError(
                        f"{self.path}: row {n + 1}: field {field!r} is {row.get(field)!r} but this run has "
                        f"{self.provenance[field]!r}; use a new run dir or restore the original settings")
        # A batch is complete only if all of its problems are present; otherwise redo it whole so
        # the resumed run samples exactly what an uninterrupted one would.
        by_batch: dict[int, list[dict]] = {}
        for row in rows:
            by_batch.setdefault(row["batch"], []).append(row)
        expected = {}
        for pid, b in batch_of.items():
            expected[b] = expected.get(b, 0) + 1
        kept = [r for b, rs in by_batch.items() if len(rs) == expected.get(b, -1) for r in rs]
        if len(kept) != len(rows) or n_lines != len(rows):
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            os.replace(tmp, self.path)
        return {r["id"]: r for r in kept}

    def append(self, rows: list[dict]) -> None:
        with open(self.path, "a") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in rows))
            fh.flush()
            os.fsync(fh.fileno())


def run_filter(problems: list[Problem], generator, grader, cfg, out_dir: Path, provenance_extra: dict,
               progress: bool = True) -> dict:
    """Sample k per problem, record outcomes, build the hard split. Returns the summary dict."""
    f = cfg.filter
    problems, duplicates = dedupe_questions(problems, "fail@k pool")
    sampling = {"temperature": f.temperature, "max_tokens": f.max_tokens, "top_p": 1.0, "top_k": 0}
    provenance = {
        "model": provenance_extra["model"],
        "template_sha": hashlib.sha256(cfg.data.prompt_template.encode()).hexdigest()[:16],
        "sampling": sampling, "seed": cfg.seed, "k": f.k, "grader": cfg.data.grader,
    }
    batches = [problems[i:i + f.problems_per_batch] for i in range(0, len(problems), f.problems_per_batch)]
    batch_of = {p.id: b for b, batch in enumerate(batches) for p in batch}
    manifest = Manifest(out_dir / "manifest.jsonl", provenance)
    done = manifest.load(batch_of)
    todo = [b for b, batch in enumerate(batches) if batch[0].id not in done]
    log.info("fail@%d on %d problems: %d done, %d batches to go", f.k, len(problems), len(done), len(todo))

    t0, n_samples = time.perf_counter(), 0
    bar = progress_bar(progress, total=len(problems), initial=len(done), desc=f"fail@{f.k}", unit="prob")
    for b in todo:
        batch = batches[b]
        params = SamplingParams(n=f.k, temperature=f.temperature, max_tokens=f.max_tokens,
                                seed=derive_seed(cfg.seed, "filter", b))
        outs = generator.generate([render_prompt(cfg.data.prompt_template, p.question) for p in batch], params)
        texts = [s.text for group in outs for s in group]
        grades = grader.grade_batch(texts, [p.answer for p in batch for _ in range(f.k)])
        rows = []
        for i, p in enumerate(batch):
            outcome = [int(g.correct) for g in grades[i * f.k:(i + 1) * f.k]]
            rows.append({"id": p.id, "batch": b, "outcomes": outcome, "passes": sum(outcome),
                         "overflow": sum(s.finish_reason == "length" for s in outs[i]),
                         "grading_errors": sum(g.error is not None for g in grades[i * f.k:(i + 1) * f.k]),
                         **provenance})
        manifest.append(rows)
        done.update({r["id"]: r for r in rows})
        n_samples += len(texts)
        elapsed = time.perf_counter() - t0
        bar.update(len(batch))
        bar.set_postfix(samples_per_s=f"{n_samples / elapsed:.0f}")
    bar.close()
    elapsed = time.perf_counter() - t0
    return build_hard_set(problems, done, cfg, out_dir, provenance,
                          throughput={"seconds": elapsed, "samples": n_samples,
                                      "samples_per_s": n_samples / elapsed if elapsed else None}, grader=grader,
                          duplicates=duplicates)


def check_overflow(zero: list[Problem], rows: dict[str, dict], cfg) -> None:
    """Refuse a hard set of truncations: more than ``filter.max_overflow_frac`` of the 0/k problems'
    samples cut at ``filter.max_tokens`` (a cut sample counts as a failure), naming the setting."""
    f = cfg.filter
    cut = sum(rows[p.id].get("overflow", 0) for p in zero)
    if zero and cut / (len(zero) * f.k) > f.max_overflow_frac:
        raise ConfigError(f"config error: filter.max_tokens: {cut} of the {len(zero) * f.k} samples of the {len(zero)} "
                          f"problems at 0/{f.k} ({cut / (len(zero) * f.k):.0%}, more than filter.max_overflow_frac="
                          f"{f.max_overflow_frac:g}) were cut at filter.max_tokens={f.max_tokens} before an answer, so "
                          "the hard set would hold truncations, not failures; raise filter.max_tokens (in a new run "
                          "dir: this one's manifest holds these samples), or set filter.max_overflow_frac=1 to accept it")


def build_hard_set(problems, rows: dict[str, dict], cfg, out_dir: Path, provenance: dict, throughput: dict,
                   grader=None, duplicates: list[str] | None = None) -> dict:
    """The hard split of the 0/k problems whose gold ``grader`` (default: ``data.grader``'s) can grade
    (``ungradable``: the others are listed in the summary as ``ungradable_golds``), and the summary;
    refused when most of their samples were cut at ``filter.max_tokens`` (``check_overflow``).
    ``duplicates``: the ids left out of the pool as repeats of another row's question (the summary's
    ``duplicate_questions``)."""

    f = cfg.filter
    counts = {"all_zero": 0, "mixed": 0, "all_one": 0}
    mixed_rates = []
    for p in problems:
        r = rows[p.id]
        counts[band(r["passes"], f.k)] += 1
        if band(r["passes"], f.k) == "mixed":
            mixed_rates.append(r["passes"] / f.k)
    zero = [p for p in problems if rows[p.id]["passes"] == 0]
    check_overflow(zero, rows, cfg)
    bad = set(ungradable(zero, grader or make_grader(cfg.data.grader)))
    if bad:
        log.warning("fail@%d: %d of the %d problems at 0/%d have a gold answer the grader (%s) cannot grade; left out "
                    "of the hard set (summary.json: ungradable_golds): %s", f.k, len(bad), len(zero), f.k, cfg.data.grader,
                    ", ".join(p.id for p in zero if p.id in bad))
    hard_ids = [p.id for p in zero if p.id not in bad]
    # The seed every manifest row records: a run given the manifest splits it alike (manifest_split_seed).
    split_seed = provenance["seed"]
    train_ids, test_ids = split_hard(hard_ids, f.test_frac, split_seed)
    by_id = {p.id: p for p in problems}
    source = {"manifest": str(out_dir / "manifest.jsonl"), **provenance}

    def records(ids):
        return [{**by_id[i].to_dict(), "meta": json.dumps(by_id[i].meta), "provenance": json.dumps(source)} for i in ids]

    splits = {"train": records(train_ids), "test": records(test_ids)}
    for name, recs in splits.items():
        write_jsonl(out_dir / f"hard_{name}.jsonl", recs)
    save_splits(splits, RECORD_FEATURES, out_dir / "hard_set")
    band_summary = write_bands(problems, rows, records, cfg, out_dir / "bands", split_seed)
    summary = {
        "problems": len(problems), "bands": counts, "hard": len(hard_ids),
        "ungradable_golds": [p.id for p in zero if p.id in bad],
        "duplicate_questions": len(duplicates or []), "duplicate_ids": list(duplicates or []),
        "hard_train": len(train_ids), "hard_test": len(test_ids),
        "token_overflow_samples": sum(rows[p.id]["overflow"] for p in problems),
        "grading_errors": sum(rows[p.id].get("grading_errors", 0) for p in problems),
        "mixed_prob_group_mixed": {str(g): float(np.mean([prob_group_mixed(p, g) for p in mixed_rates]))
                                   if mixed_rates else None for g in f.mixed_group_sizes},
        "split": {"seed": split_seed, "test_frac": f.test_frac},
        "band_files": band_summary,
        "throughput_this_session": throughput, "provenance": provenance,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    log.info("fail@%d: %s; hard set %d (train %d / test %d)", f.k, counts, len(hard_ids), len(train_ids), len(test_ids))
    return summary


RECORD_FEATURES = {k: "string" for k in ("id", "question", "answer", "source", "meta", "provenance")}
"""The hard set's columns (``hard_train.jsonl``, ``hard_set/``): ``Problem.to_dict`` with ``meta`` and the
filter's provenance as JSON text."""
BAND_FEATURES = {**RECORD_FEATURES, "band": "string", "passes": "int64", "k": "int64", "pass_rate": "float64",
                 "group_size": "int64", "prob_group_mixed": "float64"}
"""A band file's columns: the hard set's, the problem's band, its passes of k, and the probability
that a group of ``group_size`` samples at its pass rate is mixed (``prob_group_mixed``)."""


def save_splits(splits: dict[str, list[dict]], columns: dict[str, str], path: Path) -> None:
    """``splits`` (name -> records) as a ``datasets`` DatasetDict saved to ``path``."""
    import datasets

    features = datasets.Features({c: datasets.Value(t) for c, t in columns.items()})
    # from_dict, not from_list: datasets 5.2 drops the features of an empty list (an empty split)
    with quiet_datasets():
        datasets.DatasetDict({k: datasets.Dataset.from_dict({c: [r[c] for r in v] for c in features}, features=features)
                              for k, v in splits.items()}).save_to_disk(str(path))


def heldout_ids(problems, per_source: int, seed: int, frac: float = 0.0) -> list[str]:
    """``per_source`` problems of each source (all of a smaller one), or with ``frac`` that fraction of each
    source (rounded), drawn as ``split_hard`` draws: sorted ids, a seeded permutation per
    source, so the draw depends on neither order nor bands."""
    by_source: dict[str, list[str]] = {}
    for p in problems:
        by_source.setdefault(p.source, []).append(p.id)
    out = []
    for src, ids in sorted(by_source.items()):
        n = int(round(frac * len(ids))) if frac else per_source
        asked = f"filter.heldout_frac={frac}" if frac else f"filter.heldout_per_source={per_source}"
        if len(ids) <= n:
            log.warning("source %r has %d problems, all held out (%s)", src, len(ids), asked)
        elif n == 0:  # a proportional draw that rounds to nothing: the source is never evaluated
            log.warning("source %r has %d problems, none held out (%s rounds to 0)", src, len(ids), asked)
        ordered = sorted(ids)
        perm = np.random.default_rng(derive_seed(seed, "heldout", src)).permutation(len(ordered))
        out += [ordered[i] for i in sorted(perm[:n])]
    return out


def write_bands(problems, rows: dict[str, dict], records, cfg, out: Path, split_seed: int) -> dict:
    """Every band's problems with their pass counts as ``<band>.jsonl`` (in pool order, the held-out ones
    left out), the held-out ones as ``heldout.jsonl``, the non-empty ones as splits of ``dataset/``; each row
    carries ``prob_group_mixed`` at G = ``student.group_size`` (the group ``soar-rl`` trains with).
    Returns the summary's ``band_files``."""
    k, group = cfg.filter.k, cfg.student.group_size
    f = cfg.filter
    held = set(heldout_ids(problems, f.heldout_per_source, split_seed, f.heldout_frac)) \
        if f.heldout_per_source or f.heldout_frac else set()
    splits: dict[str, list[dict]] = {name: [] for name in (*BANDS, "heldout")}
    for p, record in zip(problems, records([p.id for p in problems])):
        passes = rows[p.id]["passes"]
        name = band(passes, k)
        splits["heldout" if p.id in held else name].append(
            {**record, "band": name, "passes": passes, "k": k, "pass_rate": passes / k, "group_size": group,
             "prob_group_mixed": prob_group_mixed(passes / k, group)})
    out.mkdir(parents=True, exist_ok=True)
    for name, recs in splits.items():
        write_jsonl(out / f"{name}.jsonl", recs)
    # an empty split is left out: datasets 5.2 saves it but cannot load it back (IndexError in load_from_disk)
    save_splits({name: recs for name, recs in splits.items() if recs}, BAND_FEATURES, out / "dataset")
    heldout_by_source: dict[str, int] = {}
    for r in splits["heldout"]:
        heldout_by_source[r["source"]] = heldout_by_source.get(r["source"], 0) + 1
    return {"dir": str(out), "group_size": group, "heldout_per_source": f.heldout_per_source, "heldout_frac": f.heldout_frac,
            "heldout_by_source": heldout_by_source,
            **{name: {"problems": len(recs),
                      # mean P(mixed group at G); times the problems: the expected mixed groups if each is drawn once
                      "prob_group_mixed_mean": float(np.mean([r["prob_group_mixed"] for r in recs])) if recs else None}
               for name, recs in splits.items()}}


def load_band(bands_dir: str | Path, name: str, data_cfg) -> list[Problem]:
    """The problems of one band file (``name``: a band or ``heldout``) of a ``soar-filter`` run dir (or its
    ``bands/`` folder); [] for an empty band. Pass counts and P(mixed group) land in ``Problem.meta``."""
    folder = Path(bands_dir)
    path = folder / f"{name}.jsonl" if (folder / f"{name}.jsonl").exists() else folder / "bands" / f"{name}.jsonl"
    if not path.exists():
        raise DataError(f"{path}: no band file {name!r} (rl.bands must be a soar-filter run dir that wrote bands/)")
    return load_problem_records(data_cfg, path) if path.read_text().strip() else []


def filter_to_hard_set(cfg, problems, model, tokenizer, out_dir: Path, progress: bool = True) -> dict:
    """Check prompts fit the context, then fail@k with the configured backend and grader."""
    check_filter_prompts(cfg, problems, model, tokenizer)
    return run_filter(problems, make_generator(cfg, "filter", model, tokenizer, pristine=True),
                      make_grader(cfg.data.grader), cfg, out_dir, {"model": model_fingerprint(cfg.model)}, progress=progress)


def check_filter_prompts(cfg, problems, model, tokenizer) -> None:
    """Every problem's student prompt plus ``filter.max_tokens`` fits the model's context."""
    check_context(tokenizer, [render_prompt(cfg.data.prompt_template, p.question) for p in problems],
                  cfg.filter.max_tokens, model_context(model, cfg.model), "filter.max_tokens", [p.id for p in problems])


def filter_problems(cfg, run_path: Path) -> list[Problem]:
    """The pool of ``filter.pool``'s data configs (written to ``<run>/pool.jsonl``), else ``data.path``'s
    problems, else those ``data.build`` writes to ``<run>/problems`` (as ``soar-train`` does)."""
    if not cfg.filter.pool:
        return load_problems(cfg.data, cfg.data.path or str(build_pool_hook(cfg, run_path / "problems")))
    path = write_pool(run_path / "pool.jsonl", [load_problems(data_group(name)) for name in cfg.filter.pool])
    return load_problems(OmegaConf.merge(cfg.data, {"source_key": "source"}), str(path))


def run_filter_stage(cfg) -> dict:
    """The ``soar-filter`` stage: load model and questions and check them (before the run dir's provenance
    is written; a pool of several data configs or a built one is written there as it is read), run, write
    the hard set and the bands."""
    def read_questions(stage) -> list[Problem]:
        problems = filter_problems(cfg, stage.run.path)
        check_filter_prompts(cfg, problems, stage.model, stage.tokenizer)
        return problems

    stage = setup_stage(cfg, "filter", prepare=read_questions)
    try:
        summary = filter_to_hard_set(cfg, stage.prepared, stage.model, stage.tokenizer, stage.run.path,
                                     cfg.run.progress)
        shown = {k: summary[k] for k in ("problems", "bands", "hard", "hard_train", "hard_test", "duplicate_questions")}
        print(json.dumps({**shown, "ungradable_golds": len(summary["ungradable_golds"])}))
        return summary
    finally:
        stage.close()
