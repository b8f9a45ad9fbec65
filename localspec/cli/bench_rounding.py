"""`localspec bench rounding`: per compute path and forward setup, whether the rows of multi-row forwards (chains of
2..17 rows, token trees) round as plain decoding's 1-row forwards, on the embedded model and prompts no test reads.
Its JSON files, named in assets/rounding/index.json, are the measurements each path's guarantee states.

    localspec bench rounding --paths bfloat16 gguf --setups fast exact engine --json-dir assets/rounding/<machine>
"""

from __future__ import annotations

from pathlib import Path

from localspec.config import ConfigError

from .common import positive_int

PATH_NAMES = ("float32", "bfloat16", "float16", "nf4", "int8", "gguf")  # localspec/bench/rounding.py PATHS
SETUP_NAMES = (
    "fast",
    "eager-mask",
    "eager-mask-2",
    "eager-mask-4x4",
    "exact",
    "exact-rows",
    "eager-mask-rows",
    "engine",
)


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "rounding",
        help="measure whether verify rows round as plain decoding's, per compute path and forward setup",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--paths", nargs="+", default=["float32", "bfloat16", "float16"], choices=PATH_NAMES)
    parser.add_argument("--setups", nargs="+", default=["fast", "eager-mask", "exact"], choices=SETUP_NAMES)
    add_prompt_options(parser, gsm8k=3, mt_bench=1, humaneval=1, tokens=24)
    parser.add_argument("--json-dir", type=Path, help="write <path>.json per path here (assets/rounding/<machine>)")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")


def add_prompt_options(parser, gsm8k: int, mt_bench: int, humaneval: int, tokens: int) -> None:
    """How many prompts no test reads, from each set, how many greedy tokens each, and the torch threads."""
    parser.add_argument("--gsm8k", type=int, default=gsm8k, help="gsm8k train questions (default: %(default)s)")
    parser.add_argument("--mt-bench", type=int, default=mt_bench, help="MT-Bench prompts (default: %(default)s)")
    parser.add_argument("--humaneval", type=int, default=humaneval, help="HumanEval prompts (default: %(default)s)")
    parser.add_argument("--tokens", type=positive_int, default=tokens, help="greedy tokens per prompt (%(default)s)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default: %(default)s)")


def unseen_prompts(args) -> list[str]:
    """The prompts add_prompt_options names (torch set to its threads), or a ConfigError where they name none."""
    if min(args.gsm8k, args.mt_bench, args.humaneval) < 0 or args.gsm8k + args.mt_bench + args.humaneval == 0:
        raise ConfigError("--gsm8k, --mt-bench and --humaneval must be ≥ 0 and name at least one prompt")
    import torch

    from localspec.bench import rounding

    torch.set_num_threads(args.threads)
    return rounding.unseen_prompts(args.gsm8k, args.mt_bench, args.humaneval)


def run(args) -> int:
    from localspec.bench import rounding

    prompts = unseen_prompts(args)
    text = rounding.measure(args.paths, args.setups, prompts, args.tokens, args.json_dir)
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0
