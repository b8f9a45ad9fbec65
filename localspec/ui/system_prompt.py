"""The system prompt: the message every answer of a conversation is given before the conversation itself.

Each conversation keeps its own (saved with it, so reopening it brings it back); a new chat starts from the default,
which "Make default" saves: in the conversation store, so every tab and the next start share it, or for the life of
the process in a window that saves nothing.
"""

from __future__ import annotations

import threading
from typing import Any

import gradio as gr

from localspec.config import ConfigError

from .render import status_html

DEFAULT_KEY = "default_system_prompt"  # its row in the store's settings table
INFO = "Given to the model before the conversation, with every answer of this chat. A new chat starts from the default."


def system_text(value: Any) -> str:
    """The system prompt box's value as text ("" for none)."""
    return "" if value is None else str(value)


class SystemPrompts:
    """The default system prompt, read and saved in one place."""

    def __init__(self, store: Any = None) -> None:
        self.store = store
        self._default = ""  # without a store
        self._lock = threading.Lock()

    def default(self) -> str:
        if self.store is None:
            return self._default
        try:
            return self.store.get_setting(DEFAULT_KEY) or ""
        except ConfigError:  # an unreadable setting never keeps the window from opening
            return ""

    def save_default(self, text: Any):
        """ "Make default": the box's text becomes what new chats start with. Outputs: status."""
        text = system_text(text)
        try:
            if self.store is not None:
                self.store.set_setting(DEFAULT_KEY, text)
            else:
                with self._lock:
                    self._default = text
        except ConfigError as exc:
            return status_html(f"The default system prompt was not saved: {exc}", "error")
        if not text.strip():
            return status_html("New chats now start without a system prompt.")
        return status_html("Saved: new chats start with this system prompt.")


def system_prompt_box(prompts: SystemPrompts) -> tuple[gr.Textbox, gr.Button]:
    """Render the box and its "Make default" button where called (the settings sidebar)."""
    box = gr.Textbox(
        prompts.default(),
        label="System prompt",
        info=INFO,
        placeholder="e.g. You are a concise assistant. Answer in English.",
        lines=2,
        max_lines=8,
        elem_id="ls-system",
    )
    make_default = gr.Button("Make default for new chats", size="sm", elem_id="ls-system-default")
    return box, make_default
