"""Training prompts for the task types a chat app meets (translation, summarization, extraction, questions over a
pasted document, short factual questions, math word problems, everyday and multi-turn chat), made from text that
ships offline: the prose docstrings of Python's standard library and the documentation of installed packages.

Words: a *document* is a piece of offline prose (a few hundred characters, whole paragraphs); a *prompt* is what a
user sends, either one message (str) or a conversation (tuple of turns, user first, alternating, user last).

What stays out: the modules whose docstrings the tuning and evaluation sets paste (`PROMPT_SET_MODULES`), so no
document of the evaluation set is ever trained on; the asks below were written for this corpus, not taken from
either set. Math comes from the GSM8K training questions in ../shared/data (a tuning source by the rule in
docs/usage.md).
"""

from __future__ import annotations

import ast
import functools
import json
import random
import sysconfig
from pathlib import Path
from typing import Union

from .text import package_docs

Prompt = Union[str, tuple[str, ...]]  # one user message, or turns user, assistant, …, user

# the docstrings scripts/make_prompt_sets.py pastes into the tuning and evaluation sets
PROMPT_SET_MODULES = frozenset({"argparse", "csv", "difflib", "heapq", "json", "sqlite3"})
TASK_TYPES = (
    "translation",
    "summarization",
    "extraction",
    "document-qa",
    "factual-qa",
    "math",
    "chat",
    "multi-turn",
)
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Polish", "Swedish")
TRANSLATION_ASKS = (
    "Translate into {lang}:\n\n{text}",
    "Please translate this to {lang}: {text}",
    'How would you say "{text}" in {lang}?',
    "Translate the following from English to {lang}, keeping the technical terms.\n\n{text}",
    "{text}\n\nCan you put that into {lang}?",
)
SUMMARY_ASKS = (
    "Summarize this in two or three sentences:\n\n{doc}",
    "{doc}\n\nWhat is the gist of the text above?",
    "Give me a short summary of this documentation.\n\n{doc}",
    "Condense the following into a few bullet points.\n\n{doc}",
    "tl;dr please:\n\n{doc}",
    "Write a one-line summary of this text, then a slightly longer one.\n\n{doc}",
)
EXTRACTION_ASKS = (
    "List every function, class, method or option that this text names, one per line.\n\n{doc}",
    "From the text below, pull out each technical term and what it means.\n\n{doc}",
    "{doc}\n\nExtract all numbers, versions or sizes mentioned above, with what each refers to.",
    "Make a table with two columns, name and purpose, of the things described here.\n\n{doc}",
    "Return a JSON object with the keys subject, key_terms and audience for this text.\n\n{doc}",
    "Which words in the following text are code identifiers? Give them as a comma-separated list.\n\n{doc}",
)
DOCUMENT_QA_ASKS = (
    "{doc}\n\nBased only on the text above, what is this for?",
    "Here is part of a manual:\n\n{doc}\n\nQuestion: what does it warn about, if anything?",
    "{doc}\n\nAccording to this, how do I use it? Answer from the text.",
    "Read the following and tell me what the default behaviour is.\n\n{doc}",
    "{doc}\n\nDoes the text say what happens on an error? Quote the relevant part.",
    "I pasted some docs below. Which part would matter most to a beginner, and why?\n\n{doc}",
)
FACT_SUBJECTS = (
    "the speed of light",
    "the Great Wall of China",
    "penicillin",
    "the Eiffel Tower",
    "Mount Everest",
    "the Pacific Ocean",
    "the Roman alphabet",
    "the telephone",
    "the periodic table",
    "the Amazon river",
    "the Olympic Games",
    "the theory of evolution",
    "the steam engine",
    "the Sahara desert",
    "the first computer",
    "the Magna Carta",
    "insulin",
    "the Mona Lisa",
    "the metric system",
    "the Panama Canal",
    "jazz",
    "the bicycle",
    "the Berlin Wall",
    "the Milky Way",
    "tea",
    "the International Space Station",
    "Shakespeare's plays",
    "the compass",
    "chocolate",
    "the Silk Road",
)
FACT_ASKS = (
    "What is {t}?",
    "Quick question: where does {t} come from?",
    "In one sentence, why does {t} matter?",
    "Tell me one surprising fact about {t}.",
    "Who is best known for {t}, if anyone?",
    "How old is {t}, roughly?",
)
CHAT_ASKS = (
    "hey, can you help me with {t}?",
    "I have a free afternoon. Any ideas that involve {t}?",
    "What's your take on {t}?",
    "My friend keeps talking about {t}. What should I know so I can follow along?",
    "Any quick advice on {t}? I'm a total beginner.",
    "Can you cheer me up with a short joke about {t}?",
    "I'm writing a card for a friend who loves {t}. Can you suggest a line or two?",
    "good morning! tell me something nice about {t}",
)
FOLLOW_UPS = (
    "Can you make that shorter?",
    "Give me a concrete example.",
    "Now explain it as if I were ten years old.",
    "Turn your answer into a bulleted list.",
    "What did you mean by the first part?",
    "Translate your last answer into Spanish.",
    "Thanks! What should I read next on this?",
    "Is there anything in that which is often misunderstood?",
)
FIRST_TURN_ASKS = ("Tell me about {name}.", "What is {name}?", "Explain {name} briefly.")


