"""Saves answers into the ConversationStore as they stream, from the answer's worker thread.

Each browser tab (owner) has a current conversation. An answer is written when the model starts on it: the user
message, then an incomplete assistant message, then every step's token records, then finish_answer. A killed
app leaves the answer marked incomplete, with every step that was written.

An edited message or a regenerated answer is saved as a new version (`at`: its index in the shown path), beside the
one it replaces, which stays saved with what followed it; an answer that fails before saying anything is taken back,
so the saved conversation shows what it showed before.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from .manager import Message
from .settings import answer_label
from .turns import AssistantTurn, UserTurn
from .versions import from_tree


def title_from(text: str) -> str:
    """A new conversation's title: the first non-empty line of its first message, whole (the sidebar shortens it
    for display only), its runs of whitespace made single spaces."""
    lines = [" ".join(line.split()) for line in str(text).splitlines()]
    return next((line for line in lines if line), "")


def turns_from_conversation(conversation, streaming: Optional[int] = None) -> list[dict]:
    """A stored Conversation → the UI's turns in their gr.State form (token records and stats included, so
    highlighting comes back; every version of each message nested where it belongs). streaming: the id of the
    message an answer is being saved into now, shown as streaming rather than as incomplete."""

    def turn_of(m) -> dict:
        if m.role != "assistant":
            return UserTurn(m.content, m.role).to_state()
        live = m.id == streaming and not m.complete
        return AssistantTurn(
            content=m.content,
            tokens=list(m.tokens),
            stats=m.stats,
            streaming=live,
            finish_reason=m.finish_reason if m.complete else None if live else "incomplete",
            error=m.error,
            model=m.model,
            proposer=m.proposer,
            k=m.k,
            tree_nodes=m.tree_nodes,
            sampling=m.sampling,
            system=conversation.system_prompt or "",
            label=answer_label(m.model, m.proposer, m.k, m.tree_nodes),
        ).to_state()

    return from_tree(conversation, turn_of)


@dataclass
class AnswerRecord:
    """Where one answer being saved stands in the store."""

    at: Optional[int]  # where in the shown path it goes as a new version; None: after the last message
    regenerate: bool  # a new version of an answer (no user message is saved)
    owner: str = ""  # the tab that asked for it
    message_id: Optional[int] = None  # the assistant message, once started
    user_message_id: Optional[int] = None
    conversation_id: Optional[int] = None
    finished: bool = False  # finished or retracted: later messages change nothing
    said: bool = False  # the answer said its first token


class Recorder:
    def __init__(self, store) -> None:
        self.store = store
        self._current: dict[str, int] = {}  # owner → conversation id
        self._lock = threading.Lock()
        self._started: list[AnswerRecord] = []  # answers saved as they stream, until they end

    def streaming(self) -> Optional[AnswerRecord]:
        """The answer being saved now, the latest started (the engine answers one at a time); None when none."""
        with self._lock:
            self._started = [state for state in self._started if not state.finished]
            return self._started[-1] if self._started else None

    def conversation_of(self, owner: str) -> Optional[int]:
        return self._current.get(owner)

    def set_conversation(self, owner: str, conversation_id: Optional[int]) -> None:
        with self._lock:
            if conversation_id is None:
                self._current.pop(owner, None)
            else:
                self._current[owner] = conversation_id

    def forget(self, conversation_id: int) -> None:
        """A conversation was deleted: no tab appends to it any more."""
        with self._lock:
            for owner in [o for o, c in self._current.items() if c == conversation_id]:
                del self._current[owner]

    def switch_version(self, owner: str, at: int, step: int) -> None:
        """The window showed another version of its message at index `at`: the store shows it too."""
        conversation_id = self._current.get(owner)
        if conversation_id is not None:
            from localspec.store.db import StoreError

            try:
                self.store.switch_version(conversation_id, at, step)
            except StoreError:  # deleted in another tab: nothing to follow
                pass

    def sink(
        self,
        owner: str,
        user_text: str,
        sampling: Optional[dict] = None,
        system: Optional[str] = None,
        at: Optional[int] = None,
        regenerate: bool = False,
    ):
        """A Message sink for one answer of this owner (see ModelManager.answer); sampling is saved with the answer,
        and system (the system prompt it is given; None: left as saved) with its conversation.

        at: the index in the shown path where this exchange (or, with regenerate, this answer) goes as a new version
        of the message there; None: after the last message. regenerate: the answer is a new version of an answer, to
        the user message already saved (a new conversation holding user_text when the tab has none)."""
        state = AnswerRecord(at, regenerate, owner)

        def on_message(message: Message) -> None:
            try:
                save(message)
            except Exception:  # the manager stops saving this answer (and says so): it is no longer being saved
                state.finished = True
                raise

        def save(message: Message) -> None:
            if message.kind == "started":
                self._start(owner, user_text, message, state, sampling, system)
            elif state.message_id is None or state.finished:
                return
            elif message.kind == "event":
                if message.records:
                    self.store.append_tokens(state.message_id, list(message.records))
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
            if conversation_id is not None:
                try:
                    parent = self._parent(conversation_id, state)
                    if not state.regenerate:
                        parent = state.user_message_id = self.store.add_message(
                            conversation_id, "user", user_text, parent=parent
                        )
                    state.message_id = self.store.start_answer(
                        conversation_id, model, proposer, k, sampling, tree, parent=parent
                    )
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
            self._started.append(state)

    def _parent(self, conversation_id: int, state: AnswerRecord):
        """The stored message the new message follows: for a new version at index `at` of the shown path, the one
        before it (None: a first message); the shown path's last message where at is None or past it. A regenerated
        answer with no `at` is a new version of the last message."""
        from localspec.store.db import SHOWN_LEAF

        path = self.store.path_ids(conversation_id)
        at = len(path) - 1 if state.at is None and state.regenerate else state.at
        if at is None or not 0 <= at < len(path):
            return SHOWN_LEAF
        return path[at - 1] if at > 0 else None
