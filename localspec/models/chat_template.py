"""A tokenizer's chat template applied to messages, as a plain list of token ids."""

from __future__ import annotations


def template_ids(
    tokenizer, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None
) -> list[int]:
    """apply_chat_template(tokenize=True), unwrapped: some tokenizers return a BatchEncoding or a dict with
    input_ids instead of the list. tools: OpenAI-style function tools, for a template that reads `tools`."""
    extra = {"tools": tools} if tools else {}
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True, **extra)
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    return list(out)
