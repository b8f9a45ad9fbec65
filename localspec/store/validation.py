"""Small checks for what arrives from outside (the browser, a file): each ends in a ConfigError with a message
meant to be shown as is, or returns a cleaned value."""

from __future__ import annotations

import math
from typing import Any

from localspec.config import ConfigError, whole_number

__all__ = ["ROLES", "clean_text", "finite_number", "validate_messages", "whole_number"]

ROLES: tuple[str, ...] = ("system", "user", "assistant")
# why an answer ended, in words (the window's answer notes and stats, and the Markdown export)
FINISH_WORDS: dict[str, str] = {
    "stop": "finished",
    "length": "reached the max new tokens",
    "cancelled": "stopped by you (partial answer kept)",
    "error": "failed",
    "incomplete": "incomplete (the app stopped during this answer)",
}


def finish_words(reason: Any) -> str:
    """A finish reason (stop | length | cancelled | error | incomplete) in words; an unknown one as it is."""
    return FINISH_WORDS.get(str(reason), str(reason))


def clean_text(value: Any, what: str = "text") -> str:
    """A str that can be encoded as UTF-8: each lone surrogate (JSON from a browser can carry them, and SQLite and the
    tokenizers refuse them) becomes U+FFFD, the replacement character. Anything that is not a str is refused."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be text (got {type(value).__name__})")
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in value)


def validate_messages(messages: Any) -> list[dict]:
    """A chat history from the UI → a list of {'role', 'content'} dicts with known roles and UTF-8-safe text.

    Raises ConfigError naming the first bad message. Does not judge emptiness (the chat layer does, with its own
    message), so an empty content string passes.
    """
    if not isinstance(messages, (list, tuple)):
        raise ConfigError(f"the conversation must be a list of messages (got {type(messages).__name__})")
    cleaned = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ConfigError(
                f"message {index + 1} must be a mapping with 'role' and 'content' (got {type(message).__name__})"
            )
        role = message.get("role")
        if role not in ROLES:
            raise ConfigError(f"message {index + 1} has role {role!r}; choose one of {', '.join(ROLES)}")
        content = message.get("content", "")
        if content is None:
            content = ""
        cleaned.append({"role": role, "content": clean_text(content, f"message {index + 1}'s content")})
    return cleaned


def finite_number(value: Any, what: str) -> float:
    """A real, finite number (bool refused) or a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number (got {value!r})")
    if not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number (got {value!r})")
    return float(value)
