"""Question sources: one record schema for every file, folder or hub dataset.

    from soar.data import load_problems
    problems = load_problems(cfg.data)   # list[Problem]
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


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


def _read_rows(path: str, split: str):
    """Yield raw rows with ``datasets`` (JSONL/JSON/parquet files, save_to_disk folders, hub ids)."""
    import datasets

    p = Path(path).expanduser()
    if p.is_dir() and ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()):
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    elif p.is_file():
        builder = "parquet" if p.suffix == ".parquet" else "json"
        try:
            ds = datasets.load_dataset(builder, data_files=str(p), split="train")
        except Exception as exc:  # datasets wraps JSON decode errors; name the file
            raise DataError(f"{p}: cannot be read as {builder}: {exc}") from exc
    else:
        ds = datasets.load_dataset(path, split=split)  # hub id (needs network or a local cache)
    return ds


def _clean(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


def load_problems(data_cfg, path: str | None = None) -> list[Problem]:
    """Read ``path`` (default ``data_cfg.path``) into Problems; bad rows are reported and skipped or
    rejected per ``data_cfg.on_bad_row``."""
    path = path or data_cfg.path
    rows = _read_rows(path, data_cfg.split)
    problems, bad, seen = [], [], set()
    for index, row in enumerate(rows):
        question = _clean(row.get(data_cfg.problem_key))
        answer = _clean(row.get(data_cfg.answer_key))
        pid = _clean(row.get(data_cfg.id_key)) if data_cfg.id_key else None
        pid = pid or f"{data_cfg.name}/{index}"
        for key, value in ((data_cfg.problem_key, question), (data_cfg.answer_key, answer)):
            if value is None:
                bad.append(f"{path}: row {index}: field {key!r} is missing or empty")
                break
        else:
            if pid in seen:
                bad.append(f"{path}: row {index}: field {data_cfg.id_key!r} duplicates id {pid!r}")
            else:
                seen.add(pid)
                meta = {k: v for k, v in row.items() if k not in (data_cfg.problem_key, data_cfg.answer_key)}
                problems.append(Problem(pid, question, answer, data_cfg.name, _jsonable(meta)))
        if bad and data_cfg.on_bad_row == "error":
            raise DataError(bad[0] + " (set data.on_bad_row=skip to skip bad rows)")
        if data_cfg.limit and len(problems) >= data_cfg.limit:
            break
    for message in bad:
        log.warning("skipped bad row: %s", message)
    if not problems:
        raise DataError(f"{path}: no usable rows (keys {data_cfg.problem_key!r}/{data_cfg.answer_key!r})")
    return problems


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


def problems_hash(problems: list[Problem]) -> str:
    h = hashlib.sha256()
    for p in problems:
        h.update(f"{p.id}\x00{p.question}\x00{p.answer}\x01".encode())
    return h.hexdigest()[:16]
