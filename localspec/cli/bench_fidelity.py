"""`localspec bench fidelity`: each compute path's next-token distributions against the file's exact weights in
float32 (mean KL, top-1 agreement), on the embedded model and prompts no test reads.

    localspec bench fidelity --paths gguf bfloat16 --out assets/bench/<date>-<machine>/fidelity.md
"""

from __future__ import annotations

from pathlib import Path

from .bench_rounding import PATH_NAMES, add_prompt_options, unseen_prompts


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "fidelity",
        help="measure each compute path's distributions against the exact float32 weights (KL, top-1 agreement)",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--paths", nargs="+", default=["gguf", "bfloat16"], choices=PATH_NAMES)
    add_prompt_options(parser, gsm8k=4, mt_bench=4, humaneval=4, tokens=48)
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")


def run(args) -> int:
    from localspec.bench import fidelity
    from localspec.bench.interleave import table

    prompts = unseen_prompts(args)
    header, rows = fidelity.measure(args.paths, prompts, args.tokens)
    text = table(header, rows)
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0
