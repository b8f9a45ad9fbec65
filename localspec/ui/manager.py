"""The one loaded model pair, shared by every browser tab: loads pairs and runs answers one at a time.

An answer runs in its own worker thread that holds the model lock and pushes messages onto a queue, so a closed
browser tab never leaves the lock held, and two tabs sending at once are served in turn, each into its own queue.
Loading a pair takes the same lock: a switch while an answer streams is refused with a message.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Optional

from localspec.config import ConfigError, PairSpec, SamplingParams, SpecConfig, require_proposer
from localspec.engine.events import PrefillProgress, StepEvent
from localspec.models.memory import must_free_first, release_models
from localspec.models.registry import BrokenEntry, find_pair
from localspec.server.admission import Admission, QueueFull

from .loadbar import LoadProgress
from .render import token_record
from .stopping import StoppedRecords

Progress = Callable[[str], None]
SessionFactory = Callable[[PairSpec, Progress], object]  # (pair, progress) -> ChatSession
EventObserver = Callable[[object, str, int], None]  # (StepEvent, pair name, prompt tokens): the metrics


class Busy(ConfigError):
    """The model is answering (or loading); the request was refused, nothing changed."""


def default_session_factory(device: Optional[str] = None) -> SessionFactory:
    def factory(pair: PairSpec, progress: Progress):
        from localspec.chat import ChatSession
        from localspec.models.loading import load_pair

        return ChatSession(load_pair(pair, device=device, progress=progress))

    return factory


def trust_marker(pair: PairSpec) -> bool:
    return bool(pair.target.trust_remote_code or (pair.draft is not None and pair.draft.trust_remote_code))


MessageKind = Literal["waiting", "started", "notice", "reading", "event", "error", "done"]


@dataclass
class Message:
    """What an answer's worker sends to the handler streaming it."""

    kind: MessageKind
    event: Optional[StepEvent] = None  # for 'event'
    progress: Optional[PrefillProgress] = None  # for 'reading': how much of the prompt the engine has read
    records: tuple[dict, ...] = ()  # token records (TokenEvent.to_dict() plus text) of this event's tokens
    text: str = ""  # for 'notice' / 'error' / 'started' (the pair name)
    spec: Optional[SpecConfig] = None  # for 'started': the SpecConfig the answer runs with


Sink = Callable[[Message], None]  # sees every Message in the worker thread (saving answers), even with no browser


class _Out:
    """The queue a handler reads, plus an optional sink that sees each message first (and may not break it)."""

    def __init__(self, sink: Optional[Sink]) -> None:
        self.queue: queue.Queue[Message] = queue.Queue()
        self.sink = sink

    def put(self, message: Message) -> None:
        if self.sink is not None:
            try:
                self.sink(message)
            except Exception as exc:  # saving failed: say so, keep answering
                self.sink = None
                self.queue.put(Message("notice", text=f"saving this answer failed: {type(exc).__name__}: {exc}"))
        self.queue.put(message)


