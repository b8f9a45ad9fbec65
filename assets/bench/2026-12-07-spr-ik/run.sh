#!/bin/bash
# issue 50: the default against ik_llama.cpp's own server end to end (prefill included), 2 threads, eval prompts
cd "$(dirname "$0")/../../.."
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
B=".venv/bin/localspec bench --threads 2 --no-progress"
EVAL="--prompts assets/prompts/eval/*.jsonl --limit 1 --max-new-tokens 96"
# FILES holds smol-Q8_0.gguf (the embedded file requantized by llama.cpp's own quantizer:
#   llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf smol-Q8_0.gguf Q8_0, from make setup-bench-llama)
# and smollm2-1.7b-Q4_K_M.gguf (python scripts/make_shaped_gguf.py --shape smollm2-1.7b --types Q4_K_M)
mkdir -p ${OUT:-bench-out}
echo start $(date +%T)
$B $EVAL --modes none adaptive-tree llama.cpp ik_llama.cpp --peer-args 'ik_llama.cpp=-ub 31' --repeat 3 --out ${OUT:-bench-out}/q41-ub31 > ${OUT:-bench-out}/q41-ub31.log 2>&1; echo q41-ub31 rc=$? $(date +%T)
$B $EVAL --modes none adaptive-tree ik_llama.cpp --out ${OUT:-bench-out}/q41-default > ${OUT:-bench-out}/q41-default.log 2>&1; echo q41-default rc=$? $(date +%T)
$B $EVAL --model-file ${FILES:-/work/shaped}/smol-Q8_0.gguf --modes none adaptive-tree llama.cpp ik_llama.cpp --repeat 3 --out ${OUT:-bench-out}/q80 > ${OUT:-bench-out}/q80.log 2>&1; echo q80 rc=$? $(date +%T)
$B --model-file ${FILES:-/work/shaped}/smollm2-1.7b-Q4_K_M.gguf --prompts assets/prompts/eval/chat.jsonl assets/prompts/eval/factual-qa.jsonl --limit 1 --max-new-tokens 32 --modes none llama.cpp ik_llama.cpp --out ${OUT:-bench-out}/17b > ${OUT:-bench-out}/17b.log 2>&1; echo 17b rc=$? $(date +%T)
