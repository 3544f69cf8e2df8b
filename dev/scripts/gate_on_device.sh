#!/usr/bin/env bash
# The world gate (dev/scripts/compare_teachers.py: 3 seeds x Grounded-T and Base-T, 6 runs at once with
# 2 threads each) on a 16-core GPU host of the device tool, which has torch, transformers and peft
# but no hydra, omegaconf, datasets or math-verify. Prepare the wheels here, then run it there:
#   bash ../shared/tools/device-wheels.sh                              # fills .whl/ (once)
#   device run: bash dev/scripts/gate_on_device.sh   carry=[".whl"]        # results under $OUT
# Extra arguments go to compare_teachers.py (e.g. --steps 60 --variants grounded base -- world.seed=1).
# Environment:
#   HARD_SET=dir      a prebuilt hard set (a compare_teachers.py --out folder's hard_set, carried
#                     along), so that the runs are measured on the same hard set as a CPU gate;
#   GATE_SECONDS=n    stop the runs after n seconds (kill -9; checkpoints are atomic): a gate too long
#                     for one call is continued from the packed runs, on 2 cores or in a later call;
#   GATE_DIR=dir      the work folder (default /tmp/gate when $OUT is set, else runs/gate).
# With $OUT set, each run comes back as $OUT/<variant>_s<seed>.tgz (its log, metrics, step dumps,
# promoted students and latest checkpoint; the teacher snapshots are left out to fit the device's
# 16 MiB per file) and the report as $OUT/gate.tgz. Unpack them into one folder and resume with
# compare_teachers.py --out that-folder, same arguments (a GPU's checkpoints resume on a CPU).
# Measured 2026-12-04 (H200 host, g=16 datasets): 42-44 s per outer step with the 6 runs at once, so a
# 15-minute lease runs about 17 of a 40-step gate's steps; with g=8 and 3 runs, 6.6-7.5 s (2026-11-30).
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/scripts/device_site.sh
gate="${GATE_DIR:-$([[ -n "${OUT:-}" ]] && echo /tmp/gate || echo runs/gate)}"
mkdir -p "$gate"
if [[ -n "${HARD_SET:-}" && ! -e "$gate/hard_set" ]]; then cp -r "$HARD_SET" "$gate/hard_set"; fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader 2>/dev/null || true
t0=$SECONDS
setsid python3 dev/scripts/compare_teachers.py --out "$gate" --parallel 6 --threads 2 "$@" > "$gate/gate.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  sleep 10
  if [[ -n "${GATE_SECONDS:-}" ]] && (( SECONDS - t0 >= GATE_SECONDS )); then
    kill -9 -- -"$pid" 2>/dev/null || true; echo "stopped after $((SECONDS - t0)) s"; break
  fi
  if (( (SECONDS - t0) % 60 < 10 )); then
    for m in "$gate"/{grounded,base,base_fixed}_s*/metrics.jsonl; do
      if [[ -e $m ]]; then echo "$((SECONDS - t0))s $m: $(wc -l < "$m") lines"; fi
    done
  fi
done
wait "$pid" 2>/dev/null || true
tail -3 "$gate/gate.log"
[[ -z "${OUT:-}" ]] && exit 0
for run in "$gate"/{grounded,base,base_fixed}_s*/; do
  [[ -d $run ]] || continue
  name=$(basename "$run")
  done_ckpt=$(ls -d "$run"checkpoints/step_*/DONE 2>/dev/null | tail -1 || true)
  for c in "$run"checkpoints/step_*; do if [[ -e $c && "$c/DONE" != "$done_ckpt" ]]; then rm -rf "$c"; fi; done
  rm -f "$run"run.lock
  tar czf "$OUT/$name.tgz" --exclude="$name/teacher" -C "$gate" "$name" $(cd "$gate" && ls "$name.log" 2>/dev/null)
done
tar czf "$OUT/gate.tgz" -C "$gate" $(cd "$gate" && ls gate.log gate.json prepare.log 2>/dev/null)
ls -la "$OUT"
