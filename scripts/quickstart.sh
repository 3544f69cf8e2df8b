#!/usr/bin/env bash
# The main job: SOAR end to end in the embedded arithmetic world, on CPU (experiment=arith):
# pretrain the world's character-level Llama (cached in ~/.cache/soar/worlds/), build the fail@128
# hard set, run the outer loop (teacher -> students -> grounded reward -> promotion -> teacher
# update), and write the Promotion Questions. Everything lands in runs/arith/ (RUN=... to change).
# Usage: bash scripts/quickstart.sh [extra Hydra overrides for soar-train]
set -euo pipefail
RUN="${RUN:-runs/arith}"
export OMP_WAIT_POLICY=PASSIVE
soar-train run.dir="$RUN" "$@"
python3 - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
promos = [json.loads(l) for l in open(f"{run}/promotions.jsonl") if l.strip()]
print(f"{len(rows)} outer steps, {len(promos)} promotions, {sum(1 for _ in open(f'{run}/pq.jsonl'))} Promotion Questions")
print("step reward (mean over datasets):", " ".join(f"{r['teacher/reward_mean']:+.3f}" for r in rows))
for p in promos:
    print(f"promotion {p['promotion']} at step {p['step']}: hard-train {p['hard_train_acc']:.3f}, hard-test {p['hard_test_acc']:.3f}")
PY