def prompt_messages(prompt: Prompt) -> list[dict]:
    """A prompt as chat messages: turns alternate user, assistant, …, user."""
    turns = (prompt,) if isinstance(prompt, str) else prompt
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


@functools.lru_cache(maxsize=4)
def prose_documents(min_chars: int = 300, max_chars: int = 1200) -> tuple[tuple[str, str], ...]:
    """(name, text): whole paragraphs of stdlib docstrings (modules, classes, functions) and package docs. Parsing
    the standard library takes seconds, so the result is kept (a tuple: callers shuffle their own copy)."""
    docs: list[tuple[str, str]] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        if path.stem in PROMPT_SET_MODULES or path.stem.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        nodes = [tree] + [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
        for node in nodes:
            text = ast.get_docstring(node) or ""
            name = path.stem if node is tree else f"{path.stem}.{node.name}"
            docs.extend((name, piece) for piece in _paragraph_pieces(text, min_chars, max_chars))
    for name, text in package_docs([Path(sysconfig.get_paths()["purelib"])], (".md", ".rst")):
        docs.extend((name, piece) for piece in _paragraph_pieces(text, min_chars, max_chars))
    return tuple(docs)


def _paragraph_pieces(text: str, min_chars: int, max_chars: int) -> list[str]:
    """Consecutive whole paragraphs of min_chars..max_chars characters; code-only paragraphs are skipped."""
    pieces, piece = [], []
    for block in (b.strip() for b in text.split("\n\n")):
        if not block or sum(c.isalpha() for c in block) < len(block) // 2:
            continue
        piece.append(block)
        size = sum(len(p) + 2 for p in piece)
        if size >= min_chars:
            if size <= max_chars:
                pieces.append("\n\n".join(piece))
            piece = []
    return pieces


def first_sentences(text: str, count: int) -> str:
    flat = " ".join(text.split())
    parts = flat.split(". ")
    return ". ".join(parts[:count]).rstrip(".") + "."


def gsm8k_questions(data_dir: Path) -> list[str]:
    path = Path(data_dir) / "gsm8k_train_400.jsonl"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line)["question"] for line in fh if line.strip()]


def task_prompts(per_type: int, data_dir: Path | None = None, seed: int = 0) -> dict[str, list[Prompt]]:
    """Up to per_type prompts of every task type (math: GSM8K training questions, when data_dir holds them)."""
    from .data import TOPICS

    rng = random.Random(seed)
    docs = list(prose_documents())
    rng.shuffle(docs)

    def pick_docs(n: int) -> list[tuple[str, str]]:
        return [docs[rng.randrange(len(docs))] for _ in range(n)] if docs else []

    def filled(asks: tuple[str, ...], n: int) -> list[str]:
        return [rng.choice(asks).format(doc=text) for _, text in pick_docs(n)]

    subjects = FACT_SUBJECTS + TOPICS
    out: dict[str, list[Prompt]] = {
        "translation": [
            rng.choice(TRANSLATION_ASKS).format(
                lang=rng.choice(LANGUAGES), text=first_sentences(text, rng.randint(1, 3))
            )
            for _, text in pick_docs(per_type)
        ],
        "summarization": filled(SUMMARY_ASKS, per_type),
        "extraction": filled(EXTRACTION_ASKS, per_type),
        "document-qa": filled(DOCUMENT_QA_ASKS, per_type),
        "factual-qa": [rng.choice(FACT_ASKS).format(t=rng.choice(subjects)) for _ in range(per_type)],
        "math": gsm8k_questions(data_dir)[:per_type] if data_dir is not None else [],
        "chat": [rng.choice(CHAT_ASKS).format(t=rng.choice(TOPICS)) for _ in range(per_type)],
        "multi-turn": [
            (rng.choice(FIRST_TURN_ASKS).format(name=name), text, rng.choice(FOLLOW_UPS))
            for name, text in pick_docs(per_type)
        ],
    }
    return {kind: list(dict.fromkeys(prompts)) for kind, prompts in out.items()}
