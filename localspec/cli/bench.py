"""`localspec bench`: our engine's modes side by side with Hugging Face generate(), on the same loaded weights."""

from __future__ import annotations

import sys
from pathlib import Path

from localspec.config import ConfigError, check_k

from . import bench_fidelity, bench_kernels, bench_rounding
from .common import add_model_options

TOOLS = {"kernels": bench_kernels, "rounding": bench_rounding, "fidelity": bench_fidelity}  # `localspec bench <tool>`

# every mode but head-tree (the trees rows: the n-gram's, ngram+head's and the default setting's, adaptive-tree)
DEFAULT_MODES = (
    "hf",
    "hf-fp32",
    "hf-pld",
    "hf-assisted",
    "none",
    "ngram",
    "ngram-tree",
    "draft",
    "head",
    "ngram+head",
    "ngram+head-tree",
    "adaptive",
    "adaptive-tree",
)


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "bench",
        help="benchmark our modes against transformers generate() (MT-Bench + HumanEval by default)",
        description="Runs every mode on every prompt, interleaved prompt by prompt after a warm-up, greedy, and "
        "writes results.json, results.md and PNG plots into --out.",
    )
    add_model_options(parser)
    tools = parser.add_subparsers(dest="bench_command", metavar="{" + ",".join(TOOLS) + "}", title="measurement tools")
    for tool in TOOLS.values():
        tool.add_parser(tools)
    parser.add_argument(
        "--prompts",
        nargs="+",
        default=None,
        metavar="FILE",
        help="prompt files (.jsonl[.gz] with turns/prompt/text/messages and optionally a JSON schema per line, or "
        ".txt one per line), or json-schema (the shipped JSON-schema task: constrained answers, each checked "
        "against its schema; json-schema-held-out: twelve more that tuned nothing); default: MT-Bench first "
        "turns and HumanEval from ../shared/data",
    )
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="only the default sets' prompts that `localspec distill` never trains on (MT-Bench "
        "151-160, HumanEval 150-163): the fair set for a trained head or draft",
    )
    parser.add_argument("--limit", type=int, default=10, help="prompts taken from each set (default: %(default)s)")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=list(DEFAULT_MODES),
        metavar="MODE",
        help=f"default: {', '.join(DEFAULT_MODES)} (those the pair supports); on request: head-tree, and llama.cpp's "
        "own C++ on a GGUF target (llama.cpp, llama.cpp-lookup, llama.cpp-draft with a GGUF draft; built once by "
        "make setup-bench-llama) and ik_llama.cpp's (ik_llama.cpp; make setup-bench-ik)",
    )
    parser.add_argument(
        "--k",
        nargs="+",
        type=int,
        default=None,
        metavar="K",
        help="K values for ngram / draft / head (a K sweep when several; default: the entry's k)",
    )
    parser.add_argument(
        "--hf-k", type=int, default=None, help="prompt_lookup_num_tokens for hf-pld (default: the entry's k)"
    )
    parser.add_argument("--adaptive-max-k", type=int, default=8, help="largest K adaptive may pick (default: 8)")
    parser.add_argument(
        "--adaptive-proposers",
        nargs="+",
        default=None,
        metavar="P",
        help="run adaptive once over each of these proposers (default: the entry's default_proposer)",
    )
    parser.add_argument(
        "--tree-nodes",
        type=int,
        default=8,
        help="draft nodes per step of the head-tree mode (the head's token tree; default: %(default)s)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice). On a busy machine 1 is far steadier: at "
        "load 10 on 2 cores, a 1-token step takes about 78 ms with 1 thread and 2 s with 2 (OpenMP "
        "threads waiting on each other)",
    )
    parser.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="run N busy processes beside the bench (at most the CPU count; they stop when the bench ends or fails), "
        "to measure speculation where other programs share the cores (default: 0)",
    )
    parser.add_argument(
        "--peer-args",
        action="append",
        default=[],
        metavar="PEER=ARGS",
        help="more options for a C++ peer's llama-server, e.g. 'ik_llama.cpp=-ub 31' (repeatable; recorded in "
        "the report)",
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up pass")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--out", default="bench-out", help="output folder (default: %(default)s)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole interleaved set this many times and report each mode's median ratio with its spread "
        "(each run's report in OUT/run-N)",
    )


def run(args) -> int:
    if getattr(args, "bench_command", None):
        return TOOLS[args.bench_command].run(args)
    from localspec.bench import load_prompts, parse_modes
    from localspec.bench.llama_cpp import set_peer_args
    from localspec.bench.load import background_load, check_load
    from localspec.bench.modes import for_prompts

    from .common import load_session

    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be ≥ 1 (got {args.max_new_tokens})")
    check_k(args.adaptive_max_k, "--adaptive-max-k")
    if args.repeat < 1:
        raise ConfigError(f"--repeat must be ≥ 1 (got {args.repeat})")
    load = getattr(args, "background_load", 0)
    check_load(load)
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be ≥ 1 (got {args.threads})")
        import torch

        torch.set_num_threads(args.threads)
    set_peer_args(_peer_args(getattr(args, "peer_args", [])))
    prompts = load_prompts(args.prompts, args.limit, args.held_out)
    wants_draft = any(m in args.modes for m in ("draft", "hf-assisted"))
    session = load_session(args, load_draft=wants_draft)
    ks = args.k or [session.loaded.spec.k]
    modes, notes = parse_modes(
        args.modes, ks, session, args.adaptive_max_k, args.hf_k, args.adaptive_proposers, args.tree_nodes
    )
    modes, skipped = for_prompts(modes, prompts)
    notes = notes + skipped
    for note in notes:
        print(f"localspec bench: {note}", file=sys.stderr)
    print(
        f"localspec bench: {len(prompts)} prompts × {len(modes)} modes ({', '.join(m.label for m in modes)})",
        file=sys.stderr,
    )
    out = Path(args.out)
    with background_load(load):
        runs = _runs(args, session, prompts, modes, notes, out, load)
    if args.repeat > 1:
        import json

        from localspec.bench import repeat

        combined = repeat.combine(runs)
        (out / "repeat.json").write_text(json.dumps(repeat.to_json(combined), indent=2))
        text = repeat.to_markdown(combined, len(runs))
        (out / "repeat.md").write_text(text + "\n")
        print(text)
    return 0


def _peer_args(values: list[str]) -> dict[str, tuple[str, ...]]:
    """--peer-args 'NAME=ARGS' values → {peer name: its extra llama-server options}."""
    import shlex

    extra: dict[str, tuple[str, ...]] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--peer-args takes PEER=ARGS, e.g. 'ik_llama.cpp=-ub 31' (got {value!r})")
        extra[name.strip()] = extra.get(name.strip(), ()) + tuple(shlex.split(rest))
    return extra


def _runs(args, session, prompts, modes, notes, out: Path, load: int) -> list:
    """The interleaved set, args.repeat times, each run's report written and printed (load: busy processes beside)."""
    from localspec.bench import run_bench
    from localspec.bench.report import to_markdown, write_report

    runs = []
    for index in range(args.repeat):
        result = run_bench(
            session,
            prompts,
            modes,
            args.max_new_tokens,
            notes,
            progress=not args.no_progress,
            warmup=not args.no_warmup and index == 0,
        )
        result.machine["background_load"] = load
        runs.append(result)
        folder = out if args.repeat == 1 else out / f"run-{index + 1}"
        data = write_report(result, folder)
        print(to_markdown(data))
        print(f"localspec bench: wrote {folder / 'results.json'}, results.md and plots", file=sys.stderr)
    return runs
