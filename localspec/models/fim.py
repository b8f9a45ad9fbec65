"""Fill in the middle: a prefix and a suffix → the prompt ids a code model was trained to complete the middle of.

Each family marks the parts with its own special tokens, in prefix-suffix-middle order (PSM: the text the model
writes next is the middle):

  StarCoder, StarCoder2, SantaCoder       <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>
  Qwen2.5-Coder, CodeGemma                <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>
  CodeLlama                               <PRE> {prefix} <SUF>{suffix} <MID>   (tokens "▁<PRE>", "▁<SUF>", "▁<MID>")
  DeepSeek-Coder                          <｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>

The first style whose three tokens are all in the tokenizer's vocabulary is used; a tokenizer with none has no FIM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from localspec.config import ConfigError


@dataclass(frozen=True)
class FimStyle:
    family: str
    prefix: str
    suffix: str
    middle: str


FIM_STYLES = (
    FimStyle("StarCoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    FimStyle("Qwen2.5-Coder", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    FimStyle("CodeLlama", "▁<PRE>", "▁<SUF>", "▁<MID>"),
    FimStyle("DeepSeek-Coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)


def fim_style(tokenizer) -> Optional[FimStyle]:
    """The tokenizer's FIM style, or None when it has no style's three tokens."""
    vocab = tokenizer.get_vocab()
    return next((s for s in FIM_STYLES if all(t in vocab for t in (s.prefix, s.suffix, s.middle))), None)


def _lead(tokenizer) -> list[int]:
    """The ids the tokenizer puts before any text (a BOS for Llama-style tokenizers, none for most others)."""
    full = tokenizer.encode("a")
    bare = tokenizer.encode("a", add_special_tokens=False)
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return list(full[:start])
    return []


def fim_prompt_ids(tokenizer, prefix: str, suffix: str) -> list[int]:
    """[lead] <prefix> prefix <suffix> suffix <middle>, each text encoded alone (as a plain completion's prompt is);
    a ConfigError when the tokenizer has no FIM tokens."""
    style = fim_style(tokenizer)
    if style is None:
        known = "; ".join(f"{s.family}: {s.prefix} {s.suffix} {s.middle}" for s in FIM_STYLES)
        raise ConfigError(
            "suffix (fill in the middle) needs a model whose tokenizer has FIM tokens, and this model has none "
            f"(known: {known}); leave suffix out to continue the prompt"
        )
    vocab = tokenizer.get_vocab()

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False)) if text else []

    return [
        *_lead(tokenizer),
        vocab[style.prefix],
        *encode(prefix),
        vocab[style.suffix],
        *encode(suffix),
        vocab[style.middle],
    ]
