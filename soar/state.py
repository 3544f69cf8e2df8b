"""What the outer loop carries from step to step, and its checkpoint format.

A checkpoint (``checkpoints/step_N/``, written to a temp folder then renamed) holds ``state.json``
(step counter, inner-loop length, promotion history and records, PQ, the baseline's hard-train
correctness) and ``teacher.pt`` (teacher weights, optimiser, scheduler). Promoted students are
saved in HF format under ``promoted/`` when promoted; the baseline is reloaded from the last one.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from soar.models import load_trainer_state


@dataclass
class LoopState:
    step: int = 0
    """Outer steps completed."""
    inner_steps: int = 10
    """Current inner-loop length K (grows per promotion, capped)."""
    baseline_version: int = 0
    """0: the base model; i: the i-th promoted student."""
    history: list[float] = field(default_factory=list)
    """Step rewards in the moving-average window (see ``soar.students.promotion``)."""
    promotions: list[dict] = field(default_factory=list)
    """One record per promotion: step, dataset, replicate, rewards, path, hard-split accuracies."""
    pq: list[dict] = field(default_factory=list)
    """Promotion Questions with provenance."""
    baseline_scores: dict[str, list[float]] = field(default_factory=dict)
    """The baseline's score on every hard-train problem per metric (``accuracy``: correctness; the
    reward's ``inner.reward_metric``), cached per baseline version."""

    def save(self, folder: Path, teacher_state: dict) -> None:
        (folder / "state.json").write_text(json.dumps(asdict(self)))
        torch.save(teacher_state, folder / "teacher.pt")

    @classmethod
    def load(cls, folder: Path) -> tuple["LoopState", dict]:
        for name in ("state.json", "teacher.pt"):
            if not (folder / name).exists():
                raise FileNotFoundError(f"checkpoint {folder} is missing {name}")
        fields = json.loads((folder / "state.json").read_text())
        if "baseline_correct" in fields:  # checkpoints written before reward metrics other than accuracy
            correct = fields.pop("baseline_correct")
            fields["baseline_scores"] = {} if correct is None else {"accuracy": correct}
        state = cls(**fields)
        return state, load_trainer_state(folder / "teacher.pt")


def save_model_atomic(trainer, folder: Path) -> None:
    """HF-format save (merged, plus the adapter with LoRA) into ``folder`` via a temp folder."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
