"""What the outer loop carries from step to step, and its checkpoint format.

A checkpoint (``checkpoints/step_N/``, written to a temp folder then renamed) holds ``state.json``
(step counter, inner-loop length, promotion history and records, PQ, the baseline's hard-train
correctness, the hard set's hash) and ``teacher.pt`` (teacher weights, optimiser, scheduler; loaded as
weights only, ``soar.run.load_checkpoint_state``). Promoted students are
saved in HF format under ``promoted/`` when promoted; the baseline is reloaded from the last one.
``Checkpoints`` decides when one is due and writes it, with ``Background`` on a thread while the next
step runs (``loop.async_checkpoint``); it reads the teacher's live optimiser state, which nothing changes
until the next step's teacher update, and that waits for the write (``Checkpoints.wait``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from soar.data import write_jsonl
from soar.faults import maybe_die
from soar.run import CheckpointError, load_checkpoint_state


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
    hard_set_sha256: str | None = None
    """The hard set the run trains on (``soar.prepare.HardSet.sha256``), kept in every checkpoint, so a
    resume on another hard set is refused even without ``hard_set.json``."""

    def save(self, folder: Path, teacher_state: dict) -> None:
        (folder / "state.json").write_text(json.dumps(asdict(self)))
        torch.save(teacher_state, folder / "teacher.pt")

    @classmethod
    def load(cls, folder: Path) -> tuple["LoopState", dict]:
        for name in ("state.json", "teacher.pt"):
            if not (folder / name).exists():
                raise CheckpointError(f"checkpoint {folder} is missing {name}")
        try:
            fields = json.loads((folder / "state.json").read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{folder / 'state.json'}: not valid JSON ({exc})") from None
        if "baseline_correct" in fields:  # checkpoints written before reward metrics other than accuracy
            correct = fields.pop("baseline_correct")
            fields["baseline_scores"] = {} if correct is None else {"accuracy": correct}
        state = cls(**fields)
        return state, load_checkpoint_state(folder / "teacher.pt")


def save_model_atomic(trainer, folder: Path) -> None:
    """HF-format save (merged, plus the adapter with LoRA) into ``folder`` via a temp folder."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def on_cpu(obj):
    """``obj`` (nested dicts, lists and tuples of tensors and plain values) with every tensor on the
    CPU: moved off a GPU, CPU tensors as they are (no copy)."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.device.type == "cpu" else obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_cpu(v) for v in obj)
    return obj


class Background:
    """One job at a time, on a thread (``threaded``) or inline: ``submit`` first waits for the
    previous job, re-raising its error, so jobs finish in order and none is lost unseen."""

    def __init__(self, threaded: bool, name: str):
        self.threaded, self.name = threaded, name
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name) if threaded else None
        self._future = None

    def submit(self, fn, *args) -> None:
        self.wait()
        if self._executor is None:
            fn(*args)
        else:
            self._future = self._executor.submit(fn, *args)

    def wait(self) -> float:
        """Block until the submitted job is done (re-raising its error); returns the seconds waited."""
        t0 = time.perf_counter()
        future, self._future = self._future, None
        if future is not None:
            future.result()
        return time.perf_counter() - t0

    def close(self, raise_errors: bool = True) -> None:
        """Wait for the last job and stop the thread; ``raise_errors=False`` logs a failed job
        instead (when another error is already on its way up)."""
        try:
            self.wait()
        except Exception:
            if raise_errors:
                raise
            logging.getLogger("soar").exception("%s: the last background job failed as well", self.name)
        finally:
            if self._executor is not None:
                self._executor.shutdown()


class Checkpoints:
    """The outer loop's checkpoints (``LoopState`` and the teacher's state) and the teacher kept in HF
    format every ``loop.keep_every`` steps, written in step order."""

    def __init__(self, cfg, run, teacher, step: int):
        self.cfg, self.run, self.teacher = cfg, run, teacher  # teacher: its RLOOTrainer
        self.writer = Background(cfg.loop.async_checkpoint, "soar-checkpoint")
        self.written = self.teacher_kept = step  # the last step checkpointed / kept

    def wait(self) -> float:
        """Block until the last checkpoint is written (re-raising its error); the seconds waited."""
        return self.writer.wait()

    def after_step(self, st: LoopState, force: bool = False) -> None:
        """Checkpoint the state after ``st.step`` outer steps when one is due: every
        ``loop.checkpoint_every`` steps, after the last step, or ``force`` (a stop request; nothing
        when this step's checkpoint is already written). With ``loop.async_checkpoint`` it is written
        on a thread while the next step samples and trains its students; that step waits for it
        (``time/checkpoint_wait_s``) before it writes a file or changes the teacher, so files land in
        step order, the write reads the teacher as it was at this step's end, and a write error stops
        the run one step later at most."""
        self.keep_teacher(st.step)
        if self.written == st.step or not (force or st.step % self.cfg.loop.checkpoint_every == 0
                                           or st.step >= self.cfg.loop.steps):
            return
        teacher_state = self.teacher.state_dict()
        if self.writer.threaded:
            # No copy of the optimiser's live moments (the paper's teacher: ~13 GB in fp32): the teacher
            # changes only in its update, and the next step waits for this write before it
            # (checkpoint_wait). Its weights, cloned by state_dict, leave the driver's GPU meanwhile.
            teacher_state["trainable"] = on_cpu(teacher_state["trainable"])
        self.writer.submit(self.write, copy.deepcopy(st), teacher_state)
        self.written = st.step

    def write(self, st: LoopState, teacher_state: dict) -> None:
        with self.run.checkpoint(st.step, keep_last=self.cfg.loop.keep_last) as ckpt:
            st.save(ckpt, teacher_state)
            maybe_die("checkpoint", st.step - 1)
        write_jsonl(self.run.path / "pq.jsonl", st.pq)
        write_jsonl(self.run.path / "promotions.jsonl", st.promotions)

    def keep_teacher(self, step: int) -> None:
        """``loop.keep_every``: the teacher in HF format under ``teacher/step_N`` (from the live model)."""
        every = self.cfg.loop.keep_every
        if every and step % every == 0 and self.teacher_kept != step:
            self.teacher_kept = step
            self.writer.wait()  # files land in step order
            (self.run.path / "teacher").mkdir(exist_ok=True)
            save_model_atomic(self.teacher, self.run.path / "teacher" / f"step_{step:06d}")

    def close(self, raise_errors: bool = True) -> None:
        self.writer.close(raise_errors)
