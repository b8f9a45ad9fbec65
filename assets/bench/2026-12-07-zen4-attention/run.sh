#!/bin/bash
# The attention kernel's rows with the keys in the lanes (issue 44, 48) on the Zen 4 EPYC: the kernels against the code
# before (BEFORE: a worktree of cca7ffa), then the evaluation prompts (3 alternated pairs) and the held-out JSON-schema
# task (2 alternated pairs), the code before and this commit run by run
cd "$(dirname "$0")/../../.."
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-assets/bench/2026-12-07-zen4-attention}
for cached in 64 600; do
  .venv/bin/localspec bench kernels --against cca7ffa --kernels attention layer --rows 1 2 3 5 9 17 --cached $cached \
    --repeats 25 --out $OUT/kernels-$cached.md
done
.venv/bin/localspec bench kernels --against cca7ffa --kernels attention --rows 9 64 1024 --cached 0 --repeats 5 \
  --out $OUT/kernels-0.md
.venv/bin/localspec bench kernels --against cca7ffa --kernels q8 --rows 1 2 5 9 17 64 --repeats 40 --out $OUT/kernels-q8.md
EVAL="--threads 2 --no-progress --prompts $PWD/assets/prompts/eval/*.jsonl --limit 2 --max-new-tokens 128 --modes none adaptive-tree"
JSON="--threads 2 --no-progress --prompts json-schema-held-out --limit 12 --max-new-tokens 256 --modes none ngram adaptive-tree"
run() {  # run <side: head (BEFORE) | main (this checkout)> <name> <args>
  local where=$PWD; [ "$1" = head ] && where=$BEFORE
  (cd "$where" && PYTHONPATH=. "$OLDPWD/.venv/bin/python" -m localspec bench $3 --out "$OLDPWD/$OUT/$2-$1-$round" \
    > "$OLDPWD/$OUT/$2-$1-$round.log" 2>&1); echo "$2-$1-$round rc=$? $(date +%T)"
}
for round in 1 2 3; do for side in head main; do run $side eval "$EVAL"; done; done
for round in 1 2; do for side in head main; do run $side json "$JSON"; done; done
