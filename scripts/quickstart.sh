#!/usr/bin/env bash
# The main job: SOAR end to end in the embedded arithmetic world, on CPU (experiment=arith): load
# the world's character-level Llama (shipped with the package), build the fail@128 hard set, run
# the outer loop (teacher -> students -> grounded reward -> promotion -> teacher update) and write the
# Promotion Questions. soar-train prints one line per outer step and, at the end, the promotions and
# where it wrote them (pq.jsonl, promoted/); this script then plots the teacher's reward (reward.png).
# Everything lands in runs/arith/ (RUN=... to change).
# It runs STEPS=10 outer steps (22-30 minutes on 2 cores; the first promotion at step 3, 7-10 minutes in),
# half the preset's 20: STEPS=20 for the preset, STEPS=40 for the gate's length.
# Usage: [STEPS=n] [RUN=dir] bash scripts/quickstart.sh [extra Hydra overrides for soar-train]
set -euo pipefail
RUN="${RUN:-runs/arith}"
export OMP_WAIT_POLICY=PASSIVE
soar-train run.dir="$RUN" loop.steps="${STEPS:-10}" "$@"
python3 -c 'import sys; from soar.report import reward_plot; print("reward plot:", reward_plot(sys.argv[1], sys.argv[2]))' \
    "$RUN" "$RUN/reward.png"
