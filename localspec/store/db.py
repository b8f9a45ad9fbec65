"""Saved conversations in a local SQLite database, written as the answer streams.

- One file, `localspec.models.paths.home() / "conversations.db"` (LOCALSPEC_HOME moves it), in WAL mode.
- Every append_tokens call is its own transaction, so a killed process loses at most the step in flight and
  never half a step; an answer that was never finished stays marked incomplete (complete = 0).
- Thread-safe: one connection, every operation under one lock (a Gradio app answers from worker threads; the GPU
  serialises answers anyway, and each write is a few rows).
- A file that is not a readable database is moved aside to `conversations.db.corrupt-<timestamp>` (with its -wal
  and -shm files) and a fresh one is started; `recovered_from` then names the moved file so the UI can say so.
- A conversation's messages form a tree (schema v6): an edited message or a regenerated answer is a new version, a
  sibling of the one it replaces, and every version is kept. The shown path starts at the most recently shown first
  message and follows, at each step, the child shown most recently (shown_path: the one rule, also the window's).
- Titles and content are stored exactly as given (lone surrogates, which cannot be UTF-8, become U+FFFD);
  escaping is the renderer's job.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Optional

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, the fingerprint check runs unguarded
    fcntl = None

from localspec.config import ConfigError

from .schema import SCHEMA_VERSION, migrate, user_version
from .validation import ROLES, clean_text, finish_words

DB_NAME = "conversations.db"
EXPORT_FORMAT = "localspec-conversation"
TOKEN_FIELDS = ("id", "text", "kind", "p_target", "p_draft", "rejected_id", "rejected_p_target", "rejected_p_draft")
UNTITLED = "Untitled conversation"
STATE_SUFFIX = "-state"  # the main file's (inode, size, mtime) after our last checkpoint
# held exclusively while a checkpoint changes the main file and records its fingerprint, shared while a probe
# compares them: without it, a probe between another connection's checkpoint and its record finds "damage"
LOCK_SUFFIX = "-lock"
WAL_HEADER_BYTES = 32  # a WAL no longer than its header holds no frames
CHECKPOINT_BYTES = 4 << 20  # merge the WAL into the main file once it grows past this
BUSY_TIMEOUT_S = 10.0  # how long a connection waits for another one's lock
SHOWN_LEAF = "leaf"  # a new message's default parent: the last message of the shown path


class StoreError(ConfigError):
    """A conversation-store problem with a message meant for the user (a missing conversation, an unusable file)."""


@dataclass(frozen=True)
class ConversationSummary:
    """One row of the conversation list. Times are seconds since the epoch (UTC)."""

    id: int
    title: str
    model: str
    created_at: float
    updated_at: float
    incomplete: bool  # some answer in it was never finished (the app stopped mid-answer)


@dataclass(frozen=True)
class Message:
    id: int
    role: str  # system | user | assistant
    content: str
    complete: bool
    created_at: float
    model: Optional[str] = None  # assistant messages: the target that answered
    proposer: Optional[str] = None
    k: Optional[int] = None
    finish_reason: Optional[str] = None  # stop | length | cancelled | error; None while streaming / interrupted
    stats: Optional[dict] = field(default=None, hash=False, compare=False)  # StatsSnapshot.to_dict() at the end
    error: Optional[str] = None
    tokens: tuple[dict, ...] = ()  # TokenEvent.to_dict() rows, in order
    sampling: Optional[dict] = field(default=None, hash=False, compare=False)  # SamplingParams fields, when saved
    tree_nodes: Optional[int] = None  # the size of the token trees the answer drafted; None or 0: chains of K
    parent_id: Optional[int] = None  # the message it follows; None: a first message
    shown: int = 0  # when it was last on the shown path (larger: later)

    @property
    def token_kinds(self) -> list[str]:
        return [tok["kind"] for tok in self.tokens]


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    model: str
    created_at: float
    updated_at: float
    messages: tuple[Message, ...]  # the shown path, first message first
    system_prompt: Optional[str] = None  # the system message its answers are given; None or blank: none
    every: tuple[Message, ...] = field(default=(), compare=False)  # every version of every message, by id

    @property
    def incomplete(self) -> bool:
        return any(not m.complete for m in self.messages)

    def versions_of(self, message: Message) -> tuple[Message, ...]:
        """Every version of the message (itself included): the messages that follow the same one, oldest first."""
        return tuple(m for m in self.every if m.parent_id == message.parent_id)

    def path_from(self, message: Message) -> tuple[Message, ...]:
        """The message and what is shown below it when it is shown."""
        by_id = {m.id: m for m in self.every}
        return tuple(by_id[i] for i in shown_path(((m.id, m.parent_id, m.shown) for m in self.every), message.id))

    def depth_of(self, message: Message) -> int:
        """Its place in its path: 1 for a first message."""
        parents = {m.id: m.parent_id for m in self.every}
        seen, at = {message.id}, message.parent_id
        while at is not None and at not in seen:  # a cycle (a hand-edited file) ends the walk
            seen.add(at)
            at = parents.get(at)
        return len(seen)

    def chat_messages(self) -> list[dict]:
        """The history as {'role', 'content'} dicts, ready for ChatSession.prompt_ids: the conversation's system
        prompt first, where it has one."""
        system = [{"role": "system", "content": self.system_prompt}] if (self.system_prompt or "").strip() else []
        return system + [{"role": m.role, "content": m.content} for m in self.messages]


StoreChange = Literal["answer_finished", "user_message", "conversation_deleted"]


@dataclass(frozen=True)
class HistoryDocument:
    """One saved message as the history index sees it: an answer's token ids, or a user message's text."""

    message_id: int
    conversation_id: int
    role: str  # "user" | "assistant"
    content: str  # the user's text (empty for an answer)
    token_ids: tuple[int, ...]  # the answer's ids (empty for a user message)


def shown_path(rows: Iterable[tuple[int, Optional[int], int]], start: Optional[int] = None) -> list[int]:
    """The ids of the shown path through (id, parent_id, shown) rows: from `start` (None: the first message shown
    most recently) down, taking at each step the child shown most recently (a tie: the newest)."""
    children: dict[Optional[int], list[tuple[int, int]]] = {}
    for message_id, parent_id, shown in rows:
        children.setdefault(parent_id, []).append((shown or 0, message_id))
    path: list[int] = []
    at = start if start is not None else max(children.get(None, [(0, None)]))[1]
    while at is not None and at not in path:  # a cycle (a hand-edited file) ends the path
        path.append(at)
        below = children.get(at)
        at = max(below)[1] if below else None
    return path


def default_path() -> Path:
    from localspec.models.paths import home

    return home() / DB_NAME


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds")


def _jsonable(value: Any) -> Any:
    """Plain JSON (no NaN/inf: they become null), whatever numeric types the caller passed."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    try:
        return _jsonable(float(value))  # numpy / torch scalars
    except (TypeError, ValueError):
        return str(value)


