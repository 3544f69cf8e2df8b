"""Pack a finished confirmation run into a compact, gzipped record that the analysis reads alone.

    python dev/confirm/pack.py RUN_DIR dev/confirm/raw/grounded_s6 --hard-set dev/confirm/hard_set

Writes ``metrics.jsonl.gz``, ``promotions.jsonl``, ``pq.jsonl.gz``, ``config.yaml`` (the resolved config),
``meta.json`` (argv, git SHA, package versions), ``summary.json``, ``provenance.json`` (platform and the
hard set's SHA-256) and the last third's teacher step dumps (``steps/step_N.json.gz``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import platform
import shutil
from pathlib import Path


def hard_set_hash(hard_set: Path) -> str:
    """SHA-256 over the hard set's train and test files, in that order."""
    digest = hashlib.sha256()
    for name in ("hard_train.jsonl", "hard_test.jsonl"):
        digest.update((Path(hard_set) / name).read_bytes())
    return digest.hexdigest()


def gzip_copy(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin, gzip.GzipFile(dst, "wb", mtime=0) as fout:
        shutil.copyfileobj(fin, fout)


def pack(run_dir: Path, dest: Path, hard_set: Path) -> Path:
    run_dir, dest = Path(run_dir), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    gzip_copy(run_dir / "metrics.jsonl", dest / "metrics.jsonl.gz")
    gzip_copy(run_dir / "pq.jsonl", dest / "pq.jsonl.gz")
    for name in ("promotions.jsonl", "config.yaml", "meta.json", "summary.json"):
        shutil.copyfile(run_dir / name, dest / name)
    steps = sorted((run_dir / "steps").glob("step_*.json"))
    (dest / "steps").mkdir(exist_ok=True)
    for path in steps[len(steps) - len(steps) // 3:]:  # the last third, as the analysis reads it
        gzip_copy(path, dest / "steps" / f"{path.name}.gz")
    (dest / "provenance.json").write_text(json.dumps({
        "platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
        "hard_set_sha256": hard_set_hash(hard_set)}, indent=1))
    return dest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("dest")
    ap.add_argument("--hard-set", default=str(Path(__file__).resolve().parent / "hard_set"))
    args = ap.parse_args()
    print(pack(Path(args.run_dir), Path(args.dest), Path(args.hard_set)))


if __name__ == "__main__":
    main()
