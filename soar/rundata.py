"""Reading a ``soar-train`` run directory (and ``soar-export`` folders) for export, evaluation and
reports. A missing or corrupt file is a ``RunDataError`` naming it.

    from soar.rundata import read_run
    run = read_run("runs/arith")          # config, metrics, steps, promotions, PQ, config hash

A run may still be training: ``read_run`` reads a consistent snapshot, the newest finished checkpoint
(``RunData.step``): its ``state.json`` holds the PQ and promotions as of that step, the metrics are cut
there, and its ``teacher.pt`` is opened at once, so a checkpoint the run later prunes still loads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from omegaconf import OmegaConf

from soar.config import SoarConfig
from soar.console import plural
from soar.hydra_config import register_configs
from soar.run import CheckpointError, finished_checkpoints, load_checkpoint_state


class RunDataError(ValueError):
    """A run dir or export folder lacks a file, or a file cannot be parsed; the message names it."""


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise RunDataError(f"{path}: missing")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDataError(f"{path}: corrupt JSON ({exc})") from exc


def read_jsonl(path: Path, cut_last_line_ok: bool = False) -> list[dict]:
    """The rows of a JSONL file; ``cut_last_line_ok``: a last line cut mid-write (a file being appended
    to) is left out instead of refused."""
    if not path.is_file():
        raise RunDataError(f"{path}: missing")
    rows, lines = [], path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if cut_last_line_ok and i == len(lines):
                break
            raise RunDataError(f"{path}: line {i} is corrupt JSON ({exc})") from exc
    return rows


@dataclass
class RunData:
    path: Path
    config: Any
    """The run's resolved ``config.yaml`` over the current schema (an OmegaConf node)."""
    config_hash: str
    """sha256 (first 16 hex digits) of ``config.yaml``: the run's identity for provenance."""
    metrics: list[dict]
    promotions: list[dict]
    pq: list[dict]
    steps: list[dict] = field(default_factory=list)
    """The ``steps/step_N.json`` dumps, in step order (only with ``with_steps``)."""
    step: int | None = None
    """The outer step of the snapshot read (its newest finished checkpoint); None: a run without one,
    read from its ``pq.jsonl`` and ``promotions.jsonl``."""
    teacher_state: IO[bytes] | None = field(default=None, repr=False)
    """That checkpoint's ``teacher.pt``, opened when the snapshot was taken."""

    @property
    def run_id(self) -> str:
        return f"{self.path.name}-{self.config_hash[:8]}"

    def teacher_checkpoint(self, step: int | None) -> tuple[str, Path | None]:
        """(kind, path) of the teacher after outer step ``step``: ``base`` (step 0), ``hf``
        (``teacher/step_N``), ``state`` (``checkpoints/step_N/teacher.pt``). None: the snapshot's step."""
        if step is None:
            if self.step is None:
                raise RunDataError(f"{self.path / 'checkpoints'}: no finished checkpoint")
            step = self.step
        if step == 0:
            return "base", None
        hf = self.path / "teacher" / f"step_{step:06d}"
        if (hf / "config.json").is_file():
            return "hf", hf
        state = self.path / "checkpoints" / f"step_{step:06d}" / "teacher.pt"
        if step == self.step and self.teacher_state is not None:
            return "state", state
        if state.is_file():
            return "state", state
        raise RunDataError(f"{self.path}: no teacher for outer step {step} (neither {hf} nor {state}; "
                           "keep more with loop.keep_every=N)")


def config_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def load_run_config(path: Path):
    """A run's ``config.yaml`` merged over the schema (new sections get their defaults)."""
    register_configs()
    if not path.is_file():
        raise RunDataError(f"{path}: missing")
    try:
        raw = OmegaConf.load(path)
        return OmegaConf.merge(OmegaConf.structured(SoarConfig), raw)
    except Exception as exc:  # yaml / omegaconf validation errors
        raise RunDataError(f"{path}: corrupt config ({exc})") from exc


def read_run(run_dir: str | Path, with_steps: bool = False) -> RunData:
    """The run in ``run_dir`` as of its newest finished checkpoint (the module's docstring)."""
    path = Path(run_dir).expanduser().resolve()
    if not path.is_dir():
        raise RunDataError(f"{path}: not a run directory")
    cfg = load_run_config(path / "config.yaml")
    step, state, teacher = snapshot(path)
    metrics = read_jsonl(path / "metrics.jsonl", cut_last_line_ok=step is not None)
    if step is None:
        promotions, pq = read_jsonl(path / "promotions.jsonl"), read_jsonl(path / "pq.jsonl")
    else:
        metrics = [row for row in metrics if row.get("step", 0) <= step]
        promotions, pq = state.get("promotions", []), state.get("pq", [])
    steps = []
    if with_steps:
        for f in sorted((path / "steps").glob("step_*.json")):
            if step is None or int(f.stem.split("_")[1]) <= step:
                steps.append(read_json(f))
    return RunData(path, cfg, config_hash(path / "config.yaml"), metrics, promotions, pq, steps, step, teacher)


def snapshot(path: Path, attempts: int = 5) -> tuple[int | None, dict, IO[bytes] | None]:
    """(step, its ``state.json``, its ``teacher.pt`` opened) of the newest finished checkpoint of the run
    in ``path``; (None, {}, None) for a run without one. A checkpoint the run prunes while it is read
    (two newer ones were written) is replaced by the newest again."""
    for _ in range(attempts):
        done = finished_checkpoints(path / "checkpoints")
        if not done:
            return None, {}, None
        try:
            state = read_json(done[-1] / "state.json")
            teacher = open(done[-1] / "teacher.pt", "rb")
        except (FileNotFoundError, RunDataError):
            if done[-1].exists():  # not pruned: really unreadable
                raise
            continue
        return int(state.get("step", done[-1].name.split("_")[1])), state, teacher
    raise RunDataError(f"{path / 'checkpoints'}: every checkpoint read was removed meanwhile; try again")


def load_teacher_state(run: RunData, path: Path) -> dict:
    """The trainer state of the teacher checkpoint ``path`` (the snapshot's, as opened, when it is that
    one); a file that cannot be read is a ``RunDataError`` naming it."""
    source = run.teacher_state if run.step is not None and path == run.path / "checkpoints" / \
        f"step_{run.step:06d}" / "teacher.pt" and run.teacher_state is not None else path
    try:
        return load_checkpoint_state(source)
    except CheckpointError as exc:
        raise RunDataError(str(exc)) from None


def check_eligible(run: RunData, pq_cfg, what: str) -> bool:
    """Raise unless the run has ``pq.min_promotions`` promotions or ``pq.allow_ineligible`` is set;
    returns whether the run is eligible."""
    n = len(run.promotions)
    if n >= pq_cfg.min_promotions and run.pq:
        return True
    if pq_cfg.allow_ineligible:
        return False
    raise RunDataError(f"{run.path}: {plural(n, 'promotion')} (PQ has {plural(len(run.pq), 'question')}; pq.min_promotions="
                       f"{pq_cfg.min_promotions}): nothing to {what}. Set pq.allow_ineligible=true to "
                       f"{what} it anyway (0 promotions: an empty PQ).")
