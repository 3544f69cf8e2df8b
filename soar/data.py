"""Question sources: one record schema for every file, folder or hub dataset.

    from soar.data import load_problems
    problems = load_problems(cfg.data)   # list[Problem]
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import logging
import os
import re
import stat
import string
import tempfile
import unicodedata
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from soar.config import DataConfig

log = logging.getLogger(__name__)


def shared_data_dir() -> Path:
    """The benchmark files' folder, read in place: ``$SOAR_DATA_DIR``, else ``<repo>/../shared/data``.
    The benchmark data configs name it as ``${soar_data_dir:}``."""
    return Path(os.environ.get("SOAR_DATA_DIR") or Path(__file__).resolve().parents[1].parent / "shared" / "data")


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def render_prompt(template: str, question: str) -> str:
    """Fill a prompt template's ``{question}`` slot."""
    # str.replace, not str.format: the paper's template contains literal braces (\boxed{}).
    return template.replace("{question}", question)


class DataError(ValueError):
    """Bad input; the message names the file, row and field."""


@contextmanager
def quiet_datasets():
    """``datasets``' progress bars ("Generating train split", "Saving the dataset") off while soar reads
    or writes its own files: they would sit among soar's lines, and print frames into a redirected log.
    ``datasets.disable_progress_bars``, restored afterwards; where the bars are already off, or
    ``HF_DATASETS_DISABLE_PROGRESS_BARS`` decides them, nothing changes."""
    import datasets

    if datasets.utils.are_progress_bars_disabled() or "HF_DATASETS_DISABLE_PROGRESS_BARS" in os.environ:
        yield
        return
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.enable_progress_bars()


def _builder(name: str) -> str:
    """``datasets`` builder for a file name: parquet, else json (JSONL/JSON, also ``.gz``)."""
    return "parquet" if name.endswith(".parquet") else "json"


def _read_rows(path: str, split: str, member: str | None, bad_rows: dict[int, str]):
    """Yield raw rows with ``datasets.load_dataset`` (JSONL/JSON/parquet files, optionally gzipped;
    ``member`` of a zip archive, streamed in place; save_to_disk folders; hub ids). Lines of a JSON
    Lines file that are not JSON objects are left out and described in ``bad_rows`` by row index."""
    import datasets

    p = Path(path).expanduser()
    if member:
        _check_zip_member(p, member)
        # An fsspec chained URL, streamed: nothing is extracted to disk (HARP must stay zipped).
        return datasets.load_dataset(_builder(member), data_files=f"zip://{member}::{p.resolve()}",
                                     split="train", streaming=True)
    if p.is_dir() and ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()):
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
        return ds
    if p.is_dir():
        return _read_folder(p, split)
    if not p.is_file():
        return datasets.load_dataset(path, split=split)  # hub id (needs network or a local cache)
    builder = _builder(p.name)
    if p.name.endswith(".zip"):
        if not zipfile.is_zipfile(p):
            raise DataError(f"{p}: not a readable zip archive (truncated or corrupt?); fetch it again")
    elif builder == "json":
        text = _json_text(p)
        found = _bad_json_lines(text)
        if found:
            bad_rows.update(found)
            return _load_json_lines([line for line in text.splitlines() if line.strip()], found)
    try:
        return datasets.load_dataset(builder, data_files=str(p), split="train")
    except Exception as exc:  # datasets wraps JSON decode errors; name the file and the reason
        raise DataError(f"{p}: cannot be read as {builder}: {_reason(exc)}") from exc


