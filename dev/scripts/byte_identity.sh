#!/bin/bash
# A refactor changes no behaviour: arith_micro's Promotion Questions and promotions, and every preset's
# resolved config, are the same at two commits. Two arith_micro runs (~1.5 min each on 2 idle cores).
#
#   bash dev/scripts/byte_identity.sh BEFORE_COMMIT [AFTER_COMMIT=HEAD] [WORK=/tmp/byte_identity]
set -euo pipefail
BEFORE=$1; AFTER=${2:-HEAD}; WORK=${3:-/tmp/byte_identity}
REPO=$(git rev-parse --show-toplevel)
capture() {  # capture COMMIT NAME: the commit's configs and run under $WORK/NAME, its code at one path for both
  local code=$WORK/code out=$WORK/$2
  rm -rf "$out"; mkdir -p "$out/configs"
  git -C "$REPO" worktree add -q --detach "$code" "$1"
  for f in "$code"/conf/experiment/*.yaml; do
    n=$(basename "$f" .yaml)
    (cd "$code" && PYTHONPATH=$code python -c "import soar; from omegaconf import OmegaConf; \
print(OmegaConf.to_yaml(soar.compose(['experiment=$n', 'run.dir=/x'])))") > "$out/configs/$n.yaml"
  done
  (cd "$code" && PYTHONPATH=$code OMP_NUM_THREADS=1 soar-train experiment=arith_micro run.dir="$out/run" \
     run.progress=false > "$out/train.log" 2>&1)
  (cd "$out/run" && sha256sum pq.jsonl promotions.jsonl) > "$out/sha.txt"
  git -C "$REPO" worktree remove --force "$code"
}
capture "$BEFORE" before
capture "$AFTER" after
diff -r "$WORK/before/configs" "$WORK/after/configs" && echo "resolved configs: identical ($(ls "$WORK/after/configs" | wc -l) presets)"
diff "$WORK/before/sha.txt" "$WORK/after/sha.txt" && echo "arith_micro pq.jsonl and promotions.jsonl: identical" && cat "$WORK/after/sha.txt"
