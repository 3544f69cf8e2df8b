#!/usr/bin/env bash
# The embedded default end to end, on CPU (about 10 minutes on 2 cores; 4 with a cached world model):
#   1. pretrain the arithmetic world's character-level Llama (cached in ~/.cache/soar/worlds/)
#   2. write the world's hard-set pool and its stepping-stone / control families
#   3. fail@128 on the pool -> the hard set (train/test)
#   4. RL-train one student on stepping stones, evaluated greedily on the hard train split
# Usage: bash scripts/quickstart.sh [extra Hydra overrides for soar-rl]
set -euo pipefail
RUN="${RUN:-runs/quickstart}"
export OMP_WAIT_POLICY=PASSIVE
MODEL="$(soar-world pretrain | tail -n 1)"
echo "world model: $MODEL"
soar-world problems run.dir="$RUN/problems" >/dev/null
soar-filter model="$MODEL" data=arith data.path="$RUN/problems/pool.jsonl" filter.k=128 \
    filter.max_tokens=24 filter.problems_per_batch=4 run.dir="$RUN/filter"
soar-rl model="$MODEL" data=arith data.path="$RUN/problems/stepping.jsonl" \
    data.eval_path="$RUN/filter/hard_train.jsonl" student=arith run.dir="$RUN/rl" "$@"
python3 - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(f"{run}/rl/metrics.jsonl")]
evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
summary = json.load(open(f"{run}/filter/summary.json"))
print(f"hard set: {summary['hard']} problems (train {summary['hard_train']}, test {summary['hard_test']})")
print(f"greedy accuracy on hard train: step {evals[0][0]}: {evals[0][1]:.3f} -> step {evals[-1][0]}: {evals[-1][1]:.3f}")
PY