def _read_folder(p: Path, split: str):
    """A local folder that is not a ``save_to_disk`` dataset: ``datasets`` reads a folder of data files
    as one table when it can (files of one format and the same columns); otherwise it is refused in one
    line naming the folder, its files and the reason (``datasets`` raised a 100-line traceback)."""
    import datasets

    files = sorted(f.name for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
    try:
        return datasets.load_dataset(str(p), split=split)
    except Exception as exc:
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        raise DataError(f"data.path: {p} is a folder of {len(files)} files ({shown or 'none'}) that cannot be read as "
                        f"one dataset: {_reason(exc)}; give one file as data.path (its bad rows are then named and "
                        "follow data.on_bad_row), or make the files' columns agree") from None


def _check_zip_member(p: Path, member: str) -> None:
    """The archive opens, holds ``member``, and the member decompresses with a matching CRC (checked
    once up front: a streamed read would fail mid-file with zipfile's bare ``Bad CRC-32``)."""
    try:
        with zipfile.ZipFile(p) as archive:
            if member not in archive.namelist():
                raise DataError(f"{p}: no member {member!r} (members: {archive.namelist()[:10]})")
            with archive.open(member) as fh:
                while fh.read(1 << 20):
                    pass
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise DataError(f"{p} [{member}]: corrupt zip archive ({exc}); fetch it again") from None


def _json_text(p: Path) -> str:
    try:
        # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first row
        with (gzip.open(p, "rt", encoding="utf-8-sig") if p.name.endswith(".gz") else open(p, encoding="utf-8-sig")) as fh:
            text = fh.read()
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as exc:
        raise DataError(f"{p}: cannot be read as UTF-8 JSON text ({exc})") from None
    if not text.strip():
        raise DataError(f"{p}: empty file (no rows)")
    return text


def _bad_json_lines(text: str) -> dict[int, str]:
    """``{row index: why}`` for the lines of a JSON Lines text that are not JSON objects (blank
    lines are not rows); {} for a single JSON document, which ``datasets`` reads whole."""
    try:
        json.loads(text)
        return {}
    except json.JSONDecodeError:
        pass
    bad = {}
    rows = (line for line in text.splitlines() if line.strip())
    for index, line in enumerate(rows):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            bad[index] = f"not valid JSON ({exc.msg} at column {exc.colno})"
            continue
        if not isinstance(value, dict):
            bad[index] = f"a JSON {type(value).__name__}, not an object"
    return bad


def _load_json_lines(lines: list[str], bad: dict[int, str]):
    """The good rows of a JSON Lines file, read by ``datasets`` exactly as a clean file would be."""
    import datasets

    if len(bad) == len(lines):
        return []
    with tempfile.TemporaryDirectory(prefix="soar-rows-") as tmp:
        good = Path(tmp) / "rows.jsonl"
        good.write_text("".join(line + "\n" for i, line in enumerate(lines) if i not in bad))
        return datasets.load_dataset("json", data_files=str(good), split="train", cache_dir=tmp, keep_in_memory=True)


def _reason(exc: BaseException) -> str:
    """An exception and its cause as one line (``datasets`` hides the reason in the cause)."""
    parts = [f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
             for e in (exc, exc.__cause__ or exc.__context__) if e is not None]
    return " ".join("; caused by ".join(parts).split())


class _BadValue(ValueError):
    """A bad field of one row; the message names the field."""


def _clean(value: Any) -> str | None:
    """A field as stripped text: integral floats lose ``.0`` (AMC's ``27.0`` -> ``27``), a
    one-element list is its element (OlympiadBench's ``final_answer``); empty -> None."""
    if isinstance(value, (list, tuple)):
        if len(value) > 1:
            raise _BadValue(f"holds {len(value)} values (expected one)")
        value = value[0] if value else None
    if isinstance(value, dict):  # its Python repr is no question
        raise _BadValue("is a JSON object (expected text or a number)")
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


UNSAFE_CHARACTERS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""Characters no question or answer may hold, in data rows as in teacher output
(``soar.teachers.parse``): C0 controls but tab, newline and carriage return; DEL; the bidirectional
embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069: they make the text read
differently from what it is); lone surrogates. They break tokenizers, JSON consumers and parquet.
None occurs in the seven benchmark files."""


def unsafe_character(text: str) -> str | None:
    """The first character of ``text`` that ``UNSAFE_CHARACTERS`` refuses, as ``U+XXXX at position i``."""
    found = UNSAFE_CHARACTERS.search(text)
    return None if found is None else f"U+{ord(found.group()):04X} at position {found.start()}"


_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")

ANSWER_NORMALIZERS: dict[str, Callable[[str], str]] = {
    # HARP's "$10\frac{2}{3}$", OlympiadBench's "$69$,$84$"; an escaped "\$" (currency) stays.
    "strip_dollars": lambda s: _UNESCAPED_DOLLAR.sub("", s).strip(),
}
"""Named gold-answer normalisations for ``data.answer_normalizers``."""


def load_problems(data_cfg, path: str | None = None) -> list[Problem]:
    """Read ``path`` (default ``data_cfg.path``) into Problems with ``data_cfg``'s column mapping, id
    rule, exclusions and answer normalisation; bad rows are reported with file, row and field and
    skipped or rejected per ``data_cfg.on_bad_row``."""
    path = path or data_cfg.path
    _check_file_kind(Path(path).expanduser())
    member = data_cfg.member if data_cfg.member and zipfile.is_zipfile(Path(path).expanduser()) else None
    where = f"{path} [{member}]" if member else str(path)
    unknown = [n for n in data_cfg.answer_normalizers or () if n not in ANSWER_NORMALIZERS]
    if unknown:
        raise DataError(f"data.answer_normalizers: unknown {unknown} (known: {', '.join(ANSWER_NORMALIZERS)})")
    excluded = {str(i) for i in data_cfg.exclude_ids or ()}
    problems, bad, seen, dropped, unreadable = [], [], set(), set(), {}
    with quiet_datasets():
        rows = _read_rows(path, data_cfg.split, member, unreadable)
    for index, message in unreadable.items():  # rows that are not JSON objects follow data.on_bad_row too
        bad.append(f"{where}: row {index}: {message}")
        if data_cfg.on_bad_row == "error":
            raise DataError(bad[0] + " (set data.on_bad_row=skip to skip bad rows)")
    indices = (i for i in itertools.count() if i not in unreadable)  # row numbers as in the file
    for index, row in zip(indices, rows):
        try:
            pid = _row_id(data_cfg, row)
            if pid in excluded:
                dropped.add(pid)
                continue
            problem = _row_problem(data_cfg, row, pid or f"{data_cfg.name}/{index}")
            if problem.id in seen:
                raise _BadValue(f"field {data_cfg.id_template or data_cfg.id_key!r} duplicates id {problem.id!r}")
            seen.add(problem.id)
            problems.append(problem)
        except _BadValue as exc:
            bad.append(f"{where}: row {index}: {exc}")
            if data_cfg.on_bad_row == "error":
                raise DataError(bad[0] + " (set data.on_bad_row=skip to skip bad rows)") from None
        if data_cfg.limit and len(problems) >= data_cfg.limit:
            break
    for message in bad:
        log.warning("skipped bad row: %s", message)
    if excluded - dropped and not data_cfg.limit:
        log.warning("%s: data.exclude_ids %s never occurred", where, sorted(excluded - dropped))
    if not problems:
        first_bad = f"; {len(bad)} bad rows, the first: {bad[0]}" if bad else ""
        raise DataError(f"{where}: no usable rows (keys {data_cfg.problem_key!r}/{data_cfg.answer_key!r}){first_bad}")
    return problems


def _check_file_kind(p: Path) -> None:
    """A path that exists is a file or a folder: a device (``/dev/null``), a FIFO (opening one would
    wait for a writer forever) or a socket is refused, naming it; an absent path is a hub id."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")
    raise DataError(f"{p}: {kind}, not a data file; give a JSONL, JSON or parquet file, a dataset folder or a hub id")


