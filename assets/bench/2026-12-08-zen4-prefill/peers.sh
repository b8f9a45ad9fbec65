#!/bin/bash
# The default and plain decoding against llama.cpp's C++ on the embedded file and its requantizations (issue 43), 8
# evaluation prompts (the first of each task type), ≤ 96 new tokens, 2 threads, modes interleaved prompt by prompt.
# SHAPED: the folder of the requantized files (`make setup-bench-llama`, then bench/shaped_gguf.py's requantization)
cd "$(dirname "$0")/../../.."
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-assets/bench/2026-12-08-zen4-prefill}
R=${RUN:+-$RUN}  # RUN=2: a second run, peer-*-2
ARGS="--threads 2 --no-progress --prompts $PWD/assets/prompts/eval/*.jsonl --limit 1 --max-new-tokens 96 --modes none adaptive-tree llama.cpp"
.venv/bin/localspec bench $ARGS --out $OUT/peer-embedded$R > $OUT/peer-embedded$R.log 2>&1; echo "embedded rc=$?"
for f in ${FORMATS:-Q4_0 Q4_K_M Q6_K Q5_K_M Q8_0}; do
  .venv/bin/localspec bench $ARGS --model-file "$SHAPED/smol-$f.gguf" --out $OUT/peer-$f$R > $OUT/peer-$f$R.log 2>&1; echo "$f rc=$?"
done
