#!/bin/bash
# The README's two commands as a new user runs them: a fresh clone of this checkout's HEAD, a new virtualenv.
#   bash dev/scripts/fresh_clone.sh suite DIR     # install.sh cpu test-slurm && python3 -m pytest tests
#   bash dev/scripts/fresh_clone.sh main DIR      # install.sh cpu && quickstart.sh
# Prints each command's rc and seconds and the log's tail; the logs stay in DIR (made empty first). Set
# OMP_NUM_THREADS=1 for the idle-cores timing that docs/loop.md reports; on shared cores it is "under load".
set -u
MODE=${1:?suite or main}; D=${2:?a work folder}
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rm -rf "$D"; mkdir -p "$D"
git clone -q "$REPO" "$D/soar" && cd "$D/soar" && git log --oneline -1
python3 -m venv "$D/venv" && source "$D/venv/bin/activate"
step() {  # name, command...
    local name=$1; shift; local start=$(date +%s)
    "$@" > "$D/$name.log" 2>&1; local rc=$?
    echo "$name rc $rc $(( $(date +%s) - start )) s"; return $rc
}
if [ "$MODE" = suite ]; then
    export SOAR_REQUIRE_SLURM=1  # a SLURM test that would skip fails instead
    step install bash scripts/install.sh cpu test-slurm && step pytest python3 -m pytest tests
    tail -40 "$D/pytest.log"
else
    step install bash scripts/install.sh cpu && step quickstart bash scripts/quickstart.sh
    tail -25 "$D/quickstart.log"
fi