def _row_id(data_cfg, row: dict) -> str | None:
    """``data.id_template`` filled from the row, else the ``data.id_key`` column (None: no id)."""
    if data_cfg.id_template:
        names = [name for _, name, _, _ in string.Formatter().parse(data_cfg.id_template) if name]
        missing = [name for name in names if _clean(row.get(name)) is None]
        if missing:
            raise _BadValue(f"field {missing[0]!r} (in data.id_template) is missing or empty")
        return data_cfg.id_template.format(**row)
    return _clean(row.get(data_cfg.id_key)) if data_cfg.id_key else None


def _row_problem(data_cfg, row: dict, pid: str) -> Problem:
    """One row as a Problem; raises ``_BadValue`` naming the field."""
    values = []
    for key in (data_cfg.problem_key, data_cfg.answer_key):
        try:
            value = _clean(row.get(key))
        except _BadValue as exc:
            raise _BadValue(f"field {key!r} {exc} (id {pid!r})") from None
        if value and key == data_cfg.answer_key:
            for name in data_cfg.answer_normalizers or ():
                value = ANSWER_NORMALIZERS[name](value) or None
        if value is None:
            raise _BadValue(f"field {key!r} is missing or empty (id {pid!r})")
        bad = unsafe_character(value)
        if bad:
            raise _BadValue(f"field {key!r} holds a control or bidirectional-override character ({bad}; id {pid!r})")
        values.append(value)
    source = data_cfg.name
    if data_cfg.source_key:
        source = _clean(row.get(data_cfg.source_key))
        if source is None:
            raise _BadValue(f"field {data_cfg.source_key!r} (data.source_key) is missing or empty (id {pid!r})")
    return Problem(pid, values[0], values[1], source, _jsonable(_meta(data_cfg, row)))


