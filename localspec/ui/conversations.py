"""The saved-conversations sidebar: a list searchable by title and message text, full titles (shortened on screen
only), reopen on click, rename in place, delete with undo, export as JSON or Markdown, and the answer streaming in the
app followed in a page loaded while it streams.

Delete hides the conversation from the list at once and deletes it from the store UNDO_S seconds later (or when the
tab deletes another one, or when the app stops); Undo within that time brings it back. The API's delete_conversation
deletes at once.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Optional

import gradio as gr

from localspec.config import ConfigError

from . import tempfiles
from .handlers import STOPPING, answer_stats_html, events_json, final_status, owner_of
from .recorder import Recorder, turns_from_conversation
from .render import NO_COMPARE, status_html, transcript_html
from .system_prompt import SystemPrompts, system_text
from .turns import AssistantTurn, turns_from_state

UNDO_S = 10.0  # how long a deleted conversation can be brought back
FOLLOW_S = 0.1  # how often a followed answer (follow) is read back from the store
FOLLOW_EVENT = dict(api_name=False, show_progress="hidden", concurrency_limit=None)  # it lasts as long as the answer
FOLLOWING = "Answering… (asked for before this page loaded; Stop keeps the partial answer)"
UNDO_NOTE = f" Undo brings it back within {UNDO_S:.0f} s."  # said while it can
SEARCH_WORDS = 8  # a search uses at most this many words (one SQL condition each)
FILE_STEM_CHARS = 80  # an export's file name: the title made file-safe, cut to fit every file system


def conversation_label(summary, streaming: bool = False) -> str:
    """The list's line for a conversation; streaming: an answer is being saved into it now."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(summary.updated_at))
    mark = "[answering] " if streaming else "[incomplete] " if summary.incomplete else ""
    return f"{mark}{summary.title} · {when}"


