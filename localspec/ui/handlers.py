"""What each control does. Handlers render events from the manager; they never touch a model themselves.

The conversation of a browser tab lives in a gr.State as a list of turns:
  {"role": "user", "content": str}
  {"role": "assistant", "content": str, "tokens": [token records], "stats": dict, "finish_reason": str | None,
   "error": str | None, "model": str, "proposer": str, "k": int, "sampling": dict, "label": str}
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Optional

import gradio as gr

from localspec.config import ConfigError
from .render import compare_html, stats_html, status_html, transcript_html
from .manager import Busy, ModelManager, drain
from .settings import (PROPOSER_LABELS, first_difference, proposer_choices, read_k, read_proposer, read_sampling,
                       sampling_dict)

YIELD_EVERY_S = 0.08  # at most ~12 screen updates a second while streaming
WAITING = "Waiting: another answer is streaming (the model answers one request at a time)…"


def owner_of(request: Optional[gr.Request]) -> str:
    return getattr(request, "session_hash", None) or "local"


def history_of(turns: list[dict]) -> list[dict]:
    """The messages the model sees: every turn's role and text (failed, empty answers left out)."""
    return [{"role": t["role"], "content": t.get("content", "")} for t in turns
            if t["role"] != "assistant" or t.get("content")]


def events_json(turn: Optional[dict]) -> Optional[dict]:
    if not turn:
        return None
    return {key: turn.get(key) for key in ("model", "proposer", "k", "finish_reason", "error", "stats", "tokens")}


