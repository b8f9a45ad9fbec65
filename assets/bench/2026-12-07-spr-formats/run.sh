#!/bin/bash
# issue 43: the embedded model in the formats people have, against llama.cpp's C++ (one run per file, idle)
cd "$(dirname "$0")/../../.."
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# FILES holds smol-<TYPE>.gguf: the embedded Q4_1 file requantized by llama.cpp's own quantizer (make setup-bench-llama):
#   llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf smol-<TYPE>.gguf <TYPE>
mkdir -p ${OUT:-bench-out}
for t in Q4_0 Q4_K_M Q5_K_M Q6_K Q8_0; do
  .venv/bin/localspec bench --threads 2 --no-progress --model-file ${FILES:-.}/smol-$t.gguf --prompts assets/prompts/eval/*.jsonl --limit 1 --max-new-tokens 96 --modes none adaptive-tree llama.cpp --out ${OUT:-bench-out}/$t > ${OUT:-bench-out}/$t.log 2>&1; echo $t rc=$? $(date +%T)
done
