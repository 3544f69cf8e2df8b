"""What the pre-registered studies of dev/studies/ share: their protocol, the frozen code's commands,
packing a finished run into gzipped raw data, and the seed-as-unit summary their analyses print.

A study folder holds ``PROTOCOL.md`` (the registration), ``protocol.json`` (its machine-readable form, with
a ``toy`` section: the same pipeline at a size of seconds, which proves it end to end and is never data),
``run.py`` (resumable: every step is skipped when its output exists) and ``analyze.py`` (reads only the
packed raw data and refuses to report before every registered run is packed).
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path


def load_protocol(folder: Path, toy: bool = False) -> dict:
    """``protocol.json``; with ``toy``, its ``toy`` section laid over it (a smoke test's sizes, never data)."""
    proto = json.loads((folder / "protocol.json").read_text())
    return deep_merge(proto, proto.get("toy", {})) if toy else proto


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def check_frozen(folder: Path, code: Path) -> str:
    """The frozen commit (``<folder>/FROZEN_COMMIT``) that ``code`` must be checked out at; a study run from
    other code, or before the commit is recorded, is refused."""
    frozen = folder / "FROZEN_COMMIT"
    if not frozen.exists():
        raise SystemExit(f"{frozen}: missing. Record the main commit that registered this study there first "
                         "(PROTOCOL.md), or run --toy")
    want = frozen.read_text().strip()
    head = subprocess.run(["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head != want:
        raise SystemExit(f"--code {code} is at {head or 'no git commit'}, not the frozen commit {want} ({frozen})")
    return want


def seeds(proto: dict, folder: Path) -> list[int]:
    """The registered seeds, each one that ``replaced.json`` records as unrecoverable (``{"seed": "why"}``)
    replaced by the next unused replacement seed, in order (as dev/confirm does)."""
    replaced_path = folder / "replaced.json"
    replaced = json.loads(replaced_path.read_text()) if replaced_path.exists() else {}
    spare = iter(s for s in proto.get("replacement_seeds", []) if str(s) not in replaced)
    return [s if str(s) not in replaced else next(spare) for s in proto["seeds"]]


class Commands:
    """The frozen code's console scripts and study scripts, each with one torch thread
    (``OMP_NUM_THREADS=1``), from ``code`` (``PYTHONPATH``), logged to its ``log``; its wall time is appended
    to ``timings`` (JSONL: the cost estimates); a failure stops the study, naming the log."""

    def __init__(self, code: Path, timings: Path):
        self.code, self.timings = Path(code).resolve(), Path(timings)
        self.env = {**os.environ, "PYTHONPATH": str(self.code), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
                    "TOKENIZERS_PARALLELISM": "false"}

    def soar(self, command: str, args: list[str], log: Path) -> float:
        return self.run([str(Path(sys.executable).parent / command), *args], log)

    def script(self, path: str, args: list[str], log: Path) -> float:
        return self.run([sys.executable, str(self.code / path), *args], log)

    def run(self, args: list[str], log: Path) -> float:
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(args)}\n")
            fh.flush()
            res = subprocess.run(args, env=self.env, cwd=self.code, stdout=fh, stderr=subprocess.STDOUT)
        if res.returncode:
            raise SystemExit(f"{args[0]} failed ({res.returncode}): see {log}")
        seconds = time.perf_counter() - t0
        with open(self.timings, "a") as fh:
            fh.write(json.dumps({"log": str(log), "command": Path(args[1] if args[0] == sys.executable else args[0]).name,
                                 "seconds": round(seconds, 2)}) + "\n")
        return seconds


def gzip_copy(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin, gzip.GzipFile(dst, "wb", mtime=0) as fout:
        shutil.copyfileobj(fin, fout)


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def pack_run(run_dir: Path, dest: Path, extra: dict[str, Path] | None = None) -> Path:
    """A finished ``soar-*`` run as raw data: ``metrics.jsonl.gz`` (if any), ``config.yaml``, ``meta.json``,
    ``summary.json``, the files of ``extra`` (name -> path; ``.jsonl`` ones gzipped) and ``provenance.json``
    (the platform). ``summary.json`` is written last: its presence marks a complete pack."""
    run_dir, dest = Path(run_dir), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if (run_dir / "metrics.jsonl").exists():
        gzip_copy(run_dir / "metrics.jsonl", dest / "metrics.jsonl.gz")
    for name in ("config.yaml", "meta.json"):
        shutil.copyfile(run_dir / name, dest / name)
    for name, path in (extra or {}).items():
        if name.endswith(".gz"):
            gzip_copy(path, dest / name)
        else:
            shutil.copyfile(path, dest / name)
    (dest / "provenance.json").write_text(json.dumps({"platform": platform.platform(), "machine": platform.machine(),
                                                      "processor": platform.processor()}, indent=1))
    shutil.copyfile(run_dir / "summary.json", dest / "summary.json")
    return dest


def packed(dest: Path) -> bool:
    return (Path(dest) / "summary.json").exists()


def holm(pvalues: dict[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment of a family of p values (None stays None)."""
    known = sorted((p, k) for k, p in pvalues.items() if p is not None)
    out, running = dict.fromkeys(pvalues), 0.0
    for i, (p, k) in enumerate(known):
        running = max(running, min(1.0, (len(known) - i) * p))
        out[k] = running
    return out
