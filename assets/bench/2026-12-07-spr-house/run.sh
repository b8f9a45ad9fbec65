#!/bin/bash
set -u
ARGS="bench --prompts assets/prompts/eval/chat.jsonl assets/prompts/eval/document-qa.jsonl assets/prompts/eval/extraction.jsonl assets/prompts/eval/factual-qa.jsonl assets/prompts/eval/math.jsonl assets/prompts/eval/multi-turn.jsonl assets/prompts/eval/summarization.jsonl assets/prompts/eval/translation.jsonl --limit 1 --modes none adaptive-tree --quant gguf --exact on --threads 2 --max-new-tokens 96 --no-progress"
run() { (cd "$1" && GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false LOCALSPEC_HOME="$2" timeout 900 /work/main/.venv/bin/python -c "import sys; sys.path.insert(0,'.'); from localspec.cli.main import main; sys.argv=['localspec']+sys.argv[1:]; sys.exit(main())" $ARGS --out "$3" > "$3.log" 2>&1; echo "$3 rc=$? $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"); }
for i in 1 2 3; do
  run /work/base45 /work/base45-home /work/b45/r3-base$i
  run /work/bis-e5c0f5b /work/bis-home-e5c0f5b /work/b45/r3-plan$i
done
