#!/usr/bin/env bash
# Issues 49 §6 and 57 §4: the GPU check (benchmarks/gpu_check.py) on one H100/H200 of the device tool, in at
# most 8 minutes: full-FT and LoRA inner steps with fp32 masters and gradient checkpointing, where LoRA's step
# time goes (reference / forward / backward / optimiser), the chosen layout's 2 LoRA students on one GPU, the
# driver's teacher state and a student sharing one GPU, whether SDPA needs its math kernel, the chunked
# log-probs, HF generation; every peak and reservation beside the memory plan's figure. vLLM cannot be measured
# there (the image has no vllm). The image's torch, transformers and peft are all it needs (nothing downloaded):
#   device run: bash dev/scripts/gpu_check_on_device.sh          (timeout_s 540; no carry)
# It writes $OUT/gpu_check.json (benchmarks/results/gpu_check.json without $OUT) and $OUT/gpu_check.log;
# commit the JSON as benchmarks/results/gpu_check_<h100|h200>.json. Extra arguments go to gpu_check.py
# (e.g. --parts generation,logprobs to rerun two parts). Each part writes the JSON when it ends, and
# the run stops itself after GPU_CHECK_SECONDS (default 470) so that what finished comes back.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null || true
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)'
status=0
timeout "${GPU_CHECK_SECONDS:-470}" python3 benchmarks/gpu_check.py --out "$out/gpu_check.json" "$@" \
  2>&1 | tee "$out/gpu_check.log" || status=$?
echo "gpu_check.py exited $status"
ls -la "$out"
