"""The history proposers' index for one model pair, kept in step with the conversation store.

The index is built only from what the store keeps (so nothing with --no-save), and is saved beside the database as
`history/<pair>.npz` (the documents' message ids, their token ids and offsets): a start reads it back instead of
re-tokenizing every saved user message. The database stays the source of truth: a file that is missing, corrupt,
written by another version, or that lists other messages than the database now holds (a conversation deleted while
the app was closed, an older backup) is rebuilt from the database, and a conversation deleted in the app leaves the
index at once.

The file is input like any other: before anything is decompressed, each array's size (the zip's declared size and
the .npy header's shape) is checked against what the database's messages can hold (an answer's saved ids; at most
USER_TOKENS_PER_BYTE per byte of a user message), and every id must lie in the model's vocabulary (an id past it
would fail every answer that drafts from the history). A file that breaks a bound is rebuilt; a message whose own
ids are out of range is left out. `problems` says what was left out and why.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import threading
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from localspec.models.untrusted import regular_size
from localspec.proposers.history import SuffixIndex

from .db import ConversationStore, HistoryDocument, StoreChange

FORMAT_VERSION = 1
Tokenize = Callable[[str], list[int]]
USER_TOKENS_PER_BYTE = 2  # a tokenizer makes at most one token per byte of text (byte fallback), plus a few markers
NPY_OVERHEAD = 4096  # bytes of an .npy member beyond its data (its header)
_MEMBERS = ("version", "message_ids", "offsets", "tokens")


class UnusableIndex(ValueError):
    """Why a saved index file is not read back (it is rebuilt from the database)."""


def token_bound(doc: HistoryDocument) -> int:
    """The most token ids the message can stand for in the index."""
    if doc.role == "assistant":
        return len(doc.token_ids)
    return USER_TOKENS_PER_BYTE * len(doc.content.encode("utf-8", "surrogatepass")) + 16


def outside(ids: Sequence[int] | np.ndarray, vocab_size: Optional[int]) -> Optional[int]:
    """An id that is not a token of the vocabulary (every id ≥ 0; below vocab_size when it is known), or None."""
    top = vocab_size if vocab_size is not None else 1 << 62
    try:
        values = np.asarray(ids, dtype=np.int64).reshape(-1)
    except (OverflowError, TypeError, ValueError):  # a number past 64 bits, not a number
        return next((i for i in ids if not isinstance(i, int) or not 0 <= i < top), -1)
    bad = values[(values < 0) | (values >= top)]
    return int(bad[0]) if len(bad) else None


def index_path(folder: Path, model: str) -> Path:
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in model)[:60]
    return folder / f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:8]}.npz"


class PairHistory:
    """A pair's SuffixIndex and the messages it holds (message id → conversation id), saved after each change."""

    def __init__(
        self,
        store: ConversationStore,
        model: str,
        tokenize: Tokenize,
        folder: Path,
        vocab_size: Optional[int] = None,
    ) -> None:
        self.store, self.model, self.tokenize = store, model, tokenize
        self.vocab_size = vocab_size  # the target's; None: ids are only checked to be ≥ 0
        self.path = index_path(folder, model)
        self.index = SuffixIndex()
        self.conversation_of: dict[int, int] = {}
        self._lock = threading.Lock()
        self.rebuilt = False  # whether the last load had to rebuild from the database
        self.problems: list[str] = []  # what the last load left out, and why
        self.load()

    def load(self) -> None:
        docs = self.store.history_documents(self.model)
        problems: list[str] = []
        try:
            saved = self._read({d.message_id: token_bound(d) for d in docs})
        except UnusableIndex as exc:
            saved = None
            problems.append(f"{self.path.name} was rebuilt from the database: {exc}")
        self.rebuilt = saved is None
        with self._lock:
            self.index = SuffixIndex()
            self.conversation_of = {}
            for doc in docs:
                if not self.rebuilt:
                    ids = saved[doc.message_id]
                else:
                    ids = list(doc.token_ids) if doc.role == "assistant" else self.tokenize(doc.content)
                bad = outside(ids, self.vocab_size)
                if bad is not None:
                    problems.append(f"message {doc.message_id} is left out of the history: {self._outside(bad)}")
                    continue
                self.index.add(doc.message_id, ids)
                self.conversation_of[doc.message_id] = doc.conversation_id
        self.problems = problems
        for problem in problems[:5]:  # one damaged file can leave out every message: a few lines say enough
            print(f"localspec: history of {self.model!r}: {problem}", file=sys.stderr, flush=True)
        if self.rebuilt:
            self.save()

    def _outside(self, token_id: int) -> str:
        vocabulary = f"0..{self.vocab_size - 1}" if self.vocab_size is not None else "≥ 0"
        return f"token id {token_id} is not in the model's vocabulary ({vocabulary})"

    def _read(self, bounds: dict[int, int]) -> Optional[dict[int, list[int]]]:
        """message id → token ids from the file; None when it is missing, or lists other messages than `bounds`
        (message id → most ids); UnusableIndex when it breaks a bound."""
        budget = {  # bytes of data each member may hold, from the database's messages
            "version": 8,
            "message_ids": 8 * len(bounds),
            "offsets": 8 * (len(bounds) + 1),
            "tokens": 8 * sum(bounds.values()),
        }
        try:
            size = regular_size(self.path)
            if size > sum(budget.values()) + len(budget) * NPY_OVERHEAD:
                raise UnusableIndex(f"it is {size} bytes, more than its {len(bounds)} messages can hold")
            with zipfile.ZipFile(self.path) as archive:
                arrays = {name: _member(archive, name, budget[name]) for name in _MEMBERS}
        except FileNotFoundError:
            return None
        except UnusableIndex:
            raise
        except Exception as exc:  # not a zip, not .npy, unreadable: rebuilt, never fatal
            raise UnusableIndex(f"it cannot be read: {type(exc).__name__}: {exc}"[:200]) from None
        ids, offsets, tokens = arrays["message_ids"], arrays["offsets"], arrays["tokens"]
        version = arrays["version"]
        if version.size != 1 or int(version[0]) != FORMAT_VERSION:
            return None
        lengths = np.diff(offsets)
        if len(offsets) != len(ids) + 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or (lengths < 0).any():
            raise UnusableIndex("its offsets do not match its tokens")
        if set(ids.tolist()) != set(bounds) or len(ids) != len(bounds):
            return None  # other messages than the database holds now: rebuilt
        if (lengths > np.array([bounds[int(m)] for m in ids.tolist()])).any():
            raise UnusableIndex("a message has more token ids than its text or answer can make")
        bad = outside(tokens, self.vocab_size)
        if bad is not None:
            raise UnusableIndex(self._outside(bad))
        return {int(m): tokens[offsets[i] : offsets[i + 1]].tolist() for i, m in enumerate(ids)}

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

    def index_for(self, model: str, tokenize: Tokenize, vocab_size: Optional[int] = None) -> SuffixIndex:
        """The pair's index (loaded from its file, or rebuilt from the database), kept current from now on; ids
        outside [0, vocab_size) never enter it."""
        history = self.pairs.get(model)
        if history is None:
            history = self.pairs[model] = PairHistory(self.store, model, tokenize, self.folder, vocab_size)
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


def _member(archive: zipfile.ZipFile, name: str, budget: int) -> np.ndarray:
    """One integer array of the index, its sizes checked before its data is decompressed."""
    info = archive.getinfo(f"{name}.npy")
    if info.file_size > budget + NPY_OVERHEAD:  # zipfile never inflates past the declared size
        raise UnusableIndex(f"its {name} would take {info.file_size} bytes, more than its messages can hold")
    with archive.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read_header(fh)
    if dtype.kind not in "iu" or math.prod(shape) * dtype.itemsize > budget:
        raise UnusableIndex(f"its {name} is {dtype} of shape {shape}, more than its messages can hold")
    with archive.open(info) as fh:
        return np.lib.format.read_array(fh, allow_pickle=False).reshape(-1)
