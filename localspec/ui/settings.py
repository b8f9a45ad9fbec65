"""Control values from the browser (or an API client) → validated SamplingParams and proposer/K choices."""
from __future__ import annotations

import math
from typing import Any, Optional

from localspec.config import K_NAME, ConfigError, SamplingParams, check_k, check_seed

PROPOSER_LABELS = {"draft": "draft model", "ngram": "n-gram", "head": "trained head",
                   "ngram+head": "n-gram, else head", "none": "off"}


def proposer_label(proposer: Optional[str]) -> Optional[str]:
    return PROPOSER_LABELS.get(proposer, proposer)


def answer_label(model: Optional[str], proposer: Optional[str], k: Optional[int]) -> str:
    """The line above an answer, live and reopened alike: model · proposer · K."""
    parts = (model, proposer_label(proposer), f"K={k}" if k and proposer != "none" else None)
    return " · ".join(part for part in parts if part)


def _number(value: Any, name: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{name} is empty; enter a number")
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number (got {value!r})")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name} must be a number that fits (got {str(value)[:40]!r})") from None
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be a finite number (got {value!r})")
    return number


def whole(value: Any, name: str) -> int:
    number = _number(value, name)
    if number != int(number):
        raise ConfigError(f"{name} must be a whole number (got {value!r})")
    return int(number)


def read_sampling(temperature: Any, top_p: Any, top_k: Any, max_new_tokens: Any, seed: Any) -> SamplingParams:
    """Raises ConfigError with a message for the user on any bad value."""
    seed_value = check_seed(whole(seed, "seed"))
    return SamplingParams(
        temperature=_number(temperature, "temperature"),
        top_p=_number(top_p, "top-p"),
        top_k=whole(top_k, "top-k"),
        max_new_tokens=whole(max_new_tokens, "max new tokens"),
        seed=seed_value,
    ).validate()


def read_k(k: Any) -> int:
    return check_k(whole(k, "K"), K_NAME)


def read_proposer(proposer: Any, available: tuple[str, ...]) -> str:
    name = str(proposer or "").strip()
    if name not in available:
        shown = ", ".join(f"{proposer_label(p)} ({p})" for p in available)
        raise ConfigError(f"proposer {name!r} is not available for this model pair; choose one of: {shown}")
    return name


def sampling_dict(sampling: SamplingParams) -> dict:
    return {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "max_new_tokens": sampling.max_new_tokens, "seed": sampling.seed}


def proposer_choices(available: tuple[str, ...]) -> list[tuple[str, str]]:
    order = ("draft", "head", "ngram+head", "ngram", "none")
    return [(PROPOSER_LABELS[p], p) for p in order if p in available]


def first_difference(a: list[int], b: list[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