def _real(value: Any) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _int_or_none(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _casefold(text: Any) -> str:
    return str(text or "").casefold()


def _switch_to_wal(conn: sqlite3.Connection) -> str:
    """The journal mode after asking for WAL. SQLite answers 'database is locked' at once, without its busy handler,
    when another connection holds the lock the switch needs (two first opens of a new file), so wait here."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        if mode == "wal":  # persistent in the file: whoever switched first switched it for everyone
            return mode
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    """Only a damaged or foreign-format file counts: a locked file, a full disk or a bug must never move the user's
    conversations aside."""
    name = getattr(exc, "sqlite_errorname", "") or ""  # Python ≥ 3.11
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return True
    text = str(exc).lower()
    return any(s in text for s in ("file is not a database", "disk image is malformed", "file is encrypted"))


def file_fingerprint(path: Path) -> list[int]:
    """What changes when a file is replaced or rewritten: [inode, size, mtime in ns]."""
    st = path.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns]


class ConversationStore:
    """Conversations, messages and per-token records in one SQLite file. See the module docstring."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.recovered_from: Optional[Path] = None  # where a corrupt file was moved, when one was
        self._lock = threading.RLock()
        self._closed = False
        # called after a change that the history index follows (store/history.py): what changed, and its id
        self.listeners: list[Callable[[StoreChange, int], None]] = []
        # called first when the store closes: work that must reach the file before it does (a deletion that was
        # waiting for its undo); a failing one is passed over
        self.closing: list[Callable[[], None]] = []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the folder for saved conversations {self.path.parent}: {exc}") from None
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a folder, not a conversation database; move it or set LOCALSPEC_HOME")
        try:
            damage = self._probe()  # before SQLite may touch the files for writing
        except (sqlite3.DatabaseError, OSError) as exc:
            raise StoreError(f"cannot open the conversation database {self.path}: {exc}") from None
        if damage is not None:
            self.recovered_from = self._move_aside()
        try:
            self._conn = self._open()
        except (sqlite3.DatabaseError, OSError) as exc:
            raise StoreError(f"cannot open the conversation database {self.path}: {exc}") from None
        self._checkpoint("PASSIVE")

    # -- opening -------------------------------------------------------------------------------------------------

    def _side(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def _fingerprint(self) -> list[int]:
        return file_fingerprint(self.path)

    def _probe(self) -> Optional[str]:
        """Why the file on disk is damaged, or None. Reads through a read-only connection (which never checkpoints
        a WAL into the main file). A damaged set gets its -shm back as found, so it is moved aside as found; a
        healthy one keeps its -shm untouched, since another connection may have it mapped (truncating or unlinking
        a live -shm breaks that connection's locking and can crash it with SIGBUS)."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return None
        wal, state = self._side("-wal"), self._side(STATE_SUFFIX)
        with self._fingerprint_lock(exclusive=False):
            if wal.exists() and wal.stat().st_size > WAL_HEADER_BYTES and state.exists():
                try:
                    recorded = json.loads(state.read_text())
                except (OSError, ValueError):
                    recorded = None
                if recorded != self._fingerprint():  # the main file changed since our last checkpoint
                    return "the database file was replaced or changed while its write-ahead log remained"
        shm = self._side("-shm")
        shm_before = shm.read_bytes() if shm.exists() else None
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
            try:
                check = conn.execute("PRAGMA quick_check").fetchone()[0]
                damage = None if check == "ok" else f"database disk image is malformed: {check}"
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            if not _is_corruption(exc):
                raise
            damage = str(exc)
        if damage is not None:
            self._restore(shm, shm_before)
        return damage

    @staticmethod
    def _restore(shm: Path, before: Optional[bytes]) -> None:
        """Put the -shm back as the probe found it; a folder that refuses (read-only) keeps what is there."""
        try:
            if before is None:
                shm.unlink(missing_ok=True)
            elif shm.exists() and shm.read_bytes() != before:
                shm.write_bytes(before)
        except OSError:
            pass

    @contextlib.contextmanager
    def _fingerprint_lock(self, exclusive: bool):
        """The side lock (LOCK_SUFFIX) between checkpoints and probes, across threads and processes; where it
        cannot be had (no fcntl, a read-only folder) the code runs without it."""
        try:
            handle = open(self._side(LOCK_SUFFIX), "a+b") if fcntl is not None else None
        except OSError:
            handle = None
        try:
            if handle is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            if handle is not None:
                handle.close()  # closing the file releases the lock

    def _checkpoint(self, mode: str) -> None:
        """Merge the WAL into the main file and record the main file's fingerprint (see _probe)."""
        with self._lock, self._fingerprint_lock(exclusive=True):
            try:
                self._conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
                state = self._side(STATE_SUFFIX)
                tmp = state.with_name(state.name + ".tmp")
                tmp.write_text(json.dumps(self._fingerprint()))
                tmp.replace(state)
            except (sqlite3.Error, OSError):  # a busy reader or a read-only folder: the next checkpoint catches up
                pass

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            mode = _switch_to_wal(conn)
            if str(mode).lower() != "wal":
                raise StoreError(f"the conversation database {self.path} could not switch to WAL mode ({mode})")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints are ours, so each one is recorded
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a killed process loses nothing committed
            conn.execute("PRAGMA foreign_keys = ON")
            conn.create_function("casefold", 1, _casefold, deterministic=True)  # search beyond ASCII's lower()
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed: {check}")
            version = user_version(conn)
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the conversation database {self.path} was written by a newer localspec (schema "
                    f"{version}; this version reads up to {SCHEMA_VERSION}). Update localspec, or "
                    f"set LOCALSPEC_HOME to use another folder."
                )
            migrate(conn)
            return conn
        except BaseException:
            conn.close()
            raise

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            self.path.rename(target)
            for suffix in ("-wal", "-shm", STATE_SUFFIX):  # a stale WAL must never be replayed into the fresh file
                side = self.path.with_name(self.path.name + suffix)
                if side.exists():
                    side.rename(target.with_name(target.name + suffix))
        except OSError as exc:
            raise StoreError(
                f"the conversation database {self.path} is damaged and could not be moved aside "
                f"({exc}); move it yourself or set LOCALSPEC_HOME"
            ) from None
        return target

    def close(self) -> None:
        """Run the closing work, checkpoint the WAL into the main file (a clean shutdown leaves no WAL to replay),
        then close. A write after it raises StoreError."""
        for work in list(self.closing):
            try:
                work()
            except Exception:  # one failed piece of closing work does not keep the rest from the file
                pass
        with self._lock:
            if self._closed:
                return
            self._checkpoint("TRUNCATE")
            self._conn.close()
            self._closed = True

    def __enter__(self) -> ConversationStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def journal_mode(self) -> str:
        with self._lock:
            return str(self._conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return user_version(self._conn)

    # -- writing -------------------------------------------------------------------------------------------------

    def _write(self, fn):
        """Run fn(conn) in one IMMEDIATE transaction under the lock; commit, or roll back and re-raise."""
        with self._lock:
            if self._closed:
                raise StoreError(f"the conversation database {self.path} is closed (the app is stopping)")
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            wal = self._side("-wal")
            if wal.exists() and wal.stat().st_size > CHECKPOINT_BYTES:
                self._checkpoint("PASSIVE")
            return result

    def _tell(self, change: StoreChange, ident: int) -> None:
        for listener in list(self.listeners):
            try:
                listener(change, ident)
            except Exception:  # a listener's failure (the history index) never fails the write that was made
                pass

    def _require_conversation(self, conn: sqlite3.Connection, conversation_id: Any) -> int:
        cid = _int_or_none(conversation_id)
        if cid is None or conn.execute("SELECT 1 FROM conversations WHERE id = ?", (cid,)).fetchone() is None:
            raise StoreError(f"conversation {conversation_id!r} does not exist (it may have been deleted)")
        return cid

    @staticmethod
    def _title(title: Any) -> str:
        title = clean_text(title, "the title")
        return title if title.strip() else UNTITLED

    def create_conversation(self, title: str, model: str, system_prompt: Optional[str] = None) -> int:
        title, model = self._title(title), clean_text(model, "the model name")
        system = clean_text(system_prompt, "the system prompt") if system_prompt is not None else None
        now = time.time()

        def insert(conn):
            cur = conn.execute(
                "INSERT INTO conversations (title, model, created_at, updated_at, system_prompt) "
                "VALUES (?, ?, ?, ?, ?)",
                (title, model, now, now, system),
            )
            return int(cur.lastrowid)

        return self._write(insert)

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        """The system prompt the conversation's next answers are given (empty: none)."""
        system = clean_text(system_prompt, "the system prompt")

        def update(conn):
            cid = self._require_conversation(conn, conversation_id)
            conn.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (system, cid))

        self._write(update)

    def get_setting(self, key: str) -> Optional[str]:
        """A saved default of the window (e.g. the default system prompt), or None when never saved."""
        with self._lock:
            row = self._conn.execute("SELECT value FROM settings WHERE key = ?", (str(key),)).fetchone()
        return row["value"] if row is not None else None

    def set_setting(self, key: str, value: str) -> None:
        value = clean_text(value, str(key))
        self._write(
            lambda conn: conn.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (str(key), value),
            )
        )

    @staticmethod
    def _path(conn: sqlite3.Connection, cid: int) -> list[int]:
        rows = conn.execute("SELECT id, parent_id, shown FROM messages WHERE conversation_id = ?", (cid,)).fetchall()
        return shown_path(tuple(r) for r in rows)

    @staticmethod
    def _show(conn: sqlite3.Connection, cid: int, message_id: int) -> None:
        """Put the message on the shown path: it and its ancestors become the most recently shown."""
        shown = conn.execute("SELECT COALESCE(MAX(shown), 0) + 1 FROM messages WHERE conversation_id = ?", (cid,))
        conn.execute(
            "WITH RECURSIVE up(id) AS (SELECT ? UNION SELECT m.parent_id FROM messages m JOIN up ON m.id = up.id "
            "WHERE m.parent_id IS NOT NULL) UPDATE messages SET shown = ? WHERE id IN up",
            (message_id, shown.fetchone()[0]),
        )

    def path_ids(self, conversation_id: int) -> list[int]:
        """The ids of the conversation's shown path, first message first ([] for none or an unknown id)."""
        cid = _int_or_none(conversation_id)
        with self._lock:
            return self._path(self._conn, cid) if cid is not None else []

    def switch_version(self, conversation_id: int, at: int, step: int) -> Optional[int]:
        """Show another version of the shown path's message at index `at`: `step` versions later (+) or earlier (-);
        the path below it becomes the one last shown there. Returns the id now shown, or None (no such version)."""
        index, step = _int_or_none(at), _int_or_none(step)

        def switch(conn) -> Optional[int]:
            cid = self._require_conversation(conn, conversation_id)
            path = self._path(conn, cid)
            if index is None or step is None or not 0 <= index < len(path):
                return None
            parent = conn.execute("SELECT parent_id FROM messages WHERE id = ?", (path[index],)).fetchone()[0]
            versions = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id", (cid, parent)
                )
            ]
            target = versions.index(path[index]) + step
            if not 0 <= target < len(versions):
                return None
            self._show(conn, cid, versions[target])
            return versions[target]

        return self._write(switch)

    def _insert_message(
        self,
        conversation_id: Any,
        role: str,
        content: str,
        complete: bool,
        model=None,
        proposer=None,
        k=None,
        sampling: Optional[dict] = None,
        tree_nodes=None,
        parent: Any = SHOWN_LEAF,
    ) -> int:
        if role not in ROLES:
            raise StoreError(f"unknown message role {role!r}; choose one of {', '.join(ROLES)}")
        content = clean_text(content, "the message")
        sampling_json = json.dumps(_jsonable(sampling), allow_nan=False) if sampling else None
        now = time.time()

        def insert(conn):
            cid = self._require_conversation(conn, conversation_id)
            if parent == SHOWN_LEAF:
                path = self._path(conn, cid)
                parent_id = path[-1] if path else None
            else:
                parent_id = _int_or_none(parent)
                found = conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (parent_id,)).fetchone()
                if parent is not None and (found is None or found[0] != cid):
                    raise StoreError(f"message {parent!r} is not in conversation {cid}")
            cur = conn.execute(
                "INSERT INTO messages (conversation_id, role, content, complete, model, proposer, k, sampling, "
                "tree_nodes, created_at, parent_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    cid,
                    role,
                    content,
                    int(bool(complete)),
                    model,
                    proposer,
                    k,
                    sampling_json,
                    tree_nodes,
                    now,
                    parent_id,
                ),
            )
            message_id = int(cur.lastrowid)
            self._show(conn, cid, message_id)
            conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, cid))
            return message_id

        return self._write(insert)

    def add_message(
        self, conversation_id: int, role: str, content: str, complete: bool = True, parent: Any = SHOWN_LEAF
    ) -> int:
        """A user or system message, or an assistant message that is already whole, now shown. parent: the message
        it follows (None: a first message; default: the shown path's last). Returns the message id."""
        message_id = self._insert_message(conversation_id, role, content, complete, parent=parent)
        if role == "user":
            self._tell("user_message", message_id)
        return message_id

    def start_answer(
        self,
        conversation_id: int,
        model: str,
        proposer: str,
        k: int,
        sampling: Optional[dict] = None,
        tree_nodes: Optional[int] = None,
        parent: Any = SHOWN_LEAF,
    ) -> int:
        """An empty assistant message, marked incomplete until finish_answer. Returns its id for append_tokens.
        tree_nodes: the size of the token trees it drafts (None or 0: chains of K); parent: as for add_message (a
        regenerated answer is a new version: it follows the same user message as the answer it joins)."""
        return self._insert_message(
            conversation_id,
            "assistant",
            "",
            False,
            clean_text(str(model), "the model name"),
            clean_text(str(proposer), "proposer"),
            _int_or_none(k),
            sampling,
            _int_or_none(tree_nodes),
            parent,
        )

    def _open_answer(self, conn: sqlite3.Connection, message_id: Any) -> Optional[sqlite3.Row]:
        """The message row, or None when it no longer exists (its conversation was deleted mid-answer)."""
        mid = _int_or_none(message_id)
        if mid is None:
            return None
        return conn.execute("SELECT id, conversation_id, role, complete FROM messages WHERE id = ?", (mid,)).fetchone()

    def append_tokens(self, message_id: int, tokens: list[dict]) -> bool:
        """Record one step's tokens (TokenEvent.to_dict() rows) and extend the message text, in one transaction.

        Returns False, writing nothing, when the message is gone (its conversation was deleted in another tab while
        the answer streamed): the caller may keep streaming. Raises StoreError for a message that is already
        finished or is not an answer.
        """
        rows = []
        for tok in tokens:
            if not isinstance(tok, dict):
                raise StoreError(f"a token record must be a dict (TokenEvent.to_dict()), got {type(tok).__name__}")
            token_id = _int_or_none(tok.get("id"))
            if token_id is None:
                raise StoreError(f"a token record has no integer 'id': {tok!r}")
            extra = {k: v for k, v in tok.items() if k not in TOKEN_FIELDS}
            rows.append(
                (
                    token_id,
                    clean_text(str(tok.get("text") or ""), "token text"),
                    str(tok.get("kind") or ""),
                    _real(tok.get("p_target")),
                    _real(tok.get("p_draft")),
                    _int_or_none(tok.get("rejected_id")),
                    _real(tok.get("rejected_p_target")),
                    _real(tok.get("rejected_p_draft")),
                    json.dumps(_jsonable(extra), allow_nan=False) if extra else None,
                )
            )
        text = "".join(row[1] for row in rows)
        now = time.time()

        def append(conn):
            message = self._open_answer(conn, message_id)
            if message is None:
                return False
            if message["role"] != "assistant" or message["complete"]:
                raise StoreError(f"message {message_id} is not an answer in progress; start one with start_answer")
            start = conn.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM tokens WHERE message_id = ?", (message["id"],)
            ).fetchone()[0]
            conn.executemany(
                "INSERT INTO tokens (message_id, seq, token_id, text, kind, p_target, p_draft, rejected_id, "
                "rejected_p_target, rejected_p_draft, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(message["id"], start + i) + row for i, row in enumerate(rows)],
            )
            if text:
                conn.execute("UPDATE messages SET content = content || ? WHERE id = ?", (text, message["id"]))
            conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, message["conversation_id"]))
            return True

        return self._write(append)

    def finish_answer(
        self, message_id: int, finish_reason: str, stats: dict | None = None, error: str | None = None
    ) -> bool:
        """Mark the answer complete with why it ended ('stop', 'length', 'cancelled', 'error') and its final stats.
        Returns False when the message is gone (see append_tokens)."""
        stats_json = json.dumps(_jsonable(stats), allow_nan=False) if stats is not None else None
        reason = clean_text(str(finish_reason), "finish reason")
        error = clean_text(str(error), "error") if error is not None else None
        now = time.time()

        def finish(conn):
            message = self._open_answer(conn, message_id)
            if message is None:
                return False
            if message["role"] != "assistant":
                raise StoreError(f"message {message_id} is not an answer")
            conn.execute(
                "UPDATE messages SET complete = 1, finish_reason = ?, stats = ?, error = ? WHERE id = ?",
                (reason, stats_json, error, message["id"]),
            )
            conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, message["conversation_id"]))
            return True

        finished = self._write(finish)
        if finished:
            self._tell("answer_finished", int(message_id))
        return finished

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        title = self._title(title)

        def rename(conn):
            cid = self._require_conversation(conn, conversation_id)
            conn.execute("UPDATE conversations SET title = ?, updated_at = ? WHERE id = ?", (title, time.time(), cid))

        self._write(rename)

    def retract_exchange(self, user_message_id: int, answer_id: int) -> bool:
        """Take back a user message and its answer when the answer failed before saying anything (the window puts
        the message back in the box, so a resend must not store it twice; user_message_id None: a regenerated answer
        alone). The version shown before is shown again (it is the most recently shown of what is left). A
        conversation left empty goes too; returns True when it did."""
        uid, aid = _int_or_none(user_message_id), _int_or_none(answer_id)

        def retract(conn) -> bool:
            row = conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (aid,)).fetchone()
            conn.execute("DELETE FROM messages WHERE id IN (?, ?)", (uid, aid))
            if (
                row is not None
                and conn.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (row[0],)).fetchone()[0]
                == 0
            ):
                conn.execute("DELETE FROM conversations WHERE id = ?", (row[0],))
                return True
            return False

        return self._write(retract)

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete the conversation, its messages and their tokens. Deleting one that is already gone is a no-op."""
        cid = _int_or_none(conversation_id)
        if cid is None:
            return
        self._write(lambda conn: conn.execute("DELETE FROM conversations WHERE id = ?", (cid,)))
        self._tell("conversation_deleted", cid)

    # -- reading -------------------------------------------------------------------------------------------------

    def list_conversations(self) -> list[ConversationSummary]:
        """Newest activity first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT c.id, c.title, c.model, c.created_at, c.updated_at, "
                "EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.complete = 0) AS incomplete "
                "FROM conversations c ORDER BY c.updated_at DESC, c.id DESC"
            ).fetchall()
        return [
            ConversationSummary(
                r["id"], r["title"], r["model"], r["created_at"], r["updated_at"], bool(r["incomplete"])
            )
            for r in rows
        ]

    def conversations_holding(self, words: Iterable[str]) -> set[int]:
        """Ids of the conversations in which every word occurs (case-folded, as a substring) in the title or in
        the text of any message, any version included. No words: every conversation."""
        words = [str(w).casefold() for w in words if str(w).strip()]
        query = "SELECT c.id FROM conversations c"
        where = [
            "(instr(casefold(c.title), ?) > 0 OR EXISTS (SELECT 1 FROM messages m "
            "WHERE m.conversation_id = c.id AND instr(casefold(m.content), ?) > 0))"
        ] * len(words)
        if where:
            query += " WHERE " + " AND ".join(where)
        with self._lock:
            rows = self._conn.execute(query, [w for w in words for _ in range(2)]).fetchall()
        return {r[0] for r in rows}

    def history_documents(self, model: str) -> list[HistoryDocument]:
        """The saved messages the 'history' proposers of pair `model` learn from, oldest first: its finished answers
        (their token ids) and the user messages of its conversations (text: token ids are the tokenizer's)."""
        with self._lock:
            conn = self._conn
            answers = conn.execute(
                "SELECT m.id, m.conversation_id FROM messages m WHERE m.role = 'assistant' AND m.model = ? "
                "AND m.complete = 1 ORDER BY m.id",
                (model,),
            ).fetchall()
            users = conn.execute(
                "SELECT m.id, m.conversation_id, m.content FROM messages m JOIN conversations c "
                "ON c.id = m.conversation_id WHERE m.role = 'user' AND c.model = ? ORDER BY m.id",
                (model,),
            ).fetchall()
            docs = [HistoryDocument(r["id"], r["conversation_id"], "user", r["content"], ()) for r in users]
            for r in answers:
                ids = conn.execute(
                    "SELECT token_id FROM tokens WHERE message_id = ? ORDER BY seq", (r["id"],)
                ).fetchall()
                docs.append(HistoryDocument(r["id"], r["conversation_id"], "assistant", "", tuple(t[0] for t in ids)))
        return sorted(docs, key=lambda d: d.message_id)

    def history_document(self, message_id: int) -> Optional[tuple[str, HistoryDocument]]:
        """(the pair that answered or was asked, the document) for one saved message, or None when it is gone."""
        with self._lock:
            row = self._conn.execute(
                "SELECT m.id, m.conversation_id, m.role, m.content, m.model, c.model AS conversation_model "
                "FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE m.id = ?",
                (_int_or_none(message_id),),
            ).fetchone()
            if row is None:
                return None
            ids = ()
            if row["role"] == "assistant":
                ids = tuple(
                    t[0]
                    for t in self._conn.execute(
                        "SELECT token_id FROM tokens WHERE message_id = ? ORDER BY seq", (row["id"],)
                    ).fetchall()
                )
        model = row["model"] if row["role"] == "assistant" else row["conversation_model"]
        content = row["content"] if row["role"] == "user" else ""
        return model, HistoryDocument(row["id"], row["conversation_id"], row["role"], content, ids)

    def message_ids_of(self, conversation_id: int) -> list[int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT id FROM messages WHERE conversation_id = ? ORDER BY id", (_int_or_none(conversation_id),)
            ).fetchall()
        return [r["id"] for r in rows]

    def get_conversation(self, conversation_id: int) -> Conversation:
        with self._lock:
            conn = self._conn
            cid = _int_or_none(conversation_id)
            row = (
                conn.execute("SELECT * FROM conversations WHERE id = ?", (cid,)).fetchone() if cid is not None else None
            )
            if row is None:
                raise StoreError(f"conversation {conversation_id!r} does not exist (it may have been deleted)")
            message_rows = conn.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (cid,)
            ).fetchall()
            token_rows = conn.execute(
                "SELECT t.* FROM tokens t JOIN messages m ON m.id = t.message_id WHERE m.conversation_id = ? "
                "ORDER BY t.message_id, t.seq",
                (cid,),
            ).fetchall()
        tokens: dict[int, list[dict]] = {}
        for t in token_rows:
            record = {
                "id": t["token_id"],
                "text": t["text"],
                "kind": t["kind"],
                "p_target": t["p_target"],
                "p_draft": t["p_draft"],
                "rejected_id": t["rejected_id"],
                "rejected_p_target": t["rejected_p_target"],
                "rejected_p_draft": t["rejected_p_draft"],
            }
            if t["extra"]:
                record.update(json.loads(t["extra"]))
            tokens.setdefault(t["message_id"], []).append(record)
        every = tuple(
            Message(
                id=m["id"],
                role=m["role"],
                content=m["content"],
                complete=bool(m["complete"]),
                created_at=m["created_at"],
                model=m["model"],
                proposer=m["proposer"],
                k=m["k"],
                finish_reason=m["finish_reason"],
                stats=json.loads(m["stats"]) if m["stats"] else None,
                error=m["error"],
                tokens=tuple(tokens.get(m["id"], ())),
                sampling=json.loads(m["sampling"]) if m["sampling"] else None,
                tree_nodes=m["tree_nodes"],
                parent_id=m["parent_id"],
                shown=m["shown"],
            )
            for m in message_rows
        )
        by_id = {m.id: m for m in every}
        path = shown_path((m.id, m.parent_id, m.shown) for m in every)
        return Conversation(
            row["id"],
            row["title"],
            row["model"],
            row["created_at"],
            row["updated_at"],
            tuple(by_id[i] for i in path),
            row["system_prompt"],
            every,
        )

    # -- export --------------------------------------------------------------------------------------------------

    def export_dict(self, conversation_id: int) -> dict:
        """The conversation as plain data: `messages` is the shown path, `other_versions` every message not shown
        (each names the message it follows, `parent_id`, and which version it is of how many)."""
        conv = self.get_conversation(conversation_id)
        shown = {m.id for m in conv.messages}
        return {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "id": conv.id,
            "title": conv.title,
            "model": conv.model,
            "created_at": _iso(conv.created_at),
            "updated_at": _iso(conv.updated_at),
            "system_prompt": conv.system_prompt,
            "messages": [_message_dict(conv, m) for m in conv.messages],
            "other_versions": [_message_dict(conv, m) for m in conv.every if m.id not in shown],
        }

    def export_json(self, conversation_id: int) -> str:
        """The whole conversation, token records included, as a JSON document (UTF-8 text, no NaN)."""
        return json.dumps(_jsonable(self.export_dict(conversation_id)), ensure_ascii=False, indent=2, allow_nan=False)

    def export_markdown(self, conversation_id: int) -> str:
        """A readable Markdown transcript: the shown path, then the other versions (each with its place and version
        number). Plain text: titles and messages appear exactly as stored."""
        conv = self.get_conversation(conversation_id)
        lines = [
            f"# {conv.title}",
            "",
            f"*Model: {conv.model} · started {_iso(conv.created_at)} · last change {_iso(conv.updated_at)}*",
            "",
        ]
        if (conv.system_prompt or "").strip():
            lines += ["## System prompt", "", conv.system_prompt, ""]
        for m in conv.messages:
            lines += _message_markdown(conv, m, "##")
        shown = {m.id for m in conv.messages}
        others = [m for m in conv.every if m.id not in shown]
        if others:
            lines += ["## Other versions (not shown)", ""]
            for m in others:
                lines += _message_markdown(conv, m, "###", where=f"message {conv.depth_of(m)}")
        return "\n".join(lines)


