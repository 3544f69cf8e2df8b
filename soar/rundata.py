"""Reading a finished ``soar-train`` run directory (and ``soar-export`` folders) for export,
evaluation and reports. A missing or corrupt file is a ``RunDataError`` naming it.

    from soar.rundata import read_run
    run = read_run("runs/arith")          # config, metrics, steps, promotions, PQ, config hash
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from soar.config import SoarConfig
from soar.hydra_config import register_configs
from soar.run import plural


class RunDataError(ValueError):
    """A run dir or export folder lacks a file, or a file cannot be parsed; the message names it."""


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise RunDataError(f"{path}: missing")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDataError(f"{path}: corrupt JSON ({exc})") from exc


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise RunDataError(f"{path}: missing")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
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

    @property
    def run_id(self) -> str:
        return f"{self.path.name}-{self.config_hash[:8]}"

    def teacher_checkpoint(self, step: int | None) -> tuple[str, Path | None]:
        """(kind, path) of the teacher after outer step ``step``: ``base`` (step 0), ``hf``
        (``teacher/step_N``), ``state`` (``checkpoints/step_N/teacher.pt``). None: the last step."""
        done = sorted(p for p in (self.path / "checkpoints").glob("step_*") if (p / "DONE").exists())
        if step is None:
            if not done:
                raise RunDataError(f"{self.path / 'checkpoints'}: no finished checkpoint")
            step = int(done[-1].name.split("_")[1])
        if step == 0:
            return "base", None
        hf = self.path / "teacher" / f"step_{step:06d}"
        if (hf / "config.json").is_file():
            return "hf", hf
        state = self.path / "checkpoints" / f"step_{step:06d}" / "teacher.pt"
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
    path = Path(run_dir).expanduser().resolve()
    if not path.is_dir():
        raise RunDataError(f"{path}: not a run directory")
    cfg = load_run_config(path / "config.yaml")
    steps = []
    if with_steps:
        for f in sorted((path / "steps").glob("step_*.json")):
            steps.append(read_json(f))
    return RunData(path, cfg, config_hash(path / "config.yaml"), read_jsonl(path / "metrics.jsonl"),
                   read_jsonl(path / "promotions.jsonl"), read_jsonl(path / "pq.jsonl"), steps)


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