def _meta(data_cfg, row: dict) -> dict[str, Any]:
    """``data.meta_columns`` ({meta name: column}) of the row, else every column but question/answer."""
    if data_cfg.meta_columns is not None:
        unknown = [column for column in data_cfg.meta_columns.values() if column not in row]
        if unknown:  # datasets gives every row every column: this is a typo, not a bad row
            raise DataError(f"data.meta_columns: no column {unknown[0]!r} (columns: {sorted(row)})")
        return {name: row[column] for name, column in data_cfg.meta_columns.items()}
    return {k: v for k, v in row.items() if k not in (data_cfg.problem_key, data_cfg.answer_key)}


def load_problem_records(data_cfg, path: str | Path) -> list[Problem]:
    """Read a file in soar's own record schema (``id``, ``question``, ``answer``; optional ``source``
    and ``meta``, a dict or its JSON, as in ``hard_train.jsonl``) whatever ``data_cfg``'s column
    mapping; ``data_cfg.on_bad_row`` applies. Other columns (e.g. ``split``) land in ``meta``."""
    schema = DataConfig(name=Path(path).stem, path=str(path), on_bad_row=data_cfg.on_bad_row)
    out = []
    for p in load_problems(schema, str(path)):
        meta = dict(p.meta)
        inner = meta.pop("meta", None)
        inner = json.loads(inner) if isinstance(inner, str) and inner else inner or {}
        out.append(Problem(p.id, p.question, p.answer, meta.pop("source", None) or p.source, {**inner, **meta}))
    return out


def write_pool(path: str | Path, sources: list[list[Problem]]) -> Path:
    """Several sources' problems (each list from ``load_problems`` of one data config, e.g. aime24,
    amc23, olympiadbench) as one pool file in soar's record schema, ids prefixed with their source so
    they never collide; read it with ``data.path=<path> data.source_key=source``."""
    rows = [{**p.to_dict(), "id": f"{p.source}/{p.id}"} for problems in sources for p in problems]
    write_jsonl(path, rows)
    return Path(path)


def _jsonable(meta: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(meta, default=str))


def write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Write records atomically (temp file, then rename)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    tmp.replace(path)


def text_key(text: str) -> str:
    """A question's text as questions are compared: Unicode NFKC, case-folded, without whitespace, so
    ``What is 1 + 1?`` and ``what is 1+1 ?`` are one question (under any ids)."""
    return "".join(unicodedata.normalize("NFKC", text).casefold().split())


def dedupe_questions(problems: list[Problem], where: str) -> tuple[list[Problem], list[str]]:
    """``problems`` with each question (``text_key``) once, the first row of it kept, and the ids of the
    rows left out (logged with ``where``, the file or split they came from; a copy whose answer differs
    from the kept row's is named apart)."""
    kept: dict[str, Problem] = {}
    dropped, conflicting = [], []
    for p in problems:
        first = kept.setdefault(text_key(p.question), p)
        if first is not p:
            dropped.append(p.id)
            if text_key(first.answer) != text_key(p.answer):
                conflicting.append(f"{p.id} (answer {p.answer!r}; {first.id}: {first.answer!r})")
    if dropped:
        log.warning("%s: %d rows repeat an earlier row's question and are left out (%s%s)%s", where, len(dropped),
                    ", ".join(dropped[:5]), ", ..." if len(dropped) > 5 else "",
                    f"; {len(conflicting)} of them with another answer: {', '.join(conflicting[:3])}" if conflicting else "")
    return list(kept.values()), dropped


def problems_hash(problems: list[Problem]) -> str:
    h = hashlib.sha256()
    for p in problems:
        h.update(f"{p.id}\x00{p.question}\x00{p.answer}\x01".encode())
    return h.hexdigest()[:16]
