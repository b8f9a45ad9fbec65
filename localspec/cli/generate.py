"""`localspec generate`: one answer, printed as it streams, or as one JSON object."""

from __future__ import annotations

import json
import sys

from localspec.config import ConfigError, SamplingParams, check_tree_nodes
from localspec.engine.events import steps
from localspec.store.validation import validate_messages
from localspec.structured.stops import StopScan, check_stops

from .common import (
    add_model_options,
    add_sampling_options,
    add_spec_options,
    check_spec_options,
    load_session,
    resolve_pair,
)


def add_parser(sub) -> None:
    parser = sub.add_parser("generate", help="answer one prompt with speculative decoding")
    parser.add_argument("--prompt", required=True, help="the user message")
    parser.add_argument("--system", default=None, help="optional system prompt")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object: text, token_ids, events, stats, plan"
    )
    add_model_options(parser)
    add_spec_options(parser)
    parser.add_argument(
        "--tree-nodes",
        type=int,
        default=None,
        help="draft a token tree of this many nodes per step (0 = chains of K; default: the entry's tree_nodes)",
    )
    add_sampling_options(parser)
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the answer where this text begins (the text is not printed); repeat for several",
    )


def run(args) -> int:
    sampling = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
    ).validate()
    scan = StopScan(check_stops(args.stop, "--stop"))
    messages = validate_messages(
        ([{"role": "system", "content": args.system}] if args.system else [])
        + [{"role": "user", "content": args.prompt}]
    )
    if not args.prompt.strip():
        raise ConfigError("the message is empty; give --prompt some text")
    if args.tree_nodes is not None:
        check_tree_nodes(args.tree_nodes, "--tree-nodes")
    pair = resolve_pair(args)
    check_spec_options(args, pair)
    session = load_session(args, load_draft=args.proposer in (None, "draft"), pair=pair)
    adaptive = None if args.adaptive is None else args.adaptive == "on"
    spec = session.default_spec(
        proposer=args.proposer, k=args.k, sampler=args.sampler, adaptive=adaptive, tree_nodes=args.tree_nodes
    ).validate()
    streamed, tokens, last, text = [], [], None, []  # every token; those released (before a stop string)
    stream = session.stream(messages, sampling, spec)
    try:
        for event in steps(stream):
            last = event
            streamed.extend(event.tokens)
            released, kept = scan.add([t.text for t in event.tokens], finished=event.finished)
            tokens.extend(streamed[i] for i in kept)
            text.append(released)
            if not args.json:
                sys.stdout.write(released)
                sys.stdout.flush()
            if scan.cut is not None:
                break
    finally:
        stream.close()
    stats = last.stats if last else None
    finish_reason = "stop" if scan.cut is not None else (last.finish_reason if last else None)
    if args.json:
        print(
            json.dumps(
                {
                    "model": session.loaded.spec.name,
                    "proposer": spec.proposer,
                    "k": spec.k,
                    "adaptive": spec.adaptive,
                    "tree_nodes": spec.tree_nodes,
                    "quant": session.loaded.quant,
                    "dtype": session.loaded.dtype.to_dict() if session.loaded.dtype is not None else None,
                    "exact": session.loaded.exact.to_dict() if session.loaded.exact is not None else None,
                    "int4_kernel": _int4_kernel(session),
                    "plan": session.engine.target.plan.to_dict(),  # each choice of the target's forwards and why
                    # seconds per drafted token of each model proposer, timed at load: the controllers' prior
                    "propose_priors": dict(session.engine.controllers.propose_priors),
                    "text": "".join(text),
                    "token_ids": [t.token_id for t in tokens],
                    "events": [t.to_dict() for t in tokens],
                    "finish_reason": finish_reason,
                    "error": last.error if last else None,
                    "stats": stats.to_dict() if stats else {},
                },
                ensure_ascii=False,
            )
        )
    else:
        print()
        if session.loaded.dtype is not None:
            print(f"[dtype {session.loaded.dtype.describe()}]", file=sys.stderr)
        if session.loaded.exact is not None:
            print(f"[{session.loaded.exact.describe()}]", file=sys.stderr)
        print(f"[plan {session.engine.target.plan.summary()}]", file=sys.stderr)
        kernel = _int4_kernel(session)
        if kernel is not None:
            print(f"[{kernel}]", file=sys.stderr)
        if stats:
            print(
                f"[{spec.proposer} K={spec.k}] {stats.emitted} tokens, {stats.tokens_per_s:.1f} tok/s, "
                f"accepted {stats.accepted}/{stats.drafted} draft tokens ({stats.acceptance_rate:.0%}), "
                f"{stats.mean_acceptance_length:.2f} tokens per target forward",
                file=sys.stderr,
            )
    if last is not None and last.finish_reason == "error":
        print(f"localspec: {last.error}", file=sys.stderr)
        return 1
    return 0


def _int4_kernel(session) -> str | None:
    """The int4 kernel note of a gguf target (None for other formats)."""
    if session.loaded.quant != "gguf":
        return None
    from localspec.models.gguf_linear import int4_kernel_note

    return int4_kernel_note()
