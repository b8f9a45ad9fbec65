#!/bin/bash
# The prompt read on the layer kernel and the constrained answers' drafts without the head (issues 43, 44, 48) on the
# Zen 4 EPYC, against the code before (BEFORE: a worktree of 75c0c8d): the evaluation prompts (3 alternated pairs)
# and the held-out JSON-schema task (3 alternated pairs), the code before and this commit run by run; then the prefill
# paths by prompt length (prefill.py) and the peers (peers.sh)
cd "$(dirname "$0")/../../.."
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-assets/bench/2026-12-08-zen4-prefill}
EVAL="--threads 2 --no-progress --prompts $PWD/assets/prompts/eval/*.jsonl --limit 2 --max-new-tokens 128 --modes none adaptive-tree"
JSON="--threads 2 --no-progress --prompts json-schema-held-out --limit 12 --max-new-tokens 256 --modes none ngram adaptive-tree"
run() {  # run <side: head (BEFORE) | main (this checkout)> <name> <args>
  local where=$PWD; [ "$1" = head ] && where=$BEFORE
  (cd "$where" && PYTHONPATH=. "$OLDPWD/.venv/bin/python" -m localspec bench $3 --out "$OLDPWD/$OUT/$2-$1-$round" \
    > "$OLDPWD/$OUT/$2-$1-$round.log" 2>&1); echo "$2-$1-$round rc=$? $(date +%T)"
}
for round in 1 2 3; do for side in head main; do run $side eval "$EVAL"; done; done
for round in 1 2 3; do for side in head main; do run $side json "$JSON"; done; done
.venv/bin/python "$OUT/prefill.py" > "$OUT/prefill-embedded.md"
bash "$OUT/peers.sh"
