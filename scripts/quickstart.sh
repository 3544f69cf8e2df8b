#!/usr/bin/env bash
# The main job: SOAR end to end in the embedded arithmetic world, on CPU (experiment=arith): load
# the world's character-level Llama (shipped with the package), build the fail@128 hard set, run
# the outer loop (teacher -> students -> grounded reward -> promotion -> teacher update), write the
# Promotion Questions, then print the step rewards and promotions and plot the teacher's reward
# (reward.png). Everything lands in runs/arith/ (RUN=... to change).
# It runs STEPS=10 outer steps (22-30 minutes on 2 cores; the first promotion at step 3, 7-10 minutes in),
# half the preset's 20: STEPS=20 for the preset, STEPS=40 for the gate's length.
# Usage: [STEPS=n] [RUN=dir] bash scripts/quickstart.sh [extra Hydra overrides for soar-train]
set -euo pipefail
RUN="${RUN:-runs/arith}"
export OMP_WAIT_POLICY=PASSIVE
soar-train run.dir="$RUN" loop.steps="${STEPS:-10}" "$@"
python3 - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
promos = [json.loads(l) for l in open(f"{run}/promotions.jsonl") if l.strip()]
print(f"{len(rows)} outer steps, {len(promos)} promotions, {sum(1 for _ in open(f'{run}/pq.jsonl'))} Promotion Questions")
print("step reward (mean over datasets):", " ".join(f"{r['teacher/reward_mean']:+.3f}" for r in rows))
for p in promos:
    print(f"promotion {p['promotion']} at step {p['step']}: the promoted student's greedy accuracy "
          f"on hard train {p['hard_train_acc']:.3f}, on hard test {p['hard_test_acc']:.3f} (the base model's: 0)")

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

steps = [r["step"] for r in rows]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(steps, [r["teacher/reward_mean"] for r in rows], "o-", label="step reward (mean over the g datasets)")
ma = [(r["step"], r["promotion/moving_average"]) for r in rows if r["promotion/moving_average"] is not None]
ax.plot(*zip(*ma), "--", label="moving average") if ma else None
from omegaconf import OmegaConf

cfg = OmegaConf.load(f"{run}/config.yaml")
ax.axhline(cfg.promotion.tau, color="red", ls=":", label="tau")
for p in promos:
    ax.axvline(p["step"], color="green", alpha=0.5, label="promotion" if p is promos[0] else None)
ax.axhline(0, color="grey", lw=0.5)
ax.set_xlabel("outer step")
units = {"accuracy": "greedy accuracy", "gold_prob": "gold-answer probability", "gold_logprob": "gold log-prob, nats"}
ax.set_ylabel(f"reward (gain in {units.get(cfg.inner.reward_metric, cfg.inner.reward_metric)})")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(f"{run}/reward.png", dpi=120)
print(f"plot: {run}/reward.png")
PY
