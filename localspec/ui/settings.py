"""Control values from the browser (or an API client) → validated SamplingParams and proposer/K choices."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from localspec.config import ConfigError, SamplingParams, SpecConfig, check_tree_nodes
from localspec.structured.stops import check_stops, parse_stops

PROPOSER_LABELS = {
    "draft": "draft model",
    "ngram": "n-gram",
    "head": "trained head",
    "ngram+head": "n-gram, else head",
    "history": "your history",
    "history+head": "your history, else head",
    "none": "off",
}


def proposer_label(proposer: Optional[str]) -> Optional[str]:
    return PROPOSER_LABELS.get(proposer, proposer)


def answer_label(
    model: Optional[str], proposer: Optional[str], k: Optional[int], tree_nodes: Optional[int] = None
) -> str:
    """The line above an answer, live and reopened alike: model · proposer · K, or · tree N for an answer that
    drafted token trees of N nodes."""
    shape = shape_label(k, tree_nodes) if proposer != "none" else None
    return " · ".join(part for part in (model, proposer_label(proposer), shape) if part)


def shape_label(k: Optional[int], tree_nodes: Optional[int] = None) -> Optional[str]:
    """How an answer drafted, in the answer's line and the stats panel: "tree N" (token trees of N nodes) or "K=k"."""
    return f"tree {tree_nodes}" if tree_nodes else f"K={k}" if k else None


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


def _exact(value: Any, name: str) -> int | float:
    """A control's value as a number: an int when it is whole (a browser sends 3.0 for 3), else the float, which
    the validation below refuses as "not a whole number" where a whole number is needed."""
    number = _number(value, name)
    return int(number) if number.is_integer() else number


def whole(value: Any, name: str) -> int:
    number = _exact(value, name)
    if not isinstance(number, int):
        raise ConfigError(f"{name} must be a whole number (got {value!r})")
    return number


def read_sampling(
    temperature: Any, top_p: Any, top_k: Any, max_new_tokens: Any, seed: Any, repetition_penalty: Any = 1.0
) -> SamplingParams:
    """Control values → SamplingParams, checked by SamplingParams.validate (the limits the CLI and API share).
    Raises ConfigError with a message for the user on any bad value."""
    return SamplingParams(
        temperature=_number(temperature, "temperature"),
        top_p=_number(top_p, "top-p"),
        top_k=_exact(top_k, "top-k"),
        max_new_tokens=_exact(max_new_tokens, "max new tokens"),
        seed=_exact(seed, "seed"),
        repetition_penalty=_number(repetition_penalty, "repetition penalty"),
    ).validate()


def read_stops(text: Any) -> tuple[str, ...]:
    """The "Stop strings" box → stop strings (structured/stops.py), within the API's limits."""
    if text is None:
        return ()
    if not isinstance(text, str):
        raise ConfigError(f"stop strings must be text (got {type(text).__name__})")
    return check_stops(parse_stops(text), "the stop strings box")


def read_saved(settings: dict) -> tuple[SamplingParams, tuple[str, ...]]:
    """An answer's saved settings (sampling_dict) → its SamplingParams and stop strings, checked as the controls'."""
    values = dict(settings)
    stops = values.pop("stop", None) or ()
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise ConfigError("the saved stop strings are not a list of text")
    return read_sampling(**values), tuple(stops)


def read_k(k: Any) -> int:
    """K checked by SpecConfig.validate."""
    return SpecConfig(k=_exact(k, "K")).validate().k


def read_tree_nodes(tree_nodes: Any) -> int:
    """The tree-nodes control checked by check_tree_nodes (0 = chains of K)."""
    return check_tree_nodes(_exact(tree_nodes, "tree nodes"))


@dataclass(frozen=True)
class Speculation:
    """The speculation controls of one answer: the proposer as chosen (checked against the pair when the answer
    starts, since the pair may change before then), K and the tree size as checked here."""

    proposer: str
    k: int
    tree_nodes: int = 0
    adaptive: Optional[bool] = None  # None: the pair's setting; False: keep speculating even where it does not pay


def read_speculation(proposer: Any, k: Any, tree_nodes: Any, keep_speculating: Any = False) -> Speculation:
    """keep_speculating: the "keep speculating anyway" switch (adaptive K off for this answer)."""
    adaptive = False if keep_speculating is True else None
    return Speculation(str(proposer or ""), read_k(k), read_tree_nodes(tree_nodes), adaptive)


def read_proposer(proposer: Any, available: tuple[str, ...]) -> str:
    name = str(proposer or "").strip()
    if name not in available:
        shown = ", ".join(f"{proposer_label(p)} ({p})" for p in available)
        raise ConfigError(f"proposer {name!r} is not available for this model pair; choose one of: {shown}")
    return name


def sampling_dict(sampling: SamplingParams, stops: tuple[str, ...] = ()) -> dict:
    """What an answer saves of its settings, for Compare to repeat them (read_saved reads it back)."""
    saved = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_new_tokens": sampling.max_new_tokens,
        "seed": sampling.seed,
        "repetition_penalty": sampling.repetition_penalty,
    }
    return {**saved, "stop": list(stops)} if stops else saved


def proposer_choices(available: tuple[str, ...]) -> list[tuple[str, str]]:
    order = ("draft", "head", "ngram+head", "history+head", "ngram", "history", "none")
    return [(PROPOSER_LABELS[p], p) for p in order if p in available]


def first_difference(a: list[int], b: list[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