def file_stem(title: str, cid: int) -> str:
    """A file name (without extension) from the full title: letters, digits, - and _ kept, runs of anything else
    one -, cut at a word end within FILE_STEM_CHARS; the id keeps two same-titled exports apart."""
    slug = re.sub(r"[^\w-]+", "-", title, flags=re.ASCII).strip("-_")
    if len(slug) > FILE_STEM_CHARS:
        cut = slug[:FILE_STEM_CHARS]
        slug = cut[: cut.rfind("-")] if "-" in cut[FILE_STEM_CHARS // 2 :] else cut
    return f"{slug or 'conversation'}-{cid}"


def _id(value) -> Optional[int]:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass
class _PendingDelete:
    cid: int
    title: str
    timer: threading.Timer


class ConversationHandlers:
    def __init__(self, store, recorder: Recorder, manager, system_prompts: Optional[SystemPrompts] = None) -> None:
        self.store, self.recorder, self.manager = store, recorder, manager
        self.system_prompts = system_prompts or SystemPrompts(store)
        self.export_dir = Path(tempfile.mkdtemp(prefix="localspec-export-", dir=tempfiles.folder()))
        self.pending: dict[str, _PendingDelete] = {}  # each tab's deletion that can still be undone
        self.lock = threading.Lock()
        if hasattr(store, "closing"):  # the app stopping within UNDO_S of a delete still deletes
            store.closing.append(self.finish_pending)

    def finish_pending(self) -> None:
        """Every deletion still waiting for its undo goes through now (the store is about to close)."""
        with self.lock:
            pending, self.pending = list(self.pending.values()), {}
        for deletion in pending:
            deletion.timer.cancel()
            self._finish_delete_now(deletion.cid)

    def _hidden(self) -> set[int]:
        with self.lock:
            return {p.cid for p in self.pending.values()}

    def choices(self, query: str = "") -> list[tuple[str, int]]:
        """The list, newest first, of the conversations holding every word of `query` in the title or in any
        message (SEARCH_WORDS at most; any version of a message counts)."""
        words = str(query or "").split()[:SEARCH_WORDS]
        holding = self.store.conversations_holding(words) if words else None
        hidden = self._hidden()
        live = self.recorder.streaming()
        streaming = live.conversation_id if live is not None else None
        return [
            (conversation_label(s, s.id == streaming), s.id)
            for s in self.store.list_conversations()
            if s.id not in hidden and (holding is None or s.id in holding)
        ]

    def refresh(self, query: str = "", request: gr.Request = None):
        current = self.recorder.conversation_of(owner_of(request))
        choices = self.choices(query)
        query = str(query or "").strip()
        found = f"No conversation holds “{query}”." if query and not choices else ""
        return gr.update(choices=choices, value=current, info=found)

    def open(self, conversation_id, colour, request: gr.Request = None):
        """Outputs: transcript, stats, status, events, state, title box, system prompt."""
        cid = _id(conversation_id)
        skip = (gr.skip(),) * 7
        if cid is None:
            return skip[:2] + (status_html("Choose a conversation to open.", "error"),) + skip[3:]
        if cid in self._hidden():
            return (
                skip[:2]
                + (status_html("That conversation was just deleted; Undo brings it back.", "error"),)
                + skip[3:]
            )
        try:
            conversation = self.store.get_conversation(cid)
        except ConfigError as exc:
            return skip[:2] + (status_html(str(exc), "error"),) + skip[3:]
        owner = owner_of(request)
        self.manager.cancel(owner)  # an answer still streaming in this tab stops (and stays saved where it was)
        self.recorder.set_conversation(owner, cid)
        turns = turns_from_conversation(conversation)
        last = next((t for t in reversed(turns_from_state(turns)) if isinstance(t, AssistantTurn)), None)
        live = self.recorder.streaming()
        if live is not None and live.conversation_id == cid and live.owner != owner:
            note = " Its last answer is still streaming."
        elif conversation.incomplete:
            note = " Its last answer is incomplete (the app stopped while it streamed)."
        else:
            note = ""
        return (
            transcript_html(turns, colour),
            answer_stats_html(last, last.finish_reason if last else None),
            status_html(f"Opened “{conversation.title}”.{note} New messages continue it."),
            events_json(last),
            turns,
            conversation.title,
            system_text(conversation.system_prompt),
        )

    def follow(self, colour, request: gr.Request = None):
        """The answer streaming in this app, asked for in a page since reloaded or in another tab, shown in its
        conversation and read back from the store as it is saved, until it ends; Stop here stops it. Runs when a page
        loads (when the tab has no conversation open) and after a conversation is opened (when it is that answer's).
        Outputs: open's."""
        owner, skip = owner_of(request), (gr.skip(),) * 7
        live = self.recorder.streaming()
        current = self.recorder.conversation_of(owner)
        if live is None or live.conversation_id is None or current not in (None, live.conversation_id):
            yield skip
            return
        if not self.manager.follow(live.owner, owner):  # this tab's own answer, or it ended meanwhile
            yield skip
            return
        cid = live.conversation_id
        self.recorder.set_conversation(owner, cid)
        shown = None
        while self.recorder.conversation_of(owner) == cid:  # until this tab opens another conversation or clears
            ended = not self.manager.is_answering(owner)  # read before the store: the last read then sees the end
            try:
                conversation = self.store.get_conversation(cid)
            except ConfigError:  # deleted meanwhile
                return
            message = next((m for m in conversation.every if m.id == live.message_id), None)
            done = ended or message is None or message.complete
            turns = turns_from_conversation(conversation, None if done else live.message_id)
            answer = next((t for t in reversed(turns_from_state(turns)) if isinstance(t, AssistantTurn)), None)
            now = (len(message.tokens) if message else -1, done, self.manager.stopping(owner))
            if now != shown and answer is not None:
                status = final_status(answer) if done else STOPPING if now[2] else FOLLOWING
                kind = "error" if answer.finish_reason == "error" else "info"
                first = shown is None
                shown = now
                yield (
                    transcript_html(turns, colour),
                    answer_stats_html(answer, answer.finish_reason if done else None),
                    status_html(status, kind),
                    events_json(answer),
                    turns,
                    conversation.title if first else gr.skip(),
                    system_text(conversation.system_prompt) if first else gr.skip(),
                )
            if done:
                return
            time.sleep(FOLLOW_S)

    def rename(self, conversation_id, title):
        """Outputs: list, status."""
        cid = _id(conversation_id)
        if cid is None:
            return gr.skip(), status_html("Open a conversation to rename it.", "error")
        try:
            self.store.rename_conversation(cid, str(title or ""))
        except ConfigError as exc:
            return gr.skip(), status_html(str(exc), "error")
        return gr.update(choices=self.choices(), value=cid), status_html("Renamed.")

    def delete(self, conversation_id):
        """Delete at once (the API). Outputs: list, status."""
        cid = _id(conversation_id)
        if cid is None:
            return gr.skip(), status_html("Choose a conversation to delete.", "error")
        try:
            title = self.store.get_conversation(cid).title
            self.store.delete_conversation(cid)
        except ConfigError as exc:
            return gr.skip(), status_html(str(exc), "error")
        self.recorder.forget(cid)
        return gr.update(choices=self.choices(), value=None), status_html(f"Deleted “{title}”.")

    def _finish_delete(self, owner: str, cid: int) -> None:
        with self.lock:
            pending = self.pending.get(owner)
            if pending is None or pending.cid != cid:
                return
            del self.pending[owner]
        self._finish_delete_now(cid)

    def delete_with_undo(self, conversation_id, query, request: gr.Request = None):
        """Hide the conversation now, delete it UNDO_S seconds later. When it is the one open in this tab, the
        window empties too (the next message starts a new conversation, without the deleted one's history).
        Outputs: list, undo button, status, title, undo timer, then the window's: transcript, stats, events, compare,
        state, system prompt."""
        cid, owner = _id(conversation_id), owner_of(request)
        kept = (gr.skip(),) * 6  # the window's outputs, as they are
        if cid is None:
            return (
                gr.skip(),
                gr.skip(),
                status_html("Open a conversation to delete it.", "error"),
                *(gr.skip(),) * 2,
                *kept,
            )
        try:
            title = self.store.get_conversation(cid).title
        except ConfigError as exc:
            return gr.skip(), gr.skip(), status_html(str(exc), "error"), *(gr.skip(),) * 2, *kept
        with self.lock:
            earlier = self.pending.pop(owner, None)
        if earlier is not None:  # one undo at a time: the earlier deletion goes through now
            earlier.timer.cancel()
            self._finish_delete_now(earlier.cid)
        window = kept
        if self.recorder.conversation_of(owner) == cid:
            self.manager.cancel(owner)  # an answer still streaming into it stops
            self.recorder.set_conversation(owner, None)  # the next message starts a new conversation
            empty = (transcript_html([]), answer_stats_html(None, None), None, NO_COMPARE, [])
            window = (*empty, self.system_prompts.default())
        timer = threading.Timer(UNDO_S, self._finish_delete, (owner, cid))
        timer.daemon = True
        with self.lock:
            self.pending[owner] = _PendingDelete(cid, title, timer)
        timer.start()
        return (
            gr.update(choices=self.choices(query), value=None),
            gr.update(visible=True),
            status_html(f"Deleted “{title}”.{UNDO_NOTE}"),
            "",
            gr.Timer(active=True),
            *window,
        )

    @staticmethod
    def undo_expired(status):
        """The undo timer's tick: the deletion went through, so the button and the offer go. Outputs: undo
        button, status, undo timer."""
        offer = escape(UNDO_NOTE)
        shown = str(status or "")
        return (
            gr.update(visible=False),
            shown.replace(offer, "") if offer in shown else gr.skip(),
            gr.Timer(active=False),
        )

    def _finish_delete_now(self, cid: int) -> None:
        try:
            self.store.delete_conversation(cid)
        except ConfigError:  # deleted meanwhile (another tab, the API): nothing left to do
            pass
        self.recorder.forget(cid)

    def undo_delete(self, query, request: gr.Request = None):
        """Outputs: list, undo button, status, undo timer."""
        with self.lock:
            pending = self.pending.pop(owner_of(request), None)
        hidden, idle = gr.update(visible=False), gr.Timer(active=False)
        if pending is None:
            return gr.skip(), hidden, status_html("Nothing to undo: the deletion went through.", "error"), idle
        pending.timer.cancel()
        back = f"Brought back “{pending.title}”; choose it in the list to open it."
        return gr.update(choices=self.choices(query)), hidden, status_html(back), idle

    def exporter(self, fmt: str):
        """export() for one format, as a one-input event function."""
        return lambda conversation_id: self.export(conversation_id, fmt)

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
        path = self.export_dir / f"{file_stem(conversation.title, cid)}.{'json' if fmt == 'json' else 'md'}"
        path.write_text(text, encoding="utf-8")
        return str(path), status_html(f"Exported “{conversation.title}” as {fmt.upper()}.")


def conversations_panel(store, recorder: Recorder, manager, parts: dict) -> ConversationHandlers:
    """Render the sidebar's content where it is called (inside a gr.Sidebar) and wire its events."""
    handlers = ConversationHandlers(store, recorder, manager, parts.get("system_prompts"))
    search = gr.Textbox(
        placeholder="Search conversations",
        label="Search conversations",  # its accessible name; not shown
        show_label=False,
        max_lines=1,
        elem_id="ls-search",
        container=False,
    )
    chooser = gr.Radio(
        handlers.choices(),
        value=None,
        label="Saved conversations",
        interactive=True,
        elem_id="ls-conversation",
    )
    undo = gr.Button("Undo delete", size="sm", visible=False, elem_id="ls-undo")
    undo_timer = gr.Timer(UNDO_S, active=False)  # ends the undo offer when the deletion goes through
    with gr.Accordion("This conversation: rename, delete, export", open=True, elem_id="ls-conversation-tools"):
        title = gr.Textbox(
            label="Title (Enter renames)", max_lines=1, elem_id="ls-title", placeholder="open a conversation"
        )
        with gr.Row():
            rename = gr.Button("Rename", size="sm", elem_id="ls-rename", scale=0, min_width=60)
            delete = gr.Button("Delete", size="sm", elem_id="ls-delete", scale=0, min_width=60)
            refresh = gr.Button("Refresh list", size="sm", elem_id="ls-refresh", scale=0, min_width=60)
        with gr.Row():
            export_json = gr.Button("Export JSON", size="sm", elem_id="ls-export-json", scale=0, min_width=60)
            export_md = gr.Button("Export Markdown", size="sm", elem_id="ls-export-md", scale=0, min_width=60)
        exported = gr.File(label="Exported file", interactive=False, height=80, elem_id="ls-exported")
    # API-only endpoints, never shown. They take the conversation's id as a number: the list (a gr.Radio) accepts
    # only the ids it lists in the open page, and an API caller names any saved conversation.
    with gr.Group(visible=False):
        api_id = gr.Number(None, precision=0, label="conversation id", elem_id="ls-api-id")
        api_buttons = {
            name: gr.Button(name, elem_id=f"ls-api-{name}")
            for name in ("open", "rename", "delete", "list", "export_json", "export_markdown")
        }

    status, turns = parts["status"], parts["turns"]
    system = parts.get("system", gr.State())
    open_outputs = [parts["transcript"], parts["stats"], status, parts["events"], turns, title, system]
    opened = chooser.input(
        handlers.open, [chooser, parts["colour"]], open_outputs, api_name=False, show_progress="hidden"
    )
    api_opened = api_buttons["open"].click(
        handlers.open, [api_id, parts["colour"]], open_outputs, api_name="open_conversation"
    )
    # an answer streaming in the app shows in a tab that opens its conversation (and, through parts["follow"], in a
    # page loaded while it streams: a reload mid-answer)
    opened.then(handlers.follow, [parts["colour"]], open_outputs, **FOLLOW_EVENT)
    if "compare_panel" in parts:  # the compare panel belongs to an answer of the conversation shown before
        for event in (opened, api_opened):
            event.then(lambda: NO_COMPARE, None, [parts["compare_panel"]], api_name=False, show_progress="hidden")
    search.change(handlers.refresh, [search], [chooser], api_name=False, show_progress="hidden")
    refresh.click(handlers.refresh, [search], [chooser], api_name=False, show_progress="hidden")
    api_buttons["list"].click(handlers.refresh, None, [chooser], api_name="list_conversations")
    gr.on(
        [rename.click, title.submit],
        handlers.rename,
        [chooser, title],
        [chooser, status],
        api_name=False,
        show_progress="hidden",
    )
    api_buttons["rename"].click(handlers.rename, [api_id, title], [chooser, status], api_name="rename_conversation")
    window = [
        parts["transcript"],
        parts["stats"],
        parts["events"],
        parts.get("compare_panel", gr.State()),
        turns,
        system,
    ]
    delete.click(
        handlers.delete_with_undo,
        [chooser, search],
        [chooser, undo, status, title, undo_timer, *window],
        api_name=False,
        show_progress="hidden",
    )
    undo.click(
        handlers.undo_delete, [search], [chooser, undo, status, undo_timer], api_name=False, show_progress="hidden"
    )
    undo_timer.tick(handlers.undo_expired, [status], [undo, status, undo_timer], api_name=False, show_progress="hidden")
    api_buttons["delete"].click(handlers.delete, [api_id], [chooser, status], api_name="delete_conversation")
    for fmt, button in (("json", export_json), ("markdown", export_md)):
        export = handlers.exporter(fmt)
        button.click(export, [chooser], [exported, status], api_name=False)
        api_buttons[f"export_{fmt}"].click(export, [api_id], [exported, status], api_name=f"export_{fmt}")
    parts["refresh_list"] = (handlers.refresh, chooser, search)
    parts["title"] = title
    parts["follow"] = (handlers.follow, open_outputs)
    return handlers
