"""Rebuild a packaged world model from scratch and compare it with the copy the package ships: the
weights' SHA-256 and the accuracy table of its model card. Writes JSON (time, hashes, tables).

    python dev/scripts/rebuild_world.py                      # the default world (experiment=arith)
    python dev/scripts/rebuild_world.py --ship               # (maintainers) put the rebuilt model in the package
    python dev/scripts/rebuild_world.py -- world.seed=1      # any other world, by overrides
    python dev/scripts/rebuild_world.py --experiment arith_micro --out dev/results/rebuild_world_micro.json
                                                             # the tests' world (experiment=arith_micro)

The rebuild runs ``soar-world pretrain``'s code into a temporary folder (never the cache), so it
always pretrains. On the kind of machine the shipped copy came from (2 x86-64 cores, torch 2.13
CPU) the weights match bit for bit; other CPUs or torch builds round differently and give another
draw of the same world.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"  # dev/results
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "README.md", "train_info.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "rebuild_world.json"))
    ap.add_argument("--experiment", default="arith", help="the preset whose world to rebuild")
    ap.add_argument("--ship", action="store_true", help="copy the rebuilt model into soar/worlds/shipped/")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides after --")
    args = ap.parse_args()

    import torch

    import soar
    from soar.worlds.arith import SHIPPED, shipped_dir, world_hash
    from soar.worlds.arith_pretrain import pretrain
    from soar.worlds.base import get_world

    cfg = soar.compose([f"experiment={args.experiment}", *args.overrides])
    wcfg = get_world("arith").config(cfg)
    shipped = shipped_dir(wcfg, wcfg.seed)
    with tempfile.TemporaryDirectory() as tmp:
        wcfg.out_dir = str(Path(tmp) / "world")
        t0 = time.perf_counter()
        built = pretrain(wcfg, wcfg.seed, progress=True)
        seconds = time.perf_counter() - t0
        info = json.loads((built / "train_info.json").read_text())
        report = {"world": f"arith-{world_hash(wcfg, wcfg.seed)}", "experiment": args.experiment,
                  "overrides": args.overrides, "seconds": seconds,
                  "steps": info["steps"], "rebuilt": {"sha256": sha256(built / "model.safetensors"),
                                                       "accuracy_by_carries": info["accuracy_by_carries"]},
                  "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                              "threads": torch.get_num_threads()}}
        if shipped is not None:
            ship_info = json.loads((shipped / "train_info.json").read_text())
            report["shipped"] = {"path": str(shipped), "sha256": sha256(shipped / "model.safetensors"),
                                 "accuracy_by_carries": ship_info["accuracy_by_carries"]}
            report["weights_identical"] = report["shipped"]["sha256"] == report["rebuilt"]["sha256"]
            report["accuracy_identical"] = ship_info["accuracy_by_carries"] == info["accuracy_by_carries"]
        if args.ship:
            dest = SHIPPED / report["world"]
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for name in SHIPPED_FILES:
                shutil.copy2(built / name, dest / name)
            report["shipped_to"] = str(dest)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k not in ("rebuilt", "shipped")}, indent=2))


if __name__ == "__main__":
    main()
