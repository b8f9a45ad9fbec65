"""Control values from the browser (or an API client) → validated SamplingParams and proposer/K choices."""
from __future__ import annotations

import math
from typing import Any, Optional

from localspec.config import ConfigError, SamplingParams

MAX_SEED = 2**63  # torch.Generator.manual_seed takes a signed 64-bit value
PROPOSER_LABELS = {"draft": "draft model", "ngram": "n-gram", "head": "trained head",
                   "ngram+head": "n-gram, else head", "none": "off"}


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
    seed_value = whole(seed, "seed")
    if not 0 <= seed_value < MAX_SEED:
        raise ConfigError(f"seed must be a whole number from 0 to {MAX_SEED - 1} (got {seed_value})")
    return SamplingParams(
        temperature=_number(temperature, "temperature"),
        top_p=_number(top_p, "top-p"),
        top_k=whole(top_k, "top-k"),
        max_new_tokens=whole(max_new_tokens, "max new tokens"),
        seed=seed_value,
    ).validate()


def read_k(k: Any) -> int:
    value = whole(k, "K")
    if not 1 <= value <= 16:
        raise ConfigError(f"K (draft tokens per step) must be between 1 and 16 (got {value})")
    return value


def read_proposer(proposer: Any, available: tuple[str, ...]) -> str:
    name = str(proposer or "").strip()
    if name not in available:
        shown = ", ".join(f"{PROPOSER_LABELS.get(p, p)} ({p})" for p in available)
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
