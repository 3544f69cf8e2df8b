#!/usr/bin/env bash
# The world gate (scripts/compare_teachers.py: 3 seeds x Grounded-T and Base-T, 6 runs at once with
# 2 threads each) on a 16-core GPU host of the device tool, which has torch, transformers and peft
# but no hydra, omegaconf, datasets or math-verify. Prepare the wheels here, then run it there:
#   bash ../shared/tools/device-wheels.sh                              # fills .whl/ (once)
#   device run: bash scripts/gate_on_device.sh   carry=[".whl"]        # results under $OUT/gate
# Extra arguments go to compare_teachers.py (e.g. --steps 60 -- world.seed=1). The students train on
# the CPU cores (the world model is 0.7 M parameters); the GPU is not needed, only the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl
export PYTHONPATH="$PWD/.site:$PWD"
python3 scripts/compare_teachers.py --out "${OUT:-runs}/gate" --parallel 6 --threads 2 "$@"
