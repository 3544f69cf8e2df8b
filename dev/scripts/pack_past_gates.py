"""Pack the raw data of the gates run before the issue-50 confirmation, from the run-folder tarballs
(``/work/gate_state/*.tar.gz``, read only), into ``dev/results/raw/<gate>/``: per run the
``metrics.jsonl``, ``promotions.jsonl``, ``pq.jsonl`` and resolved ``config.yaml``, gzipped; per gate
its hard set (``hard_set/hard_{train,test}.jsonl.gz``, ``summary.json.gz``); and each fresh student's
``eval.json`` with its gate's ``compare_methods.json`` (``fresh/``). No checkpoints, models or step dumps.

    python dev/scripts/pack_past_gates.py --tarballs /work/gate_state --out dev/results/raw

``dev/scripts/recompute_gates.py`` rebuilds issue 50's figures from what this writes. Which tarball holds
which gate comes from dev/LOG.md and each folder's ``gate.json`` (name, overrides, hard set): ``GATES``.
Where a gate's folder is in two tarballs, the later, complete one is packed. Not packed: seed 6 of the
first confirmation attempt (``gates_2026-12-06_confirm_s678``: 3 steps under the previous code, which
dev/confirm/PROTOCOL.md names as never analysed), the ``diag``/``paired`` folders (their results are
committed as ``dev/results/after_promotion_*.json``) and the 10-step GPU snapshot of the fresh seeds
(``gates_2026-12-04_night/tau02_fresh``, superseded by the 40-step runs).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

GATES = {
    # gate (dev/results/world_gate_<gate>.json where one exists): (tarball, folder in it)
    "arith_g16_kl0.001_s12": ("gates_2026-12-03_evening", "lora"),
    "arith_g16_kl0.001_slr5e-5_s0_80steps": ("gates_2026-12-03_evening", "slr5"),
    "arith_g16_kl0.001_lorastudent_pilot": ("gates_2026-12-03_evening", "slora"),
    "arith_g16_kl0.001_tau0.01": ("gates_2026-12-03_night_tau01", "tau01"),
    "arith_g16_kl0.001_tau0.01_slr3e-5": ("gates_2026-12-04_slr3_complete", "slr3"),
    "arith_g16_kl0.001_tau0.02_slr3e-5": ("gates_2026-12-04_night", "tau02d"),
    "arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345": ("gates_2026-12-05", "tau02_fresh"),
    "arith_r2": ("gates_2026-12-06_r2", "r2_s3"),
    "arith_horizon200": ("gates_2026-12-06_horizon", "horizon"),
}
FRESH = {
    # gate: (tarball, compare_methods.py output folder) of its fresh students
    "arith_g16_kl0.001_tau0.01_slr3e-5": ("gates_2026-12-04_slr3_complete", "methods_slr3"),
    "arith_g16_kl0.001_tau0.02_slr3e-5": ("gates_2026-12-04_night", "methods_tau02"),
    "arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345": ("gates_2026-12-05", "methods_fresh"),
    "arith_horizon200": ("methods_horizon_2026-12-06", "methods_horizon"),
}
RUN_FILES = ("metrics.jsonl", "promotions.jsonl", "pq.jsonl", "config.yaml")
HARD_SET_FILES = ("hard_train.jsonl", "hard_test.jsonl", "summary.json")


def write_gz(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path.with_name(path.name + ".gz"), "wb", mtime=0) as fh:  # mtime 0: reproducible bytes
        fh.write(data)


def members(tarball: Path, wanted) -> dict[str, bytes]:
    """The files of ``tarball`` whose names ``wanted`` accepts, by name (one pass over the gzip stream)."""
    out = {}
    with tarfile.open(tarball, "r|gz") as tar:
        for m in tar:
            if m.isfile() and wanted(m.name):
                out[m.name] = tar.extractfile(m).read()
    return out


def pack(tarballs: Path, out: Path) -> dict:
    by_tarball: dict[str, list[tuple[str, str, str]]] = {}
    for gate, (tb, folder) in GATES.items():
        by_tarball.setdefault(tb, []).append(("runs", gate, folder))
    for gate, (tb, folder) in FRESH.items():
        by_tarball.setdefault(tb, []).append(("fresh", gate, folder))
    run_file = re.compile(r"^(?P<run>(grounded|base)_s\d+[^/]*)/(?P<file>" + "|".join(map(re.escape, RUN_FILES)) + ")$")
    hard_file = re.compile(r"^hard_set/(?P<file>" + "|".join(map(re.escape, HARD_SET_FILES)) + ")$")
    eval_file = re.compile(r"^eval/(?P<student>[^/]+)/eval\.json$")
    manifest: dict = {}
    for tb, jobs in sorted(by_tarball.items()):
        prefixes = {folder + "/": (kind, gate) for kind, gate, folder in jobs}
        files = members(tarballs / f"{tb}.tar.gz", lambda name: any(name.startswith(p) for p in prefixes))
        for name, data in sorted(files.items()):
            prefix = next(p for p in prefixes if name.startswith(p))
            (kind, gate), rel = prefixes[prefix], name[len(prefix):]
            dest = out / gate
            if kind == "runs" and (m := run_file.match(rel)):
                if m["file"] == "metrics.jsonl" and not data.strip():
                    continue  # a run that never logged a step (slr5 grounded_s1)
                write_gz(dest / m["run"] / m["file"], data)
            elif kind == "runs" and (m := hard_file.match(rel)):
                write_gz(dest / "hard_set" / m["file"], data)
            elif kind == "fresh" and (m := eval_file.match(rel)):
                write_gz(dest / "fresh" / m["student"] / "eval.json", data)
            elif kind == "fresh" and rel == "compare_methods.json":
                write_gz(dest / "fresh" / "compare_methods.json", data)
            else:
                continue
            manifest.setdefault(gate, {"tarballs": set()})["tarballs"].add(f"{tb}.tar.gz:{prefix}")
    # runs whose metrics.jsonl was empty leave a folder without it: drop their other files too
    for gate in GATES:
        for run in (out / gate).iterdir():
            if run_file.match(f"{run.name}/metrics.jsonl") and not (run / "metrics.jsonl.gz").exists():
                for f in run.iterdir():
                    f.unlink()
                run.rmdir()
    for gate, entry in manifest.items():
        entry["tarballs"] = sorted(entry["tarballs"])
        entry["runs"] = sorted(p.name for p in (out / gate).iterdir() if (p / "metrics.jsonl.gz").exists())
        entry["hard_set"] = (out / gate / "hard_set" / "hard_train.jsonl.gz").exists()
        entry["fresh_students"] = sorted(p.name for p in (out / gate / "fresh").iterdir() if p.is_dir()) \
            if (out / gate / "fresh").exists() else []
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tarballs", default="/work/gate_state")
    ap.add_argument("--out", default=str(REPO / "dev" / "results" / "raw"))
    args = ap.parse_args()
    manifest = pack(Path(args.tarballs), Path(args.out))
    print(json.dumps({g: (len(e["runs"]), len(e["fresh_students"])) for g, e in manifest.items()}, indent=1))


if __name__ == "__main__":
    main()
