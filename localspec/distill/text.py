"""Offline text for teacher-forced feature extraction: Python's standard library sources and the documentation
shipped with installed packages, each piece wrapped as an assistant answer in the target's chat template (so the
head sees the same context shape as in a chat)."""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from localspec.models.chat_template import template_ids

CODE_ASKS = (
    "Show me the Python code of the module `{name}`.",
    "Write the next part of `{name}` in Python.",
    "Complete this Python code from `{name}`.",
)
PROSE_ASKS = ("Explain {name}.", "Write the documentation for {name}.", "Tell me about {name}.")


def _pieces(text: str, chars: int) -> Iterator[str]:
    """Split at blank lines into pieces of about `chars` characters."""
    piece = []
    size = 0
    for block in text.split("\n\n"):
        piece.append(block)
        size += len(block) + 2
        if size >= chars:
            yield "\n\n".join(piece).strip()
            piece, size = [], 0
    if size > chars // 4:
        yield "\n\n".join(piece).strip()


def offline_documents(seed: int = 0, chars: int = 1500, extra_roots: tuple = ()) -> list[tuple[str, str]]:
    """(user ask, assistant text) pairs from stdlib sources and package docs, shuffled."""
    rng = random.Random(seed)
    docs: list[tuple[str, str]] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for piece in _pieces(text, chars):
            docs.append((rng.choice(CODE_ASKS).format(name=path.stem), piece))
    roots = [Path(sysconfig.get_paths()["purelib"])] + [Path(r) for r in extra_roots]
    for name, text in package_docs(roots, (".md", ".rst", ".txt")):
        for piece in _pieces(text, chars):
            docs.append((rng.choice(PROSE_ASKS).format(name=name), piece))
    rng.shuffle(docs)
    return docs


def package_docs(roots: list[Path], suffixes: tuple[str, ...], limit: int = 2000) -> Iterator[tuple[str, str]]:
    """(name, text) of the documentation files under each root: the folder's name for a README or index."""
    for root in roots:
        for path in sorted(p for suffix in suffixes for p in root.rglob("*" + suffix))[:limit]:
            if "LICENSE" in path.name.upper() or path.stat().st_size > 400_000:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            yield (path.parent.name if path.stem.lower() in ("readme", "index") else path.stem.replace("_", " ")), text


def chat_ids(tokenizer, ask: str, answer: str) -> list[int]:
    messages = [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
    return template_ids(tokenizer, messages, add_generation_prompt=False)
