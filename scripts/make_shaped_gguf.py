"""GGUF files at real models' shapes with random weights, in the block types people download, for `localspec bench
--model-file` against llama.cpp on the same file (decode speed does not depend on the weights' values).

    python scripts/make_shaped_gguf.py --shape smollm2-1.7b --types Q4_K_M Q8_0 [--out DIR]

Writes DIR/<shape>-F16.gguf (localspec/bench/shaped_gguf.py: the embedded tokenizer, random float16 weights), then
each type with llama.cpp's own `llama-quantize` (built by `make setup-bench-llama`). A file already there is kept.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localspec.bench import llama_bin  # noqa: E402
from localspec.bench.shaped_gguf import SHAPES, write_shaped  # noqa: E402
from localspec.config import ConfigError  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-1.7b")
    parser.add_argument("--types", nargs="+", default=["Q4_K_M", "Q8_0"], help="llama-quantize's type names")
    parser.add_argument("--out", type=Path, default=Path("shaped"), help="folder for the files (default: ./shaped)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    source = args.out / f"{args.shape}-F16.gguf"
    if not source.is_file():
        print(f"writing {source} …", flush=True)
        write_shaped(source.with_suffix(".partial"), SHAPES[args.shape]).rename(source)
    try:
        quantize = llama_bin.binary("llama-quantize")
    except ConfigError as exc:
        print(f"make_shaped_gguf: {exc}", file=sys.stderr)
        return 2
    for kind in args.types:
        target = args.out / f"{args.shape}-{kind}.gguf"
        if not target.is_file():
            subprocess.run([str(quantize), str(source), str(target), kind], check=True, capture_output=True)
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
