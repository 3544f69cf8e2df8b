#!/usr/bin/env bash
# Fresh students on a gate's Promotion Questions (dev/scripts/compare_methods.py --gate) on a 16-core GPU
# host of the device tool: the soar-eval runs, PARALLEL (8) at once; measured 2026-12-04: 21 runs of
# 40 steps, 11 at once, in 242 s on the H200 host. Carry the wheels and the gate folder (its
# runs without checkpoints or teacher snapshots, a few MB each):
#   bash ../shared/tools/device-wheels.sh                                     # fills .whl/ (once)
#   mkdir -p .gate_carry/gate && tar cf - -C runs/gate_tau02 --exclude=checkpoints --exclude=teacher . | tar xf - -C .gate_carry/gate
#   device run: GATE_AT=/abs/path/of/the/gate OUT_AT=/abs/path/for/the/output bash dev/scripts/methods_on_device.sh \
#       --seeds 0 1 2 --students 2 --rows Hard-Only SOAR-PQ SOAR-PS "Base-T PQ"   carry=[".whl", ".gate_carry"]
# The gate is copied to GATE_AT and the comparison runs in OUT_AT, the paths it will have on your
# machine, so that $OUT/methods.tgz unpacked at / resumes there: rerun compare_methods.py with the same
# arguments to build the report (the host lacks the offline MiniLM wheel the Vendi score uses, so the
# report step fails there and runs here in a minute) and dev/results/soar_world.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/scripts/device_site.sh
mkdir -p "$GATE_AT" "$OUT_AT"
cp -r .gate_carry/gate/. "$GATE_AT"/
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader 2>/dev/null || true
t0=$SECONDS
python3 dev/scripts/compare_methods.py --out "$OUT_AT" --gate "$GATE_AT" --parallel "${PARALLEL:-8}" "$@" \
  > "$OUT_AT/device.log" 2>&1 || echo "compare_methods.py exited $? (the report step needs the MiniLM wheel)"
echo "$((SECONDS - t0)) s; eval runs done: $(ls "$OUT_AT"/eval/*/eval.json 2>/dev/null | wc -l)"
tail -5 "$OUT_AT/device.log"
if [[ -n "${OUT:-}" ]]; then tar czf "$OUT/methods.tgz" -C / "${OUT_AT#/}"; ls -la "$OUT"; fi
