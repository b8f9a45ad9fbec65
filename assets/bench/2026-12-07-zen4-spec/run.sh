#!/bin/bash
# issue 44 on the Zen 4 EPYC: the evaluation prompts, the code before (BEFORE: a worktree of f9f918a) and this
# commit alternated run by run (3 each), then this commit beside one busy thread (--background-load 1, 3 runs)
cd "$(dirname "$0")/../../.."
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-assets/bench/2026-12-07-zen4-spec}
COMMON="--threads 2 --no-progress --prompts $PWD/assets/prompts/eval/*.jsonl --limit 2 --max-new-tokens 128"
for run in 1 2 3; do
  (cd "$BEFORE" && PYTHONPATH=. $OLDPWD/.venv/bin/python -m localspec bench $COMMON --modes none adaptive-tree \
    --out $OLDPWD/$OUT/before-$run > $OLDPWD/$OUT/before-$run.log 2>&1); echo "before-$run rc=$? $(date +%T)"
  .venv/bin/localspec bench $COMMON --modes none head adaptive-tree llama.cpp --out $OUT/after-$run \
    > $OUT/after-$run.log 2>&1; echo "after-$run rc=$? $(date +%T)"
done
.venv/bin/localspec bench $COMMON --modes none adaptive-tree --background-load 1 --repeat 3 --out $OUT/after-load1 \
  > $OUT/after-load1.log 2>&1; echo "after-load1 rc=$? $(date +%T)"
