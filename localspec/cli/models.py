"""`localspec models`: the models found on this machine (LM Studio, Ollama, llama.cpp, Hugging Face cache), the pairs
they make, and `--add N` to put pair N into the user's models.yaml (the shipped one is never edited)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    parser = sub.add_parser("models", help="list the models found on this machine and the pairs they make")
    parser.add_argument(
        "--add", type=int, default=None, metavar="N", help="add proposed pair N to the user models.yaml"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    from localspec.config import ConfigError
    from localspec.models.discovery import discover, human_size, propose_pairs
    from localspec.models.untrusted import shown
    from localspec.models.user_models import add_user_pair, found_pairs

    found = discover()
    pairs = propose_pairs(found.models)
    skipped = list(found.skipped)
    found_pairs(pairs, set(), set(), skipped)  # the pairs the app could not offer, with their reasons
    if args.add is not None:
        if not 1 <= args.add <= len(pairs):
            raise ConfigError(f"--add takes a pair number from 1 to {len(pairs)} (got {args.add})")
        path = add_user_pair(pairs[args.add - 1])
        print(f"added {pairs[args.add - 1].name!r} to {path}")
        return 0
    if args.json:
        record = {
            "models": [
                {
                    "name": m.name,
                    "path": shown(m.path),
                    "layout": m.layout,
                    "format": m.format,
                    "size_bytes": m.size_bytes,
                    "architecture": m.architecture,
                    "quantization": m.quantization,
                    "parameters": m.parameters,
                    "loadable": m.loadable is None,
                    "why_not": m.loadable,
                }
                for m in found.models
            ],
            "pairs": [{"target": p.target.name, "draft": p.draft.name if p.draft else None} for p in pairs],
            "skipped": [{"path": shown(s.path), "reason": s.reason} for s in skipped],
        }
        print(json.dumps(record, indent=2))
        return 0
    searched = ", ".join(shown(r.path) for r in found.roots)
    if not found.models:
        print(f"no models found (searched {searched})")
    for m in found.models:
        note = "" if m.loadable is None else f"  ✗ {m.loadable}"
        size = human_size(m.size_bytes)
        print(f"{m.name}  [{m.layout}] {m.architecture} {m.quantization}, {size}  {shown(m.path)}{note}")
    for s in skipped:
        print(f"skipped {shown(s.path)}: {s.reason}")
    if pairs:
        print("\nproposed pairs (n-gram lookup always available; `localspec models --add N` adds one):")
        for i, pair in enumerate(pairs, 1):
            draft = f"draft {pair.draft.name}" if pair.draft else "no draft with the same tokenizer"
            print(f"  {i}. {pair.target.name}: {draft}")
    return 0