class Handlers:
    def __init__(self, manager: ModelManager, recorder: Any = None, notice: Optional[str] = None) -> None:
        self.manager = manager
        self.notice = notice
        self.recorder = recorder  # optional Recorder: saves answers into the ConversationStore as they stream

    # ---- one answer ------------------------------------------------------------------------------------------
    def _run(self, owner: str, history: list[dict], sampling, proposer: str, k: int, answer: dict, sink=None):
        """Stream one answer into `answer` (a turn dict); yields (answer, status) as it changes."""
        chosen: dict = {}

        def spec_for(session):
            name = read_proposer(proposer, tuple(session.proposers))
            spec = session.default_spec(proposer=name, k=k)
            chosen.update(proposer=name, k=spec.k)
            return spec

        try:
            out = self.manager.answer(history, sampling, spec_for, threading.Event(), sink, owner)
        except Busy as exc:
            answer.pop("pending", None)
            answer["finish_reason"], answer["error"] = "error", str(exc)
            yield answer, str(exc)
            return
        status, last_yield, finished = "Thinking…", 0.0, False
        while not finished:
            changed = False
            for msg in drain(out, 0.1):
                changed = True
                if msg.kind == "waiting":
                    status = WAITING
                elif msg.kind == "started":
                    answer.update(model=msg.text, proposer=chosen.get("proposer"), k=chosen.get("k"))
                    answer["label"] = (f"{msg.text} · {PROPOSER_LABELS.get(answer['proposer'], answer['proposer'])}"
                                       + (f" · K={answer['k']}" if answer["proposer"] != "none" else ""))
                    status = "Answering… (Stop keeps the partial answer)"
                elif msg.kind == "notice":
                    answer["notice"] = msg.text
                elif msg.kind == "event":
                    event = msg.event
                    answer["tokens"].extend(msg.records)
                    answer["content"] += "".join(r["text"] for r in msg.records)
                    answer["stats"] = event.stats.to_dict()
                    if event.finished:
                        answer["finish_reason"] = event.finish_reason
                        answer["error"] = event.error
                elif msg.kind == "error":
                    answer["finish_reason"], answer["error"] = "error", msg.text
                elif msg.kind == "done":
                    finished = True
            if finished:
                answer.pop("pending", None)
                if answer.get("finish_reason") is None:
                    answer["finish_reason"] = "stop"
            now = time.monotonic()
            failed = answer.get("finish_reason") == "error"  # shown once the worker is done (and the window free)
            if finished or (changed and not failed and now - last_yield >= YIELD_EVERY_S):
                last_yield = now
                yield answer, status

    # ---- events ----------------------------------------------------------------------------------------------
    def send(self, message, turns, proposer, k, temperature, top_p, top_k, max_new_tokens, seed, colour,
             request: gr.Request = None):
        """Outputs: transcript, stats, status, events, message box, state."""
        owner = owner_of(request)
        turns = list(turns or [])
        text = "" if message is None else str(message)
        try:
            if not text.strip():
                raise ConfigError("the message is empty; type something to send")
            sampling = read_sampling(temperature, top_p, top_k, max_new_tokens, seed)
            k_value = read_k(k)
            if self.manager.is_answering(owner):
                raise Busy("an answer is still streaming in this window; press Stop or wait for it, then send")
        except ConfigError as exc:
            yield (gr.skip(), gr.skip(), status_html(str(exc), "error"), gr.skip(), text, turns)
            return
        history = history_of(turns) + [{"role": "user", "content": text}]
        answer = {"role": "assistant", "content": "", "tokens": [], "pending": True, "stats": None,
                  "finish_reason": None, "error": None, "proposer": proposer, "k": k_value,
                  "sampling": sampling_dict(sampling)}
        turns = turns + [{"role": "user", "content": text}, answer]
        yield (transcript_html(turns, colour), stats_html(None), status_html("Thinking…"), gr.skip(), "", turns)
        sink = self.recorder.sink(owner, text, sampling_dict(sampling)) if self.recorder is not None else None
        for answer, status in self._run(owner, history, sampling, proposer, k_value, answer, sink):
            if answer.get("finish_reason") == "error" and not answer["tokens"]:
                turns = turns[:-2]  # nothing was said: take the message back into the box
                yield (transcript_html(turns, colour), gr.skip(), status_html(answer["error"], "error"), gr.skip(),
                       text, turns)
                return
            done = "pending" not in answer
            if done:
                status = self._final_status(answer)
            yield (transcript_html(turns, colour, answer.get("notice")),
                   stats_html(answer["stats"], PROPOSER_LABELS.get(answer.get("proposer"), answer.get("proposer")),
                              answer.get("k") if answer.get("proposer") != "none" else None,
                              answer.get("finish_reason") if done else None),
                   status_html(status, "error" if answer.get("finish_reason") == "error" else "info"),
                   events_json(answer), gr.skip(), turns)

    @staticmethod
    def _final_status(answer: dict) -> str:
        reason = answer.get("finish_reason")
        count = len(answer["tokens"])
        if reason == "cancelled":
            return f"Stopped after {count} tokens; the partial answer is kept."
        if reason == "error":
            return answer.get("error") or "the answer failed"
        if reason == "length":
            return f"Done: {count} tokens (reached max new tokens)."
        return f"Done: {count} tokens."

    def stop(self, request: gr.Request = None):
        if self.manager.cancel(owner_of(request)):
            return status_html("Stopping…")
        return status_html("Nothing is streaming.")

    def clear(self, request: gr.Request = None):
        """Outputs: transcript, stats, status, events, compare, state."""
        self.manager.cancel(owner_of(request))
        if self.recorder is not None:
            self.recorder.set_conversation(owner_of(request), None)  # the next message starts a new conversation
        return transcript_html([]), stats_html(None), status_html("Cleared."), None, "", []

    def recolour(self, colour, turns):
        return transcript_html(list(turns or []), colour)

    def compare(self, turns, request: gr.Request = None):
        """Regenerate the last prompt with speculation off. Outputs: compare panel, status."""
        turns = list(turns or [])
        last = next((i for i in range(len(turns) - 1, -1, -1) if turns[i]["role"] == "assistant"
                     and turns[i].get("tokens")), None)
        if last is None:
            yield "", status_html("Send a message first; compare regenerates the last answer without speculation.",
                                  "error")
            return
        spec_answer = turns[last]
        if spec_answer.get("proposer") == "none":
            yield "", status_html("The last answer already ran with speculation off; pick a proposer and send "
                                  "again to compare.", "error")
            return
        if not spec_answer.get("sampling"):
            yield "", status_html("This answer was saved without its sampling settings (an older version of the "
                                  "app); send the message again to compare.", "error")
            return
        try:
            sampling = read_sampling(**spec_answer["sampling"])
        except (ConfigError, KeyError, TypeError) as exc:
            yield "", status_html(f"cannot repeat the last answer's settings: {exc}", "error")
            return
        history = history_of(turns[:last])
        if self.manager.is_answering(owner_of(request)):
            yield gr.skip(), status_html("an answer is still streaming in this window; wait for it or press Stop",
                                         "error")
            return
        baseline = {"role": "assistant", "content": "", "tokens": [], "pending": True, "stats": None}
        yield gr.skip(), status_html("Baseline: regenerating the last prompt with speculation off…")
        for baseline, status in self._run(owner_of(request), history, sampling, "none", spec_answer.get("k") or 1,
                                          baseline):
            if "pending" in baseline:
                yield gr.skip(), status_html(f"Baseline: {len(baseline['tokens'])} tokens…"
                                             if status != WAITING else status)
                continue
            if baseline.get("finish_reason") == "error":
                yield "", status_html(baseline.get("error") or "the baseline failed", "error")
                return
            spec_ids = [t["id"] for t in spec_answer["tokens"]]
            base_ids = [t["id"] for t in baseline["tokens"]]
            diff = first_difference(spec_ids, base_ids)
            note = ""
            if "cancelled" in (spec_answer.get("finish_reason"), baseline.get("finish_reason")):
                note = " (one of the two answers was stopped early)"
            yield (compare_html(spec_answer.get("stats"), baseline.get("stats"),
                                PROPOSER_LABELS.get(spec_answer.get("proposer"), spec_answer.get("proposer")),
                                greedy=sampling.greedy, identical=diff is None, first_difference=diff),
                   status_html(f"Baseline done: {len(base_ids)} tokens{note}."))

    # ---- model pairs -----------------------------------------------------------------------------------------
    def switch(self, name, request: gr.Request = None):
        """Outputs: status, model dropdown, proposer, K."""
        manager = self.manager
        if name == manager.name and manager.session is not None:
            yield status_html(f"{name} is already loaded."), gr.skip(), gr.skip(), gr.skip()
            return
        progress: "queue.Queue[Optional[str]]" = queue.Queue()
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

        threading.Thread(target=work, daemon=True, name="localspec-load").start()
        yield status_html(f"Loading {name}…"), gr.skip(), gr.skip(), gr.skip()
        while True:
            message = progress.get()
            if message is None:
                break
            yield status_html(message), gr.skip(), gr.skip(), gr.skip()
        if "seconds" in result:
            notices = manager.session.notices
            yield (status_html(" ".join((f"Loaded {name} in {result['seconds']:.1f} s.", *notices)),
                               "error" if notices else "info"), name,
                   *self.proposer_updates())
            return
        reason = result.get("busy") or result.get("error")
        kept = f" Still using {manager.name}." if manager.name else ""
        yield (status_html(f"Could not switch: {reason}.{kept}" if "error" in result else f"{reason}.{kept}",
                           "error"), manager.name, gr.skip(), gr.skip())

    def proposer_updates(self):
        session = self.manager.session
        if session is None:
            return gr.update(choices=[("off", "none")], value="none"), gr.update()
        spec = session.default_spec()
        return gr.update(choices=proposer_choices(tuple(session.proposers)), value=spec.proposer), gr.update(value=spec.k)

    def on_load(self):
        """Page (re)load: show the pair in use. Outputs: model dropdown, proposer, K, status."""
        manager = self.manager
        if manager.session is None and manager.load_error:  # a failed switch leaves the old pair: not shown here
            status = status_html(f"Model load failed: {manager.load_error}", "error")
        else:
            ready = manager.ready_text()
            alert = bool(self.notice or (manager.session is not None and manager.session.notices))
            status = status_html(f"{ready} {self.notice}" if self.notice else ready, "error" if alert else "info")
        return (manager.name, *self.proposer_updates(), status)
