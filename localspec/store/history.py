"""The history proposers' index for one model pair, kept in step with the conversation store.

The index is built only from what the store keeps (so nothing with --no-save), and is saved beside the database as
`history/<pair>.npz` (the documents' message ids, their token ids and offsets): a start reads it back instead of
re-tokenizing every saved user message. The database stays the source of truth: a file that is missing, corrupt,
written by another version, or that lists other messages than the database now holds (a conversation deleted while
the app was closed, an older backup) is rebuilt from the database, and a conversation deleted in the app leaves the
index at once.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from localspec.proposers.history import SuffixIndex

from .db import ConversationStore, StoreChange

FORMAT_VERSION = 1
Tokenize = Callable[[str], list[int]]


def index_path(folder: Path, model: str) -> Path:
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in model)[:60]
    return folder / f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:8]}.npz"


class PairHistory:
    """A pair's SuffixIndex and the messages it holds (message id → conversation id), saved after each change."""

    def __init__(self, store: ConversationStore, model: str, tokenize: Tokenize, folder: Path) -> None:
        self.store, self.model, self.tokenize = store, model, tokenize
        self.path = index_path(folder, model)
        self.index = SuffixIndex()
        self.conversation_of: dict[int, int] = {}
        self._lock = threading.Lock()
        self.rebuilt = False  # whether the last load had to rebuild from the database
        self.load()

    def load(self) -> None:
        docs = self.store.history_documents(self.model)
        wanted = {d.message_id for d in docs}
        saved = self._read()
        self.rebuilt = saved is None or set(saved) != wanted
        with self._lock:
            self.index = SuffixIndex()
            self.conversation_of = {}
            for doc in docs:
                if not self.rebuilt:
                    ids = saved[doc.message_id]
                else:
                    ids = list(doc.token_ids) if doc.role == "assistant" else self.tokenize(doc.content)
                self.index.add(doc.message_id, ids)
                self.conversation_of[doc.message_id] = doc.conversation_id
        if self.rebuilt:
            self.save()

    def _read(self) -> dict[int, list[int]] | None:
        """message id → token ids from the file, or None when it is missing or unusable."""
        try:
            with np.load(self.path, allow_pickle=False) as data:
                if int(data["version"]) != FORMAT_VERSION:
                    return None
                ids, offsets, tokens = data["message_ids"], data["offsets"], data["tokens"]
                if len(offsets) != len(ids) + 1 or offsets[-1] != len(tokens) or (np.diff(offsets) < 0).any():
                    return None
                return {int(m): tokens[offsets[i] : offsets[i + 1]].tolist() for i, m in enumerate(ids)}
        except (OSError, ValueError, KeyError, EOFError, Exception):  # a damaged file is rebuilt, never fatal
            return None

    def save(self) -> None:
        with self._lock:
            live = [(key, doc) for key, doc in zip(self.index.keys, self.index.docs) if doc is not None]
        lengths = [len(doc) for _, doc in live]
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]) if live else np.zeros(1, np.int64)
        tokens = np.concatenate([doc for _, doc in live]).astype(np.int32) if live else np.zeros(0, np.int32)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp.npz")
            np.savez(
                tmp,
                version=np.int64(FORMAT_VERSION),
                message_ids=np.asarray([key for key, _ in live], dtype=np.int64),
                offsets=offsets,
                tokens=tokens,
            )
            os.replace(tmp, self.path)
        except OSError:  # a read-only data folder: the index lives in memory and is rebuilt at the next start
            pass

    def add_answer(self, message_id: int, conversation_id: int, token_ids: list[int]) -> None:
        with self._lock:
            self.index.add(message_id, token_ids)
            self.conversation_of[message_id] = conversation_id
        self.save()

    def add_user_message(self, message_id: int, conversation_id: int, text: str) -> None:
        self.add_answer(message_id, conversation_id, self.tokenize(text))

    def forget_conversation(self, conversation_id: int) -> int:
        """Remove every message of a deleted conversation; returns how many left the index."""
        with self._lock:
            gone = [m for m, c in self.conversation_of.items() if c == conversation_id]
            for message_id in gone:
                self.index.remove(message_id)
                del self.conversation_of[message_id]
        if gone:
            self.save()
        return len(gone)

    def forget_message(self, message_id: int) -> None:
        with self._lock:
            removed = self.index.remove(message_id)
            self.conversation_of.pop(message_id, None)
        if removed:
            self.save()


class HistoryBook:
    """The app's history indexes, one per model pair that was loaded, following the store: an answer saved, a user
    message saved, a conversation deleted. The folder is `history/` beside the database."""

    def __init__(self, store: ConversationStore, folder: Path | None = None) -> None:
        self.store = store
        self.folder = store.path.parent / "history" if folder is None else folder
        self.pairs: dict[str, PairHistory] = {}
        store.listeners.append(self._changed)

    def index_for(self, model: str, tokenize: Tokenize) -> SuffixIndex:
        """The pair's index (loaded from its file, or rebuilt from the database), kept current from now on."""
        history = self.pairs.get(model)
        if history is None:
            history = self.pairs[model] = PairHistory(self.store, model, tokenize, self.folder)
        return history.index

    def _changed(self, change: StoreChange, ident: int) -> None:
        if change == "conversation_deleted":
            for history in self.pairs.values():
                history.forget_conversation(ident)
            return
        found = self.store.history_document(ident)
        if found is None:
            return
        model, doc = found
        history = self.pairs.get(model)
        if history is None:
            return
        if doc.role == "assistant":
            history.add_answer(doc.message_id, doc.conversation_id, list(doc.token_ids))
        else:
            history.add_user_message(doc.message_id, doc.conversation_id, doc.content)
