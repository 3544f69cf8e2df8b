"""What a run writes as it goes: one ``metrics.jsonl`` row per step, always, in its run directory
(``soar.run.RunDir``), and by ``run.loggers`` the console, wandb and tensorboard; ``read_metrics`` reads the
rows back. A resume drops the rows after its checkpoint (they are recomputed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

from soar.run import RunDir, atomic_write_text

log = logging.getLogger("soar")


class MetricsLogger:
    """``metrics.jsonl`` always; console, wandb and tensorboard by ``run.loggers``. On the console a
    step is ``console_line(step, metrics)`` where one is given (the outer loop's ``outer_step_line``),
    with every metric at DEBUG level (``--verbose`` shows them); without one, every metric at INFO."""

    def __init__(self, run: RunDir, resume_step: int | None = None, console_line=None):
        self.path = run.path / "metrics.jsonl"
        self.console_line = console_line
        self.sinks = list(dict.fromkeys(["jsonl", *run.cfg.run.loggers]))
        self._truncate(resume_step)
        self._fh = open(self.path, "a")
        self._wandb = self._tb = None
        if "wandb" in self.sinks:
            import wandb

            self._wandb = wandb.init(project="soar", name=run.cfg.run.name, dir=str(run.path),
                                     resume="allow", id=wandb_run_id(run.path, run.cfg.run.name))
        if "tensorboard" in self.sinks:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run.path / "tensorboard"))

    def _truncate(self, resume_step: int | None) -> None:
        """Drop rows written after the checkpoint we resume from (they will be recomputed)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if resume_step is not None and row.get("step", 0) <= resume_step:
                kept.append(line)
        atomic_write_text(self.path, "".join(k + "\n" for k in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            if isinstance(value, float) and not math.isfinite(value) and not key.startswith("eval/"):
                log.warning("non-finite metric %s=%s at step %d", key, value, step)
        row = {"step": step, **metrics}
        self._fh.write(json.dumps(row, default=float) + "\n")
        self._fh.flush()
        if "console" in self.sinks:
            level = logging.INFO if self.console_line is None else logging.DEBUG
            if log.isEnabledFor(level):
                shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in metrics.items() if not k.startswith("time/"))
                log.log(level, "step %d %s", step, shown)
            if self.console_line is not None:
                log.info("%s", self.console_line(step, metrics))
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._fh.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


def wandb_run_id(run_path: Path, name: str) -> str:
    """The W&B id of the run in ``run_path``: its name and a digest of its folder and its ``meta.json``
    (written once, when the run began), so a resume continues the run's own W&B run (``resume="allow"``)
    and another run of the same name (another folder, even begun in the same second with the same
    settings, or this one deleted and begun again) gets its own."""
    where = str(Path(run_path).resolve()).encode() + b"\0"
    digest = hashlib.sha256(where + (Path(run_path) / "meta.json").read_bytes()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', str(name))[:48]}-{digest}"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