def _version(conv: Conversation, m: Message) -> tuple[int, int]:
    """(which version the message is, of how many), from 1."""
    versions = [v.id for v in conv.versions_of(m)]
    return versions.index(m.id) + 1, len(versions)


def _message_dict(conv: Conversation, m: Message) -> dict:
    version, versions = _version(conv, m)
    data = {
        "id": m.id,
        "parent_id": m.parent_id,
        "version": version,
        "versions": versions,
        "role": m.role,
        "content": m.content,
        "complete": m.complete,
        "created_at": _iso(m.created_at),
    }
    if m.role == "assistant":
        data.update(
            model=m.model,
            proposer=m.proposer,
            k=m.k,
            tree_nodes=m.tree_nodes,
            finish_reason=m.finish_reason,
            error=m.error,
            sampling=m.sampling,
            stats=m.stats,
            tokens=list(m.tokens),
        )
    return data


def _message_markdown(conv: Conversation, m: Message, level: str, where: str = "") -> list[str]:
    """One message of the Markdown transcript: a heading with its notes, then its text."""
    notes = [where] if where else []
    version, versions = _version(conv, m)
    if versions > 1:
        notes.append(f"version {version} of {versions}")
    if m.role == "assistant":
        if m.model:
            notes.append(m.model)
        if m.proposer:
            shape = f", tree {m.tree_nodes}" if m.tree_nodes else f", K={m.k}" if m.k else ""
            notes.append(f"proposer {m.proposer}{shape}")
        if not m.complete:
            notes.append("incomplete: the app stopped before this answer finished")
        elif m.finish_reason and m.finish_reason != "stop":
            notes.append(finish_words(m.finish_reason))
        if m.error:
            notes.append(f"error: {m.error}")
    heading = f"{level} {m.role.capitalize()}" + (f" ({'; '.join(notes)})" if notes else "")
    return [heading, "", m.content, ""]