class ModelManager:
    def __init__(
        self,
        pairs: list[PairSpec],
        factory: SessionFactory,
        admission: Optional[Admission] = None,
        observer: Optional[EventObserver] = None,
        broken: Sequence[BrokenEntry] = (),
    ) -> None:
        if not pairs:
            raise ConfigError("models.yaml lists no model pairs")
        self.pairs = pairs
        self.broken = tuple(broken)  # models.yaml entries that could not be read: offered as unavailable
        self.factory = factory
        self.session = None
        self.name: Optional[str] = None
        self.load_error: Optional[str] = None
        self.loading: Optional[str] = None
        self.load_bar: Optional[LoadProgress] = None  # the stages of the load under way (or of the last one)
        self.load_seconds = 0.0  # how long the last successful load took
        self.answering = 0  # answers running or queued
        # held while an answer streams or a pair loads; FIFO, and shared with the API when it runs (server/)
        self._lock = admission if admission is not None else Admission()
        self.observer = observer
        self._count_lock = threading.Lock()
        self._cancels: dict[str, threading.Event] = {}
        self._busy_owners: set[str] = set()  # tabs with an answer running or queued
        self._followers: dict[str, set[str]] = {}  # owner → the tabs that took part in its answer (follow)
        self.history = None  # a store.history.HistoryBook when conversations are saved: the history proposers' data
        self.catalog = None  # a models.user_models.Catalog: where Rescan reads the pairs again
        self.catalog_read = None  # what the catalog read last (the found models and the pairs they make)

    def attach_catalog(self, catalog, read) -> None:
        """Rescan reads the pairs from this catalog; `read` is what it read at start."""
        self.catalog, self.catalog_read = catalog, read

    def rescan(self):
        """Read the shipped and user models.yaml and the models on this machine again; the dropdown offers what
        they hold now. The loaded pair stays loaded (and listed) even when its files went away."""
        if self.catalog is None:
            raise ConfigError("this window was started without a catalog to rescan")
        read = self.catalog.read()
        pairs = list(read.pairs)
        if self.name is not None and all(p.name != self.name for p in pairs):
            pairs.append(self.pair(self.name))
        if not pairs:
            raise ConfigError("no model pairs found on a rescan; the old list stays")
        self.pairs, self.broken, self.catalog_read = pairs, tuple(read.broken), read
        return read

    def attach_history(self, book) -> None:
        """Give every pair loaded from now on (and the one loaded now) the saved conversations' index."""
        self.history = book
        if self.session is not None:
            self._give_history(self.session, self.name or "")

    def _give_history(self, session, name: str) -> None:
        if self.history is None:
            return
        tokenizer = session.tokenizer
        session.history = self.history.index_for(
            name, lambda text: tokenizer.encode(text, add_special_tokens=False), session.vocab_size
        )

    # ---- model pairs -------------------------------------------------------------------------------------
    def pair(self, name: Optional[str]) -> PairSpec:
        return find_pair(self.pairs, name)

    def choices(self) -> list[tuple[str, str]]:
        """Dropdown entries (label, value); entries that run the model's own code are marked."""
        return [
            ((f"{p.name}  ⚠ runs model code (trust_remote_code)" if trust_marker(p) else p.name), p.name)
            for p in self.pairs
        ] + [(b.label, b.value) for b in self.broken]

    def broken_entry(self, value: object) -> Optional[BrokenEntry]:
        return next((b for b in self.broken if b.value == value), None)

    def load(self, name: Optional[str], progress: Progress = lambda _msg: None) -> float:
        """Load a pair and make it current. On failure the previous pair stays loaded and usable."""
        pair = self.pair(name)
        if not self._lock.acquire(blocking=False):
            if self.loading == pair.name:  # the same switch asked twice (a double event): share its outcome
                with self._lock:
                    pass
                if self.name == pair.name and self.session is not None:
                    return self.load_seconds
                raise ConfigError(self.load_error or f"could not load {pair.name!r}")
            if self.loading:
                raise Busy(f"{self.loading} is still loading; wait for it, then choose again")
            raise Busy(
                "an answer is streaming; the model was not switched. Press Stop or wait for the answer, "
                "then choose the model again"
            )
        self.load_bar = LoadProgress(pair.name, self.pairs)  # before `loading`: whoever sees that draws this
        self.loading = pair.name
        started = time.perf_counter()

        def said(message: str) -> None:  # every tab can draw the bar of a load it did not start (loadbar.py)
            self.load_bar.advance(message)
            progress(message)

        try:
            if self.session is not None and must_free_first(pair):  # both will not fit: the old pair goes first
                said(f"Freeing {self.name} first: {pair.name} and it do not both fit in GPU memory…")
                self.session, self.name = None, None
                release_models()
            session = self.factory(pair, said)
            self._give_history(session, pair.name)
            # made current before the lock is let go: a second ask for this switch waits on the lock, then reads it
            self.session, self.name, self.load_error = session, pair.name, None
            self.load_seconds = time.perf_counter() - started
        except ConfigError as exc:
            self.load_error = str(exc)
            raise
        except Exception as exc:  # a model that fails in an unforeseen way must not take the app down
            self.load_error = f"could not load {pair.name!r}: {type(exc).__name__}: {exc}"
            raise ConfigError(self.load_error) from None
        finally:
            self.loading = None
            self._lock.release()
        release_models()  # the previous pair, now unreferenced
        return self.load_seconds

    def ready_text(self) -> str:
        """The status line for the loaded pair: its name, and why a part of it is not offered."""
        if self.session is None:
            if self.load_error:
                return f"Model load failed: {self.load_error}"
            return "No model loaded; choose a model pair."
        return " ".join((f"{self.name} is ready.", *self.session.notices))

    # ---- cancellation per browser session -------------------------------------------------------------------
    def cancel(self, owner: str) -> bool:
        event = self._cancels.get(owner)
        if event is None or event.is_set():
            return False
        event.set()
        return True

    # ---- answers ---------------------------------------------------------------------------------------------
    def is_answering(self, owner: str) -> bool:
        return owner in self._busy_owners

    def stopping(self, owner: str) -> bool:
        """Stop was pressed for owner's answer, which has not ended yet."""
        event = self._cancels.get(owner)
        return owner in self._busy_owners and event is not None and event.is_set()

    def follow(self, owner: str, follower: str) -> bool:
        """The tab `follower` (a reload of `owner`'s page, or another tab) shows `owner`'s answer as it streams: its
        Stop stops it, and it starts no answer of its own until that one ends. False when owner answers nothing."""
        with self._count_lock:
            if owner not in self._busy_owners or follower in self._busy_owners:
                return False
            self._busy_owners.add(follower)
            self._cancels[follower] = self._cancels[owner]
            self._followers.setdefault(owner, set()).add(follower)
        return True

    def answer(
        self,
        messages: list[dict],
        sampling: SamplingParams,
        spec: Callable[[object], SpecConfig],
        cancel: threading.Event,
        sink: Optional[Sink] = None,
        owner: str = "",
        first_source: tuple[int, ...] = (),
        stops: tuple[str, ...] = (),
    ) -> queue.Queue[Message]:
        """Start one answer in a worker thread; read its Messages from the returned queue until 'done'.

        spec is called with the session that will answer (so a proposer is checked against the pair in use).
        sink, when given, sees every message in the worker thread, so an answer is saved even when the browser tab
        that asked for it is gone. first_source: token ids the history proposers search first (the answer a
        Regenerate replaces). stops: stop strings that end the answer where one appears (ui/stopping.py).
        """
        out = _Out(sink)
        with self._count_lock:
            if owner and owner in self._busy_owners:
                raise Busy("an answer is still streaming in this window; press Stop or wait for it")
            self.answering += 1
            if owner:
                self._busy_owners.add(owner)
                self._cancels[owner] = cancel  # Stop in that window sets it
        self._lock.workers.start(
            lambda: self._work(messages, sampling, spec, cancel, out, owner, first_source, stops),
            cancel,
            "localspec-answer",
        )
        return out.queue

    def stop_answers(self) -> bool:
        """Cancel every running or queued answer (chat window and API) and wait for their threads; True when all
        ended in time. For a process that is ending."""
        return self._lock.workers.stop()

    def _work(self, messages, sampling, spec_for, cancel, out, owner="", first_source=(), stops=()) -> None:
        try:
            try:
                ticket = self._lock.enter("chat")
            except QueueFull as exc:
                out.put(Message("error", text=str(exc)))
                return
            try:
                early = self._prompt_then_wait(ticket, messages, sampling, cancel, out)
                if early is not None:
                    self._answer_locked(messages, sampling, spec_for, cancel, out, early, first_source, stops)
            finally:
                self._lock.leave(ticket)
        finally:
            with self._count_lock:
                self.answering -= 1
                self._busy_owners.discard(owner)
                self._busy_owners.difference_update(self._followers.pop(owner, ()))
            out.put(Message("done"))

    def _prompt_then_wait(self, ticket, messages, sampling, cancel, out):
        """Build the prompt without holding the engine (the ticket is not ready: the answers behind it go first),
        then wait for the engine. (session, (ids, notice) | None) once held; None when the prompt failed or Stop was
        pressed (the error is sent). A pair loaded while it waited: the engine is given back and the prompt built
        again on the new pair."""
        told_waiting = False
        while True:
            session = self.session
            prompt = self._prompt(session, messages, sampling, cancel)
            if isinstance(prompt, Exception):
                text = (
                    str(prompt)
                    if isinstance(prompt, ConfigError)
                    else f"the answer failed: {type(prompt).__name__}: {prompt}"
                )
                out.put(Message("error", text=text))
                return None
            while not self._lock.wait(ticket, timeout=0.1):
                if not told_waiting:
                    out.put(Message("waiting"))
                    told_waiting = True
                if cancel.is_set():
                    out.put(Message("error", text="stopped while waiting for the model"))
                    return None
            if self.session is session:
                return session, prompt
            self._lock.step_back(ticket)

    @staticmethod
    def _prompt(session, messages, sampling, cancel=None):
        """(ids, notice) of the chat on this session, or the exception it raised; None without a session."""
        if session is None:
            return None
        try:
            return session.prompt_ids(messages, sampling.max_new_tokens, cancel=cancel)
        except Exception as exc:
            return exc

    def _answer_locked(self, messages, sampling, spec_for, cancel, out, early, first_source=(), stops=()) -> None:
        """Answer with the engine held. `early`: (session, prompt) built before the wait (_prompt_then_wait), the
        session still loaded. first_source, stops: see answer()."""
        session, prompt = early
        if session is None:
            out.put(Message("error", text=self.load_error or "no model is loaded; choose a model pair"))
            return
        try:
            spec = spec_for(session).validate()
            require_proposer(self.name or "", spec.proposer, tuple(session.proposers))
            spec = session.answer_spec(spec)  # as the engine runs it: the one record 'started' carries
            sampling.validate()
            ids, notice = prompt
            out.put(Message("started", text=self.name or "", spec=spec))
            if notice:
                out.put(Message("notice", text=notice))
            decode = session.tokenizer.decode
            shown = StoppedRecords(stops)
            events = session.stream_ids(ids, sampling, spec, cancel, first_source)
            for event in events:
                if isinstance(event, PrefillProgress):  # no step: nothing to record or count
                    out.put(Message("reading", progress=event))
                    continue
                records = shown.add([token_record(tok, decode) for tok in event.tokens], event.finished)
                if self.observer is not None:
                    self.observer(event, self.name or "", len(ids))
                if shown.stopped:  # a stop string: the answer ends here, and the engine is let go
                    event = replace(event, finished=True, finish_reason="stop")
                out.put(Message("event", event=event, records=records))
                if shown.stopped:
                    events.close()
                    break
        except ConfigError as exc:
            out.put(Message("error", text=str(exc)))
        except Exception as exc:  # the app stays up; the user sees what went wrong
            out.put(Message("error", text=f"the answer failed: {type(exc).__name__}: {exc}"))


def drain(out: queue.Queue[Message], wait_s: float = 0.05) -> Iterator[Message]:
    """The messages available now (waiting up to wait_s for the first one)."""
    try:
        yield out.get(timeout=wait_s)
    except queue.Empty:
        return
    while True:
        try:
            yield out.get_nowait()
        except queue.Empty:
            return
