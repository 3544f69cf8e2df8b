"""The pre-registered coach-distillation study's runs (dev/studies/coach_distill/PROTOCOL.md), from the frozen
commit's code; resumable: every step is skipped when its output exists, a killed soar-* run resumes from its
checkpoint.

    git worktree add --detach /work/studies/coach_distill/code $(cat dev/studies/coach_distill/FROZEN_COMMIT)
    nice -n 10 python dev/studies/coach_distill/run.py --code /work/studies/coach_distill/code \
        --out /work/studies/coach_distill/runs                      # resumable; --status: counts only
    python dev/studies/coach_distill/run.py --code . --out /tmp/cd_toy --toy    # the pipeline at toy size

Per seed, in order (``protocol.json`` holds every override):
  1. ``soar-filter`` of the preset: the seed's own pool (``world.pool_seed=${seed}``) of sums whose carries
     differ, fail@k, split 50/50 into hard train / hard test -> ``<out>/s<seed>/hard``;
  2. ``soar-train`` (SOAR, Grounded-T) on that hard set -> ``<out>/s<seed>/soar``: its Promotion Questions
     for the ``pq`` arm;
  3. each trained arm: ``soar-rl`` from the world model at the same budget (steps x questions x samples)
     -> ``<out>/s<seed>/<arm>``;
  4. every arm, the trained ones' ``final/`` and the untrained model with and without advice, scored by
     ``evaluate.py`` on the seed's hard test and easier sums, on the same sampling seeds;
  5. packed into ``--raw`` (``<arm>_s<seed>/``: eval.json and the run's metrics, config, meta, summary).
``--status`` prints how many (arm, seed) pairs are packed, never a number from them (no interim looks).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import Commands, check_frozen, load_protocol, pack_run, packed, seeds  # noqa: E402  (dev/studies/common.py)


def arm_overrides(proto: dict, arm: str, seed: int, seed_dir: Path) -> list[str]:
    """``soar-rl``'s arguments of a trained arm: the preset, the seed, the hard set, the budget, the arm's own."""
    hard = seed_dir / "hard"
    data = seed_dir / "pq_and_hard_train.jsonl" if arm == "pq" else hard / "hard_train.jsonl"
    return [proto["preset"], f"seed={seed}", f"data.path={data}", f"data.eval_path={hard / 'hard_test.jsonl'}",
            f"student.max_steps={proto['steps']}", f"student.save_every={proto['save_every']}",
            f"run.dir={seed_dir / arm}", *proto["common_overrides"], *proto["budget_overrides"],
            *proto["arms"][arm]["overrides"]]


def write_pq_union(soar_dir: Path, hard_train: Path, out: Path) -> int:
    """The SOAR run's Promotion Questions (ids ``pq/<i>``) followed by hard train, as one question file; the
    number of Promotion Questions (0 when the run promoted nothing: then the arm trains on hard train alone)."""
    pq = [json.loads(line) for line in (soar_dir / "pq.jsonl").read_text().splitlines() if line.strip()]
    rows = [{"id": f"pq/{i}", "question": r["question"], "answer": r["answer"]} for i, r in enumerate(pq)]
    rows += [json.loads(line) for line in hard_train.read_text().splitlines() if line.strip()]
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out)
    return len(pq)


def run_seed(proto: dict, cmd: Commands, seed: int, out: Path, raw: Path) -> None:
    seed_dir = out / f"s{seed}"
    hard = seed_dir / "hard"
    if not (hard / "summary.json").exists():
        cmd.soar("soar-filter", [proto["preset"], f"seed={seed}", f"run.dir={hard}", *proto["common_overrides"],
                                 *proto["filter_overrides"]], seed_dir / "filter.log")
    arms = proto["arms"]
    if "pq" in arms and not (seed_dir / "soar" / "summary.json").exists():
        cmd.soar("soar-train", [proto["soar"]["preset"], f"seed={seed}", f"loop.hard_set={hard}",
                                f"run.dir={seed_dir / 'soar'}", *proto["common_overrides"], *proto["soar"]["overrides"]],
                 seed_dir / "soar.log")
    if "pq" in arms:
        write_pq_union(seed_dir / "soar", hard / "hard_train.jsonl", seed_dir / "pq_and_hard_train.jsonl")
    ev = proto["eval"]
    for arm, spec in arms.items():
        dest = raw / f"{arm}_s{seed}"
        if packed(dest):
            continue
        run_dir = seed_dir / arm
        if spec["train"] and not (run_dir / "summary.json").exists():
            cmd.soar("soar-rl", arm_overrides(proto, arm, seed, seed_dir), seed_dir / f"{arm}.log")
        run_dir.mkdir(parents=True, exist_ok=True)
        eval_json = run_dir / "study_eval.json"
        if not eval_json.exists():
            model = str(run_dir / "final") if spec["train"] else "base"
            cmd.script(
                "dev/studies/coach_distill/evaluate.py",
                ["--model", model, "--hard-test", str(hard / "hard_test.jsonl"),
                 "--seed", str(seed), "--out", str(eval_json), "--hard-samples", str(ev["hard_samples"]),
                 "--easy-samples", str(ev["easy_samples"]), "--easy-count", str(ev["easy_count"]),
                 "--easy-carries", *map(str, ev["easy_carries"]), *(["--advice"] if spec.get("advice") else [])],
                seed_dir / f"eval_{arm}.log")
        extra = {"eval.json": eval_json, "hard_summary.json": hard / "summary.json"}
        if arm == "pq":
            extra.update({"soar_pq.jsonl.gz": seed_dir / "soar" / "pq.jsonl",
                          "soar_promotions.jsonl": seed_dir / "soar" / "promotions.jsonl",
                          "soar_metrics.jsonl.gz": seed_dir / "soar" / "metrics.jsonl"})
        if spec["train"]:
            pack_run(run_dir, dest, extra)
        else:  # an untrained arm has no run: its pack is the evaluation and the hard set it read
            dest.mkdir(parents=True, exist_ok=True)
            for name, path in extra.items():
                (dest / name).write_bytes(path.read_bytes())
            (dest / "summary.json").write_text(json.dumps({"arm": arm, "seed": seed, "trained": False}))
        print(f"packed {arm} seed {seed}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", required=True, help="a worktree of the frozen commit")
    ap.add_argument("--out", required=True, help="where the run folders go")
    ap.add_argument("--raw", default=None, help="where finished runs are packed (default: this folder's raw/; "
                                                 "--toy: <out>/raw)")
    ap.add_argument("--parallel", type=int, default=1, help="seeds run side by side")
    ap.add_argument("--toy", action="store_true", help="protocol.json's toy sizes: a smoke test, never data")
    ap.add_argument("--status", action="store_true", help="how many (arm, seed) pairs are packed (no numbers)")
    args = ap.parse_args()
    proto, out = load_protocol(HERE, args.toy), Path(args.out).resolve()
    raw = Path(args.raw or (out / "raw" if args.toy else HERE / "raw")).resolve()
    seed_list = seeds(proto, HERE)
    jobs = [(arm, s) for s in seed_list for arm in proto["arms"]]
    if args.status:
        print(f"{sum(packed(raw / f'{a}_s{s}') for a, s in jobs)} of {len(jobs)} (arm, seed) pairs packed")
        return
    if not args.toy:
        check_frozen(HERE, Path(args.code))
    out.mkdir(parents=True, exist_ok=True)
    cmd, t0 = Commands(Path(args.code), out / "timings.jsonl"), time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(lambda s: run_seed(proto, cmd, s, out, raw), seed_list))
    print(f"done in {time.perf_counter() - t0:.0f} s; each command's time in {out / 'timings.jsonl'}")


if __name__ == "__main__":
    main()
