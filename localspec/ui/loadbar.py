"""The progress bar of a model pair that loads: its stages counted from the pair, advanced by each progress message.

A pair loads in these stages (models/loading.py says each one through its progress callback): converting a
packaged GGUF that is not cached yet, loading the target, the same two for a draft, and "Ready.". The bar shows
how many of them have been said; the switch handler's own "Loaded … in … s" ends it.
"""

from __future__ import annotations

from html import escape
from typing import Optional

from localspec.config import ModelSpec, PairSpec


def _converts(spec: Optional[ModelSpec], weights: bool) -> bool:
    """True when loading spec will first convert a packaged GGUF (its dequantized folder is not in the cache yet). A
    target on the file's blocks (quant gguf / auto) converts nothing; a draft loads dequantized (`weights`)."""
    from localspec.config import ConfigError
    from localspec.models.loading import gguf_file, gguf_folder_ready
    from localspec.models.registry import GGUF_PREFIX

    if spec is None or not str(spec.source).startswith(GGUF_PREFIX):
        return False
    if not weights and spec.quant in ("gguf", "auto"):  # on its own blocks: config and tokenizer from the header
        return False
    try:
        return not gguf_folder_ready(gguf_file(spec.source))
    except (ConfigError, OSError):  # the load itself will say what is wrong
        return False


def expected_stages(pair: PairSpec) -> int:
    stages = 1 + _converts(pair.target, weights=False)  # the target, and its conversion
    if pair.draft is not None:
        stages += 1 + _converts(pair.draft, weights=True)
    return stages + 1  # "Ready."


class LoadProgress:
    """Counts a pair's progress messages against its expected stages."""

    def __init__(self, name: Optional[str], pairs: list[PairSpec]) -> None:
        pair = next((p for p in pairs if p.name == name), None)  # an unknown name fails in the load itself
        self.name = name
        self.total = expected_stages(pair) if pair is not None else 1
        self.done = 0
        self.message: Optional[str] = None  # the last stage said

    def advance(self, message: str) -> str:
        """One more stage said: the status line with the bar."""
        self.done += 1
        self.message = message
        return self.html(message)

    def html(self, message: Optional[str] = None) -> str:
        shown = min(self.done, self.total)
        text = message or self.message or f"Loading {self.name}…"
        return (
            f'<div class="ls-status ls-status-info ls-loading">{escape(text)}'
            f'<progress class="ls-load" max="{self.total}" value="{shown}"></progress>'
            f'<span class="ls-load-stage">stage {shown} of {self.total}</span></div>'
        )
