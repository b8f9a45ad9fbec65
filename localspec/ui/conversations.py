"""The saved-conversations panel: list, reopen, rename, delete (with confirmation), export as JSON or Markdown."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Optional

import gradio as gr

from localspec.config import ConfigError

from . import tempfiles
from .handlers import answer_stats_html, events_json, owner_of
from .recorder import Recorder, turns_from_conversation
from .render import NO_COMPARE, status_html, transcript_html
from .turns import AssistantTurn, turns_from_state


def conversation_label(summary) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(summary.updated_at))
    return f"{'[incomplete] ' if summary.incomplete else ''}{summary.title} · {when}"


def _id(value) -> Optional[int]:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class ConversationHandlers:
    def __init__(self, store, recorder: Recorder, manager) -> None:
        self.store, self.recorder, self.manager = store, recorder, manager
        self.export_dir = Path(tempfile.mkdtemp(prefix="localspec-export-", dir=tempfiles.folder()))

    def choices(self) -> list[tuple[str, int]]:
        return [(conversation_label(s), s.id) for s in self.store.list_conversations()]

    def refresh(self, request: gr.Request = None):
        current = self.recorder.conversation_of(owner_of(request))
        return gr.update(choices=self.choices(), value=current)

    def open(self, conversation_id, colour, request: gr.Request = None):
        """Outputs: transcript, stats, status, events, state, title box."""
        cid = _id(conversation_id)
        if cid is None:
            return (
                gr.skip(),
                gr.skip(),
                status_html("Choose a conversation to open.", "error"),
                gr.skip(),
                gr.skip(),
                gr.skip(),
            )
        try:
            conversation = self.store.get_conversation(cid)
        except ConfigError as exc:
            return gr.skip(), gr.skip(), status_html(str(exc), "error"), gr.skip(), gr.skip(), gr.skip()
        owner = owner_of(request)
        self.manager.cancel(owner)  # an answer still streaming in this tab stops (and stays saved where it was)
        self.recorder.set_conversation(owner, cid)
        turns = turns_from_conversation(conversation)
        last = next((t for t in reversed(turns_from_state(turns)) if isinstance(t, AssistantTurn)), None)
        note = " Its last answer is incomplete (the app stopped while it streamed)." if conversation.incomplete else ""
        return (
            transcript_html(turns, colour),
            answer_stats_html(last, last.finish_reason if last else None),
            status_html(f"Opened “{conversation.title}”.{note} New messages continue it."),
            events_json(last),
            turns,
            conversation.title,
        )

    def rename(self, conversation_id, title):
        """Outputs: list, status."""
        cid = _id(conversation_id)
        if cid is None:
            return gr.skip(), status_html("Choose a conversation to rename.", "error")
        try:
            self.store.rename_conversation(cid, str(title or ""))
        except ConfigError as exc:
            return gr.skip(), status_html(str(exc), "error")
        return gr.update(choices=self.choices(), value=cid), status_html("Renamed.")

    def ask_delete(self, conversation_id):
        """Outputs: confirm button, cancel button, status."""
        if _id(conversation_id) is None:
            return gr.skip(), gr.skip(), status_html("Choose a conversation to delete.", "error")
        return (
            gr.update(visible=True),
            gr.update(visible=True),
            status_html("Delete this conversation for good? Press “Confirm delete” (or Cancel)."),
        )

    def delete(self, conversation_id):
        """Outputs: list, confirm button, cancel button, status."""
        cid = _id(conversation_id)
        hidden = gr.update(visible=False)
        if cid is None:
            return gr.skip(), hidden, hidden, status_html("Choose a conversation to delete.", "error")
        try:
            title = self.store.get_conversation(cid).title
            self.store.delete_conversation(cid)
        except ConfigError as exc:
            return gr.skip(), hidden, hidden, status_html(str(exc), "error")
        self.recorder.forget(cid)
        return gr.update(choices=self.choices(), value=None), hidden, hidden, status_html(f"Deleted “{title}”.")

    def cancel_delete(self):
        hidden = gr.update(visible=False)
        return hidden, hidden, status_html("Nothing was deleted.")

    def export(self, conversation_id, fmt: str):
        """Outputs: file, status."""
        cid = _id(conversation_id)
        if cid is None:
            return None, status_html("Choose a conversation to export.", "error")
        try:
            conversation = self.store.get_conversation(cid)
            text = self.store.export_json(cid) if fmt == "json" else self.store.export_markdown(cid)
        except ConfigError as exc:
            return None, status_html(str(exc), "error")
        stem = re.sub(r"[^A-Za-z0-9_-]+", "-", conversation.title).strip("-")[:40] or "conversation"
        path = self.export_dir / f"{stem}-{cid}.{'json' if fmt == 'json' else 'md'}"
        path.write_text(text, encoding="utf-8")
        return str(path), status_html(f"Exported “{conversation.title}” as {fmt.upper()}.")


def conversations_panel(store, recorder: Recorder, manager, parts: dict) -> ConversationHandlers:
    """Render the panel where it is called (inside a Blocks column) and wire its events."""
    handlers = ConversationHandlers(store, recorder, manager)
    with gr.Accordion("Saved conversations", open=False, elem_id="ls-conversations"):
        chooser = gr.Dropdown(
            handlers.choices(),
            value=None,
            label="Conversation",
            interactive=True,
            allow_custom_value=True,  # the list changes in other tabs; ids are checked here
            elem_id="ls-conversation",
        )
        with gr.Row():
            open_button = gr.Button("Open", size="sm", elem_id="ls-open")
            refresh = gr.Button("Refresh list", size="sm", elem_id="ls-refresh")
        with gr.Row(equal_height=True):
            title = gr.Textbox(label="Title", max_lines=1, scale=3, elem_id="ls-title")
            rename = gr.Button("Rename", size="sm", scale=1, elem_id="ls-rename")
        with gr.Row():
            delete = gr.Button("Delete…", size="sm", elem_id="ls-delete")
            confirm = gr.Button("Confirm delete", size="sm", variant="stop", visible=False, elem_id="ls-confirm")
            cancel = gr.Button("Cancel", size="sm", visible=False, elem_id="ls-cancel-delete")
        with gr.Row():
            export_json = gr.Button("Export JSON", size="sm", elem_id="ls-export-json")
            export_md = gr.Button("Export Markdown", size="sm", elem_id="ls-export-md")
        exported = gr.File(label="Exported file", interactive=False, elem_id="ls-exported")

    status, turns = parts["status"], parts["turns"]
    open_button.click(
        handlers.open,
        [chooser, parts["colour"]],
        [parts["transcript"], parts["stats"], status, parts["events"], turns, title],
        api_name="open_conversation",
    )
    if "compare_panel" in parts:  # the compare panel belongs to an answer of the conversation shown before
        open_button.click(lambda: NO_COMPARE, None, [parts["compare_panel"]], api_name=False, queue=False)
    refresh.click(handlers.refresh, None, [chooser], api_name="list_conversations")
    rename.click(handlers.rename, [chooser, title], [chooser, status], api_name="rename_conversation")
    delete.click(handlers.ask_delete, [chooser], [confirm, cancel, status], api_name=False)
    confirm.click(handlers.delete, [chooser], [chooser, confirm, cancel, status], api_name="delete_conversation")
    cancel.click(handlers.cancel_delete, None, [confirm, cancel, status], api_name=False)
    export_json.click(lambda cid: handlers.export(cid, "json"), [chooser], [exported, status], api_name="export_json")
    export_md.click(
        lambda cid: handlers.export(cid, "markdown"), [chooser], [exported, status], api_name="export_markdown"
    )
    parts["refresh_list"] = (handlers.refresh, chooser)
    return handlers
