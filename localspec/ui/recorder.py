"""Saves answers into the ConversationStore as they stream, from the answer's worker thread.

Each browser tab (owner) has a current conversation. An answer is written when the model starts on it: the user
message, then an incomplete assistant message, then every step's token records, then finish_answer. A killed
app leaves the answer marked incomplete, with every step that was written.

A regenerated answer (replaces="answer") is saved under the user message already stored, and an edited message
(see begin_edit) is saved as a new exchange; either way what it replaces is deleted when the new answer says its
first token, so an answer that fails before saying anything leaves the saved conversation as it was.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal, Optional

from .manager import Message
from .settings import answer_label
from .turns import AssistantTurn, Turn, UserTurn, turns_to_state

Replaces = Literal["nothing", "answer", "exchange"]  # answer: regenerated; exchange: an edited message and its answer


def title_from(text: str) -> str:
    """A new conversation's title: the first non-empty line of its first message, whole (the sidebar shortens it
    for display only), its runs of whitespace made single spaces."""
    lines = [" ".join(line.split()) for line in str(text).splitlines()]
    return next((line for line in lines if line), "")


def turns_from_conversation(conversation) -> list[dict]:
    """A stored Conversation → the UI's turns in their gr.State form (token records and stats included, so
    highlighting comes back)."""
    turns: list[Turn] = []
    for m in conversation.messages:
        if m.role != "assistant":
            turns.append(UserTurn(m.content, m.role))
            continue
        turns.append(
            AssistantTurn(
                content=m.content,
                tokens=list(m.tokens),
                stats=m.stats,
                finish_reason=m.finish_reason if m.complete else "incomplete",
                error=m.error,
                model=m.model,
                proposer=m.proposer,
                k=m.k,
                tree_nodes=m.tree_nodes,
                sampling=m.sampling,
                system=conversation.system_prompt or "",
                label=answer_label(m.model, m.proposer, m.k, m.tree_nodes),
            )
        )
    return turns_to_state(turns)


@dataclass
class AnswerRecord:
    """Where one answer being saved stands in the store."""

    replaces: Replaces
    message_id: Optional[int] = None  # the assistant message, once started
    user_message_id: Optional[int] = None
    conversation_id: Optional[int] = None
    finished: bool = False  # finished or retracted: later messages change nothing
    said: bool = False  # the answer said its first token (what it replaces is gone from the store)


class Recorder:
    def __init__(self, store) -> None:
        self.store = store
        self._current: dict[str, int] = {}  # owner → conversation id
        self._editing: set[str] = set()  # owners whose next exchange replaces their last one
        self._lock = threading.Lock()

    def conversation_of(self, owner: str) -> Optional[int]:
        return self._current.get(owner)

    def set_conversation(self, owner: str, conversation_id: Optional[int]) -> None:
        with self._lock:
            self._editing.discard(owner)
            if conversation_id is None:
                self._current.pop(owner, None)
            else:
                self._current[owner] = conversation_id

    def forget(self, conversation_id: int) -> None:
        """A conversation was deleted: no tab appends to it any more."""
        with self._lock:
            for owner in [o for o, c in self._current.items() if c == conversation_id]:
                del self._current[owner]
                self._editing.discard(owner)

    def begin_edit(self, owner: str) -> None:
        """The owner's next exchange replaces its last stored one (the last user message and its answers)."""
        with self._lock:
            self._editing.add(owner)

    def end_edit(self, owner: str) -> None:
        with self._lock:
            self._editing.discard(owner)

    def is_editing(self, owner: str) -> bool:
        return owner in self._editing

    def sink(
        self,
        owner: str,
        user_text: str,
        sampling: Optional[dict] = None,
        replaces: Replaces = "nothing",
        system: Optional[str] = None,
    ):
        """A Message sink for one answer of this owner (see ModelManager.answer); sampling is saved with the answer,
        and system (the system prompt it is given; None: left as saved) with its conversation.

        replaces="answer": the answer regenerates the last one, under the user message already saved (a new
        conversation holding user_text when the tab has none). Otherwise a pending edit (begin_edit) makes this
        exchange replace the last one."""
        state = AnswerRecord(replaces)

        def on_message(message: Message) -> None:
            if message.kind == "started":
                self._start(owner, user_text, message, state, sampling, system)
            elif state.message_id is None or state.finished:
                return
            elif message.kind == "event":
                if message.records:
                    self.store.append_tokens(state.message_id, list(message.records))
                    if not state.said:
                        self._replace(owner, state)
                    state.said = True
                event = message.event
                if event.finished and event.finish_reason == "error" and not state.said:
                    self._retract(owner, state)
                elif event.finished:
                    self.store.finish_answer(
                        state.message_id, event.finish_reason or "stop", event.stats.to_dict(), event.error
                    )
                    state.finished = True
            elif message.kind in ("error", "done"):
                if not state.said:
                    self._retract(owner, state)
                    return
                error = message.text if message.kind == "error" else "the answer ended without a reason"
                self.store.finish_answer(state.message_id, "error", None, error)
                state.finished = True

        return on_message

    def _replace(self, owner: str, state: AnswerRecord) -> None:
        """The new answer said its first token: what it replaces goes from the store."""
        if state.replaces == "answer":
            self.store.drop_earlier_answers(state.message_id)
        elif state.replaces == "exchange":
            with self._lock:
                self._editing.discard(owner)
            self.store.drop_previous_exchange(state.user_message_id)

    def _retract(self, owner: str, state: AnswerRecord) -> None:
        """The answer failed before its first token: the window takes the message back, so does the database."""
        with self._lock:
            gone = self.store.retract_exchange(state.user_message_id, state.message_id)
            if gone and self._current.get(owner) == state.conversation_id:
                del self._current[owner]  # it was this answer's new conversation, now gone
        state.finished = True

    def _start(
        self,
        owner: str,
        user_text: str,
        message: Message,
        state: AnswerRecord,
        sampling: Optional[dict] = None,
        system: Optional[str] = None,
    ) -> None:
        from localspec.store.db import StoreError

        model = message.text
        spec = message.spec
        proposer, k, tree = (spec.proposer, spec.k, spec.tree_nodes) if spec is not None else ("none", 0, 0)
        with self._lock:
            conversation_id = self._current.get(owner)
            if state.replaces == "nothing" and owner in self._editing:
                state.replaces = "exchange"
            if conversation_id is not None:
                try:
                    if state.replaces != "answer":
                        state.user_message_id = self.store.add_message(conversation_id, "user", user_text)
                    state.message_id = self.store.start_answer(conversation_id, model, proposer, k, sampling, tree)
                    if system is not None:
                        self.store.set_system_prompt(conversation_id, system)
                except StoreError:  # deleted in another tab: start a new one
                    conversation_id = None
            if conversation_id is None:
                conversation_id = self.store.create_conversation(title_from(user_text), model, system)
                state.user_message_id = self.store.add_message(conversation_id, "user", user_text)
                state.message_id = self.store.start_answer(conversation_id, model, proposer, k, sampling, tree)
                self._current[owner] = conversation_id
        state.conversation_id = conversation_id
