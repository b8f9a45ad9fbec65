"""What each control does. Handlers render events from the manager; they never touch a model themselves.

The conversation of a browser tab lives in a gr.State as a list of turns in their dict form; the handlers work on
UserTurn / AssistantTurn (turns.py) and convert at that boundary.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Optional

import gradio as gr

from localspec.config import ConfigError
from localspec.engine.events import PrefillProgress
from localspec.engine.metrics import StatsSnapshot

from .loadbar import LoadProgress
from .manager import Busy, ModelManager, drain
from .render import NO_COMPARE, compare_html, compare_running_html, stats_html, status_html, transcript_html
from .runtime import runtime_of
from .settings import (
    Speculation,
    answer_label,
    first_difference,
    proposer_choices,
    proposer_label,
    read_proposer,
    read_sampling,
    read_saved,
    read_speculation,
    read_stops,
    sampling_dict,
)
from .system_prompt import SystemPrompts, system_text
from .turns import AssistantTurn, Turn, UserTurn, turns_from_state
from .versions import branch

YIELD_EVERY_S = 0.08  # at most ~12 screen updates a second while streaming
UNCHANGED = (gr.skip(),) * 3  # the proposer, K and tree-nodes controls left as they are
STOPPING = "Stopping…"
WAITING = "Waiting: another answer is streaming (the model answers one request at a time)…"
NEW_CHAT = "Cleared: the next message starts a new chat."
ANSWERING = "Answering… (Stop keeps the partial answer)"
READING = "Reading the prompt…"
READING_SHOWN_AFTER_S = 1.0  # a prompt read faster than this is not worth a line of its own


def reading_status(progress: PrefillProgress, shown_after_s: float = READING_SHOWN_AFTER_S) -> Optional[str]:
    """The status while the engine reads a long prompt, once it has taken shown_after_s; None before."""
    if progress.elapsed_s < shown_after_s:
        return None
    percent = 100 * progress.read // max(progress.total, 1)  # rounded down: 100 % only once it is all read
    return f"{READING} {progress.read:,} / {progress.total:,} tokens ({percent} %)"


def _tokens_text(n: int) -> str:
    return f"{n} token{'s' if n != 1 else ''}"


def owner_of(request: Optional[gr.Request]) -> str:
    return (request.session_hash if request is not None else None) or "local"


def history_of(turns: list[Turn], system: Optional[str] = None) -> list[dict]:
    """The messages the model sees: the system prompt where there is one, then every turn's role and text (failed,
    empty answers left out)."""
    first = [{"role": "system", "content": system}] if system and system.strip() else []
    return first + [{"role": t.role, "content": t.content} for t in turns if isinstance(t, UserTurn) or t.content]


def events_json(turn: Optional[AssistantTurn]) -> Optional[dict]:
    return turn.events_json() if turn is not None else None


def answer_stats_html(turn: Optional[AssistantTurn], finish_reason: Optional[str], runtime=None) -> str:
    """The stats panel of an answer (empty for none): its proposer, K or tree size, and figures."""
    if turn is None:
        return stats_html(None)
    drafted = turn.proposer != "none"
    return stats_html(
        StatsSnapshot.from_dict(turn.stats) if turn.stats else None,
        proposer_label(turn.proposer),
        turn.k if drafted else None,
        finish_reason,
        runtime,
        turn.tree_nodes if drafted else None,
    )


def final_status(answer: AssistantTurn) -> str:
    """The status line once an answer ended."""
    reason = answer.finish_reason
    count = len(answer.tokens)
    if reason == "cancelled" and not count:
        return "Stopped before the first token; nothing was said."
    if reason == "cancelled":
        return f"Stopped after {_tokens_text(count)}; the partial answer is kept."
    if reason == "error":
        return answer.error or "the answer failed"
    if reason == "length":
        return f"Done: {count} tokens (reached max new tokens)."
    return f"Done: {count} tokens."


class Handlers:
    reading_shown_after_s = READING_SHOWN_AFTER_S

    def __init__(self, manager: ModelManager, recorder: Any = None, notice: Optional[str] = None) -> None:
        self.manager = manager
        self.notice = notice
        self.recorder = recorder  # optional Recorder: saves answers into the ConversationStore as they stream
        self.system_prompts = SystemPrompts(recorder.store if recorder is not None else None)
        self.shown: dict[str, Optional[str]] = {}  # the pair each tab's controls show, by owner
        self.watching: set[str] = set()  # tabs opened while a pair loaded: they show its stages until it ends
        # each tab's edit in progress (Actions.edit): {"turns": the turns taken out, "at": where}, with "kept": the
        # turns left in the window, so a window that changed since (another conversation opened) no longer matches
        self.edits: dict[str, dict] = {}

    def edit_in_progress(self, owner: str, turns: list[dict]) -> Optional[dict]:
        """The tab's edit in progress, when its window still shows what the edit left in it."""
        edit = self.edits.get(owner)
        return edit if edit is not None and edit["kept"] == turns else None

    # ---- one answer ------------------------------------------------------------------------------------------
    def _run(
        self,
        owner: str,
        history: list[dict],
        sampling,
        choice: Speculation,
        answer: AssistantTurn,
        sink=None,
        first_source: tuple[int, ...] = (),
        stops: tuple[str, ...] = (),
    ):
        """Stream one answer into `answer`; yields (answer, status) as it changes. first_source: the token ids the
        history proposers search first (the answer a Regenerate replaces). stops: stop strings that end it."""

        def spec_for(session):
            name = read_proposer(choice.proposer, tuple(session.proposers))
            return session.default_spec(
                proposer=name, k=choice.k, tree_nodes=choice.tree_nodes, adaptive=choice.adaptive
            )

        cancel = threading.Event()
        try:
            out = self.manager.answer(history, sampling, spec_for, cancel, sink, owner, first_source, stops)
        except Busy as exc:
            answer.streaming = False
            answer.finish_reason, answer.error = "error", str(exc)
            yield answer, str(exc)
            return
        status, last_yield, finished = "Thinking…", 0.0, False
        unsent = False  # a change not yet yielded (one that came too soon after the last yield waits for the next)
        while not finished:
            for msg in drain(out, 0.1):
                unsent = True
                if msg.kind == "waiting":
                    status = WAITING
                elif msg.kind == "started":
                    spec = msg.spec  # the SpecConfig the answer runs with (tree_nodes 0 where it drafts chains)
                    answer.model, answer.proposer, answer.k = msg.text, spec.proposer, spec.k
                    answer.tree_nodes = spec.tree_nodes
                    answer.label = answer_label(answer.model, answer.proposer, answer.k, answer.tree_nodes)
                    status = ANSWERING
                elif msg.kind == "notice":
                    answer.notice = msg.text
                elif msg.kind == "reading":
                    status = reading_status(msg.progress, self.reading_shown_after_s) or status
                elif msg.kind == "event":
                    status = ANSWERING  # the prompt is read (a step follows it at once)
                    event = msg.event
                    answer.tokens.extend(msg.records)
                    answer.content += "".join(r["text"] for r in msg.records)
                    answer.stats = event.stats.to_dict()
                    if event.finished:
                        answer.finish_reason = event.finish_reason
                        answer.error = event.error
                elif msg.kind == "error":
                    answer.finish_reason, answer.error = "error", msg.text
                elif msg.kind == "done":
                    finished = True
            if cancel.is_set() and not finished and status != STOPPING:  # Stop said here: see stop_button
                status, unsent = STOPPING, True
            if finished:
                answer.streaming = False
                if answer.finish_reason is None:
                    answer.finish_reason = "stop"
            now = time.monotonic()
            failed = answer.finish_reason == "error"  # shown once the worker is done (and the window free)
            if finished or (unsent and not failed and now - last_yield >= YIELD_EVERY_S):
                last_yield, unsent = now, False
                yield answer, status

    # ---- events ----------------------------------------------------------------------------------------------
    def send(
        self,
        message,
        turns,
        proposer,
        k,
        temperature,
        top_p,
        top_k,
        max_new_tokens,
        seed,
        colour,
        tree_nodes,
        keep_speculating=False,
        system_prompt="",
        repetition_penalty=1.0,
        stop_strings="",
        request: gr.Request = None,
    ):
        """Outputs: transcript, stats, status, events, message box, state. tree_nodes, keep_speculating, the system
        prompt, the repetition penalty and the stop strings come last of the inputs, so a gradio_client caller written
        for the inputs before them may leave them out (they get the controls' values)."""
        owner = owner_of(request)
        state = list(turns or [])
        text = "" if message is None else str(message)
        try:
            if not text.strip():
                raise ConfigError("the message is empty; type something to send")
            sampling = read_sampling(temperature, top_p, top_k, max_new_tokens, seed, repetition_penalty)
            stops = read_stops(stop_strings)
            choice = read_speculation(proposer, k, tree_nodes, keep_speculating)
            self._check_pair_shown(owner, proposer)
            if self.manager.is_answering(owner):
                raise Busy("an answer is still streaming in this window; press Stop or wait for it, then send")
        except ConfigError as exc:
            yield self._refused(str(exc), text, state, colour)
            return
        system = system_text(system_prompt)
        history = history_of(turns_from_state(state), system) + [{"role": "user", "content": text}]
        question = UserTurn(text).to_state()
        settings = sampling_dict(sampling, stops)
        answer = AssistantTurn(streaming=True, proposer=proposer, k=choice.k, sampling=settings, system=system)
        # an edit in progress: this exchange is a new version of the edited message, the old one kept with its turns
        edit = self.edit_in_progress(owner, state)
        before, at = (state + list(edit["turns"]), edit["at"]) if edit else (state, len(state))
        turns = branch(before, at, [question, answer.to_state()])
        yield (transcript_html(turns, colour), stats_html(None), status_html("Thinking…"), gr.skip(), "", turns)
        sink = None
        if self.recorder is not None:
            sink = self.recorder.sink(owner, text, settings, system=system, at=at if edit else None)
        for _, status in self._run(owner, history, sampling, choice, answer, sink, stops=stops):  # fills `answer`
            if answer.finish_reason == "error" and not answer.tokens:
                yield self._refused(answer.error, text, state, colour)  # nothing was said: message back, edit on
                return
            turns = branch(before, at, [question, answer.to_state()])
            yield (*self.answer_views(answer, turns, colour, status), gr.skip(), turns)
        if edit is not None:
            self.edits.pop(owner, None)

    def answer_views(
        self, answer: AssistantTurn, turns: list[dict], colour, status: str, note: str = ""
    ) -> tuple[str, str, str, dict]:
        """One update of a streaming answer: transcript, stats, status and events (send and regenerate share it).
        note: said after the final status (regenerate's word on greedy answers)."""
        done = not answer.streaming
        if done:
            status = f"{final_status(answer)} {note}".strip()
        stats = answer_stats_html(answer, answer.finish_reason if done else None, runtime_of(self.manager.session))
        kind = "error" if answer.finish_reason == "error" else "info"
        return transcript_html(turns, colour, answer.notice), stats, status_html(status, kind), events_json(answer)

    def _switched_away(self, owner: str) -> Optional[str]:
        """The pair now loaded, when another tab switched to it after this tab's controls were drawn."""
        shown, current = self.shown.get(owner), self.manager.name
        return current if owner in self.shown and shown != current and current and not self.manager.loading else None

    def _check_pair_shown(self, owner: str, proposer) -> None:
        switched, session = self._switched_away(owner), self.manager.session
        if switched and session is not None and proposer not in session.proposers:
            raise ConfigError(
                f"the model pair was switched to {switched} in another window; it has no "
                f"{proposer_label(proposer)} proposer. The controls here now show its "
                f"proposers: choose one and send again"
            )

    def refresh_pair(self, request: gr.Request = None):
        """Timer tick: when another tab switched the pair, redraw this tab's controls for it (once).
        Outputs: model dropdown, proposer, K, tree nodes, status."""
        owner = owner_of(request)
        if owner in self.watching:  # the page opened while a pair loaded: its stages, then the pair's controls
            if self.manager.loading and self.manager.load_bar is not None:
                return gr.skip(), *UNCHANGED, self.manager.load_bar.html()
            self.watching.discard(owner)
            self.shown[owner] = self.manager.name
            return self.manager.name, *self.proposer_updates(), self._ready_status()
        switched = self._switched_away(owner)
        if switched is None:
            self.shown.setdefault(owner, self.manager.name)
            return gr.skip(), *UNCHANGED, gr.skip()
        self.shown[owner] = switched
        return (
            switched,
            *self.proposer_updates(),
            status_html(
                f"The model pair was switched to {switched} in another window; the controls here now "
                f"show its proposers."
            ),
        )

    @staticmethod
    def _refused(reason: str, text: str, state: list[dict], colour) -> tuple:
        """Send's outputs for a refused message: real values everywhere (an API caller cannot read gr.skip()), the
        window as it was, the reason in the status line and the message back in the box."""
        last = next((turn for turn in reversed(turns_from_state(state)) if isinstance(turn, AssistantTurn)), None)
        stats = answer_stats_html(last, last.finish_reason if last else None)
        return transcript_html(state, colour), stats, status_html(reason, "error"), events_json(last), text, state

    def stop(self, request: gr.Request = None):
        """The API's stop: says what it did."""
        if self.manager.cancel(owner_of(request)):
            return status_html(STOPPING)
        return status_html("Nothing is streaming.")

    def stop_button(self, request: gr.Request = None):
        """The window's Stop. The stopped stream itself says "Stopping…" and then how it ended: this event's own
        reply can land after that end and would hide it."""
        if self.manager.cancel(owner_of(request)):
            return gr.skip()
        return status_html("Nothing is streaming.")

    def clear(self, request: gr.Request = None):
        """Clear and New chat: an empty window whose next message starts a new conversation, with the default
        system prompt. Outputs: transcript, stats, status, events, compare, state, system prompt."""
        self.manager.cancel(owner_of(request))
        self.edits.pop(owner_of(request), None)
        if self.recorder is not None:
            self.recorder.set_conversation(owner_of(request), None)  # the next message starts a new conversation
        status = status_html(NEW_CHAT)
        return transcript_html([]), stats_html(None), status, None, NO_COMPARE, [], self.system_prompts.default()

    def recolour(self, colour, turns):
        return transcript_html(list(turns or []), colour)

    def compare(self, turns, request: gr.Request = None):
        """Regenerate the last prompt with speculation off. Outputs: compare panel, status."""
        turns = turns_from_state(turns)
        last = next(
            (i for i in range(len(turns) - 1, -1, -1) if isinstance(turns[i], AssistantTurn) and turns[i].tokens), None
        )
        if last is None:
            yield (
                NO_COMPARE,
                status_html("Send a message first; compare regenerates the last answer without speculation.", "error"),
            )
            return
        spec_answer = turns[last]
        if spec_answer.proposer == "none":
            yield (
                NO_COMPARE,
                status_html(
                    "The last answer already ran with speculation off; pick a proposer and send again to compare.",
                    "error",
                ),
            )
            return
        if not spec_answer.sampling:
            yield (
                NO_COMPARE,
                status_html(
                    "This answer was saved without its sampling settings (an older version of the "
                    "app); send the message again to compare.",
                    "error",
                ),
            )
            return
        try:
            sampling, stops = read_saved(spec_answer.sampling)
        except (ConfigError, KeyError, TypeError) as exc:
            yield NO_COMPARE, status_html(f"cannot repeat the last answer's settings: {exc}", "error")
            return
        history = history_of(turns[:last], spec_answer.system)
        if self.manager.is_answering(owner_of(request)):
            yield (
                gr.skip(),
                status_html("an answer is still streaming in this window; wait for it or press Stop", "error"),
            )
            return
        baseline = AssistantTurn(streaming=True)
        yield compare_running_html(0), status_html("Baseline: regenerating the last prompt with speculation off…")
        baseline_choice = Speculation("none", spec_answer.k or 1)
        for _, status in self._run(owner_of(request), history, sampling, baseline_choice, baseline, stops=stops):
            if baseline.streaming:
                yield (
                    compare_running_html(len(baseline.tokens)),
                    status_html(
                        status
                        if status in (WAITING, STOPPING)
                        else f"Baseline: {status}"
                        if status.startswith(READING)
                        else f"Baseline (speculation off): {_tokens_text(len(baseline.tokens))} so far…"
                    ),
                )
                continue
            if baseline.finish_reason == "error":
                yield NO_COMPARE, status_html(baseline.error or "the baseline failed", "error")
                return
            spec_ids = [t["id"] for t in spec_answer.tokens]
            base_ids = [t["id"] for t in baseline.tokens]
            diff = first_difference(spec_ids, base_ids)
            stopped = "cancelled" in (spec_answer.finish_reason, baseline.finish_reason)
            if stopped and diff == min(len(spec_ids), len(base_ids)):
                diff = None  # one ended early: what both said is compared, not where one of them stopped
            done = (
                f"Baseline stopped after {_tokens_text(len(base_ids))}"
                if baseline.finish_reason == "cancelled"
                else f"Baseline done: {_tokens_text(len(base_ids))}"
            )
            note = " (the speculative answer was stopped early)" if spec_answer.finish_reason == "cancelled" else ""
            yield (
                compare_html(
                    spec_answer.stats,
                    baseline.stats,
                    proposer_label(spec_answer.proposer),
                    greedy=sampling.greedy,
                    identical=diff is None,
                    first_difference=diff,
                    spec_texts=[t.get("text", "") for t in spec_answer.tokens],
                    base_texts=[t.get("text", "") for t in baseline.tokens],
                    answer_index=sum(isinstance(t, AssistantTurn) for t in turns[:last]),
                    stopped=stopped,
                ),
                status_html(f"{done}{note}."),
            )

    # ---- model pairs -----------------------------------------------------------------------------------------
    def switch(self, name, request: gr.Request = None):
        """Outputs: status, model dropdown, proposer, K, tree nodes."""
        manager = self.manager
        if name is None or name not in {p.name for p in manager.pairs}:
            kept = f" Still using {manager.name}." if manager.name else ""
            broken = manager.broken_entry(name)
            reason = (
                f"this models.yaml entry is unavailable: {broken.error}"
                if broken
                else f"choose a model pair from the list (got {name!r})"
            )
            self.shown[owner_of(request)] = manager.name
            yield status_html(f"Could not switch: {reason}.{kept}", "error"), manager.name, *self.proposer_updates()
            return
        if name == manager.name and manager.session is not None:
            self.shown[owner_of(request)] = name
            yield status_html(f"{name} is already loaded."), name, *UNCHANGED  # the tab's choices stay
            return
        progress: queue.Queue[Optional[str]] = queue.Queue()
        result: dict = {}

        def work():
            try:
                result["seconds"] = manager.load(name, progress=progress.put)
            except Busy as exc:
                result["busy"] = str(exc)
            except ConfigError as exc:
                result["error"] = str(exc)
            finally:
                progress.put(None)

        bar = LoadProgress(name, manager.pairs)
        threading.Thread(target=work, daemon=True, name="localspec-load").start()
        yield bar.html(), gr.skip(), *UNCHANGED
        while True:
            message = progress.get()
            if message is None:
                break
            yield bar.advance(message), gr.skip(), *UNCHANGED
        if "seconds" in result:
            self.shown[owner_of(request)] = name
            notices = manager.session.notices
            yield (
                status_html(
                    " ".join((f"Loaded {name} in {result['seconds']:.1f} s.", *notices)), "error" if notices else "info"
                ),
                name,
                *self.proposer_updates(),
            )
            return
        reason = result.get("busy") or result.get("error")
        kept = f" Still using {manager.name}." if manager.name else ""
        yield (
            status_html(f"Could not switch: {reason}.{kept}" if "error" in result else f"{reason}.{kept}", "error"),
            manager.name,
            *UNCHANGED,
        )

    def proposer_updates(self):
        """The proposer, K and tree-nodes controls set to the loaded pair's defaults."""
        session = self.manager.session
        if session is None:
            return gr.update(choices=[("off", "none")], value="none"), gr.update(), gr.update()
        spec = session.default_spec()
        return (
            gr.update(choices=proposer_choices(tuple(session.proposers)), value=spec.proposer),
            gr.update(value=spec.k),
            gr.update(value=spec.tree_nodes),
        )

    def on_load(self, request: gr.Request = None):
        """Page (re)load: show the pair in use. Outputs: model dropdown, proposer, K, tree nodes, status."""
        manager, owner = self.manager, owner_of(request)
        self.shown[owner] = manager.name
        if manager.loading and manager.load_bar is not None:  # its stages until it ends, then ready (refresh_pair)
            self.watching.add(owner)
            return (manager.name, *self.proposer_updates(), manager.load_bar.html())
        return (manager.name, *self.proposer_updates(), self._ready_status())

    def _ready_status(self) -> str:
        manager = self.manager
        if manager.session is None and manager.load_error:  # a failed switch leaves the old pair: not shown here
            return status_html(f"Model load failed: {manager.load_error}", "error")
        ready = manager.ready_text()
        alert = bool(self.notice or (manager.session is not None and manager.session.notices))
        return status_html(f"{ready} {self.notice}" if self.notice else ready, "error" if alert else "info")
