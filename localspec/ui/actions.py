"""Regenerate an answer, edit and resend a message, and switch between their versions.

Regenerate answers a user message again with the controls' current settings; Edit takes a user message and what
follows it out of the conversation (it stays in view, marked, with what to do) and puts the message back in the box;
the next Send answers the edited message (Cancel edit puts it all back). Either way the new turn is a new version of
the one it replaces, which is kept with what followed it (versions.py; the store keeps the same tree) and comes back
with ‹ ›. The model is given only the shown path before the new turn. The edit in progress lives in a gr.State and in
Handlers.edits (send reads it there): None, or {"turns": the turns taken out, "at": how many turns stayed}.
"""

from __future__ import annotations

import math
from typing import Optional

import gradio as gr

from localspec.config import ConfigError

from .handlers import Handlers, answer_stats_html, events_json, history_of, owner_of
from .manager import Busy
from .render import stats_html, status_html, transcript_html
from .settings import read_sampling, read_speculation, read_stops, sampling_dict
from .system_prompt import system_text
from .turns import AssistantTurn, turns_from_state
from .versions import branch, switch

STREAMING = "an answer is still streaming in this window; press Stop or wait for it"
NOTHING_TO_REDO = "Send a message first: there is no answer to regenerate or message to edit."
SAMPLED_TEMPERATURE = 0.7  # what "Regenerate sampled" answers with when the temperature control is at 0
GREEDY_NOTE = (
    "At temperature 0 (greedy) regenerating gives the same answer; “Regenerate sampled” answers again at "
    f"temperature {SAMPLED_TEMPERATURE}."
)
EDITING = (
    "Editing your message: change it and press Send to replace it and its answer with a new version (the old one "
    "stays, under ‹ ›), or Cancel edit."
)
FOCUS_MESSAGE = "() => { document.querySelector('#ls-message textarea')?.focus(); }"  # after New chat or Edit
NO_SUCH_MESSAGE = "There is no such message to edit or answer to regenerate in the window; nothing was changed."


def last_exchange(turns: list[dict]) -> Optional[int]:
    """Index of the last user turn when it is followed by its finished answer (the last turn), else None."""
    if (
        len(turns) >= 2
        and turns[-1]["role"] == "assistant"
        and turns[-2]["role"] == "user"
        and "pending" not in turns[-1]
    ):
        return len(turns) - 2
    return None


def _index(value) -> Optional[int]:
    """A turn index from a control or the API (None, a negative number or not a whole number: none given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value == int(value) and value >= 0 else None


def user_turn_at(turns: list[dict], index) -> Optional[int]:
    """The user turn to edit: `index` where it is one (None: the last exchange's); None when there is none."""
    at = _index(index)
    if at is None:
        return last_exchange(turns)
    return at if at < len(turns) and turns[at]["role"] == "user" else None


def answer_at(turns: list[dict], index) -> Optional[int]:
    """The answer to regenerate: `index` (None: the last turn) where it is a finished answer to a user message."""
    at = _index(index)
    at = len(turns) - 1 if at is None else at
    if 1 <= at < len(turns) and turns[at]["role"] == "assistant" and turns[at - 1]["role"] == "user":
        return at
    return None


class Actions:
    def __init__(self, handlers: Handlers) -> None:
        self.handlers = handlers
        self.manager = handlers.manager
        self.recorder = handlers.recorder

    def _editing(self, editing, turns: list[dict], owner: str) -> bool:
        """An edit is in progress in this window (not ended by Clear or by opening another conversation)."""
        return bool(editing) and self.handlers.edit_in_progress(owner, turns) is not None

    # ---- regenerate ------------------------------------------------------------------------------------------
    def regenerate(
        self,
        turns,
        editing,
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
        index=None,
        request: gr.Request = None,
    ):
        """Outputs: transcript, stats, status, events, state. index: the answer to regenerate (None: the last one);
        the new answer is a new version of it, given the system prompt in the box now and the turns before it."""
        owner = owner_of(request)
        turns = list(turns or [])
        at = answer_at(turns, index)
        try:
            if self._editing(editing, turns, owner):
                raise ConfigError("finish the edit first: press Send, or Cancel edit")
            if self.manager.is_answering(owner) or any(t.get("pending") for t in turns):
                raise Busy(STREAMING)
            if at is None:
                raise ConfigError(NOTHING_TO_REDO if _index(index) is None else NO_SUCH_MESSAGE)
            sampling = read_sampling(temperature, top_p, top_k, max_new_tokens, seed, repetition_penalty)
            stops = read_stops(stop_strings)
            choice = read_speculation(proposer, k, tree_nodes, keep_speculating)
        except ConfigError as exc:
            yield gr.skip(), gr.skip(), status_html(str(exc), "error"), gr.skip(), turns
            return
        before, old = turns, turns[at]
        user_text = turns[at - 1]["content"]
        system = system_text(system_prompt)
        settings = sampling_dict(sampling, stops)
        answer = AssistantTurn(streaming=True, proposer=proposer, k=choice.k, sampling=settings, system=system)
        kept = turns[:at]
        turns = branch(before, at, [answer.to_state()])
        note = GREEDY_NOTE if sampling.greedy else ""
        shown = f"Regenerating… {note}".strip()
        yield transcript_html(turns, colour), stats_html(None), status_html(shown), gr.skip(), turns
        sink = None
        if self.recorder is not None:
            sink = self.recorder.sink(owner, user_text, settings, system=system, at=at, regenerate=True)
        history = history_of(turns_from_state(kept), system)
        replaced = tuple(int(r["id"]) for r in old.get("tokens", []) if "id" in r)  # the history's first source
        for _, status in self.handlers._run(owner, history, sampling, choice, answer, sink, replaced, stops):
            if answer.finish_reason == "error" and not answer.tokens:
                turns = before  # nothing was said: the previous answer stays
                yield (
                    transcript_html(turns, colour),
                    gr.skip(),
                    status_html(f"{answer.error} (the previous answer is kept)", "error"),
                    gr.skip(),
                    turns,
                )
                return
            turns = branch(before, at, [answer.to_state()])
            yield (*self.handlers.answer_views(answer, turns, colour, status, note), turns)

    def regenerate_sampled(
        self,
        turns,
        editing,
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
        index=None,
        request: gr.Request = None,
    ):
        """Regenerate with a temperature above 0: the control's, or SAMPLED_TEMPERATURE where it is at 0."""
        sampled = temperature if isinstance(temperature, (int, float)) and temperature > 0 else SAMPLED_TEMPERATURE
        settings = (proposer, k, sampled, top_p, top_k, max_new_tokens, seed, colour, tree_nodes, keep_speculating)
        last = (system_prompt, repetition_penalty, stop_strings, index)
        yield from self.regenerate(turns, editing, *settings, *last, request=request)

    # ---- edit and resend -------------------------------------------------------------------------------------
    def edit(self, turns, editing, colour, index=None, request: gr.Request = None):
        """Edit the user message at `index` (None: the last one). Outputs: transcript, status, message box, state, edit
        state, Cancel edit button."""
        owner = owner_of(request)
        turns = list(turns or [])
        at = user_turn_at(turns, index)
        problem = (
            "already editing: press Send or Cancel edit"
            if self._editing(editing, turns, owner)
            else STREAMING
            if self.manager.is_answering(owner) or any(t.get("pending") for t in turns)
            else (NOTHING_TO_REDO if _index(index) is None else NO_SUCH_MESSAGE)
            if at is None
            else None
        )
        if problem:
            return gr.skip(), status_html(problem, "error"), gr.skip(), turns, editing, gr.skip()
        kept, taken = turns[:at], turns[at:]
        self.handlers.edits[owner] = {"turns": taken, "at": len(kept), "kept": kept}
        return (
            transcript_html(turns, colour, editing_from=at),  # the exchange stays in view, marked as being edited
            status_html(EDITING),
            taken[0]["content"],
            kept,
            {"turns": taken, "at": len(kept)},
            gr.update(visible=True),
        )

    def cancel_edit(self, turns, editing, colour, request: gr.Request = None):
        """Put the exchange taken out by edit back. Outputs: transcript, status, message box, state, edit state,
        Cancel edit button."""
        turns = list(turns or [])
        hidden = gr.update(visible=False)
        if not editing:
            return gr.skip(), status_html("Nothing is being edited."), gr.skip(), turns, None, hidden
        owner = owner_of(request)
        active = self._editing(editing, turns, owner)  # not when Clear or another conversation ended it
        self.handlers.edits.pop(owner, None)
        if not active:
            return (
                gr.skip(),
                status_html("The edit was dropped; the window has changed since."),
                gr.skip(),
                turns,
                None,
                hidden,
            )
        turns = turns + list(editing["turns"])
        return transcript_html(turns, colour), status_html("Edit cancelled."), "", turns, None, hidden

    def after_send(self, turns, editing):
        """After Send: an edit is done once an answer followed it. Outputs: edit state, Cancel edit button."""
        turns = list(turns or [])
        if editing and len(turns) > editing["at"] and turns[-1]["role"] == "assistant":
            return None, gr.update(visible=False)
        return gr.skip(), gr.skip()

    def reset(self, request: gr.Request = None):
        """Clear: no edit any more. Outputs: edit state, Cancel edit button."""
        self.handlers.edits.pop(owner_of(request), None)
        return None, gr.update(visible=False)

    # ---- versions --------------------------------------------------------------------------------------------
    def switch_version(self, turns, editing, colour, index, step, request: gr.Request = None):
        """Show the version `step` away (−1: the one before) of the message at `index`, with the turns that followed
        it. Outputs: transcript, stats, status, events, state."""
        owner = owner_of(request)
        turns = list(turns or [])
        at, step = _index(index), step if isinstance(step, int) and not isinstance(step, bool) else 0
        problem = (
            "finish the edit first: press Send, or Cancel edit"
            if self._editing(editing, turns, owner)
            else STREAMING
            if self.manager.is_answering(owner) or any(t.get("pending") for t in turns)
            else None
        )
        shown = switch(turns, at, int(step)) if problem is None and at is not None else None
        if shown is None:
            why = problem or "That message has no other version there."
            return gr.skip(), gr.skip(), status_html(why, "error"), gr.skip(), turns
        if self.recorder is not None:
            self.recorder.switch_version(owner, at, int(step))
        last = next((t for t in reversed(turns_from_state(shown)) if isinstance(t, AssistantTurn)), None)
        return (
            transcript_html(shown, colour),
            answer_stats_html(last, last.finish_reason if last else None),
            status_html("Showing another version; Send continues from it."),
            events_json(last),
            shown,
        )

    # ---- the buttons and their wiring (called by layout.build_app) -------------------------------------------
    def buttons(self) -> dict:
        """Render the buttons where called (inside a gr.Row) and the edit state."""
        return {
            "editing": gr.State(None),
            "regenerate": gr.Button("Regenerate", size="sm", elem_id="ls-regenerate", scale=0, min_width=60),
            "sampled": gr.Button(
                "Regenerate sampled", size="sm", elem_id="ls-regenerate-sampled", scale=0, min_width=60
            ),
            "edit": gr.Button("Edit last message", size="sm", elem_id="ls-edit", scale=0, min_width=60),
            "cancel": gr.Button(
                "Cancel edit", size="sm", visible=False, elem_id="ls-cancel-edit", scale=0, min_width=60
            ),
        }

    def wire(self, redo: dict, sent, clearing: list, parts: dict, sampling_inputs: list):
        """Wire the buttons; parts holds turns, transcript, stats, status, events, colour, message; clearing: the
        triggers that empty the window (Clear, New chat). Returns the regenerate event (for what follows a new
        answer)."""
        editing, cancel, turns = redo["editing"], redo["cancel"], parts["turns"]
        sent.then(self.after_send, [turns, editing], [editing, cancel], api_name=False, show_progress="hidden")
        gr.on(clearing, self.reset, None, [editing, cancel], api_name=False, show_progress="hidden")
        edit_outputs = [parts["transcript"], parts["status"], parts["message"], turns, editing, cancel]
        redo["edit"].click(
            self.edit, [turns, editing, parts["colour"]], edit_outputs, api_name="edit_last", show_progress="hidden"
        )
        cancel.click(
            self.cancel_edit,
            [turns, editing, parts["colour"]],
            edit_outputs,
            api_name="cancel_edit",
            show_progress="hidden",
        )
        outputs = [parts["transcript"], parts["stats"], parts["status"], parts["events"], turns]
        self._wire_messages(redo, parts, sampling_inputs, edit_outputs, outputs)
        redo["sampled"].click(
            self.regenerate_sampled,
            [turns, editing, *sampling_inputs],
            outputs,
            api_name="regenerate_sampled",
            concurrency_limit=None,
            show_progress="hidden",
        )
        return redo["regenerate"].click(
            self.regenerate,
            [turns, editing, *sampling_inputs],
            outputs,
            api_name="regenerate",
            concurrency_limit=None,
            show_progress="hidden",
        )

    # ---- each message's own controls: the transcript's events (the page) and hidden inputs (the API) -----------
    def _wire_messages(self, redo: dict, parts: dict, sampling_inputs: list, edit_outputs: list, outputs: list):
        transcript, turns, editing, colour = parts["transcript"], parts["turns"], redo["editing"], parts["colour"]
        with gr.Group(visible=False):  # the message's index (and a step): set by a transcript event, or by the API
            index = gr.Number(-1, precision=0, label="index", elem_id="ls-api-index")
            step = gr.Number(1, precision=0, label="step", elem_id="ls-api-step")
            api_edit = gr.Button("edit message", elem_id="ls-api-edit")
            api_switch = gr.Button("switch version", elem_id="ls-api-switch")
            api_regenerate = gr.Button("regenerate answer", elem_id="ls-api-regenerate")
        picked = {"fn": clicked_message, "inputs": None, "outputs": [index, step], "api_name": False, "queue": False}
        edit = {"fn": self.edit, "inputs": [turns, editing, colour, index], "outputs": edit_outputs}
        switch = {"fn": self.switch_version, "inputs": [turns, editing, colour, index, step], "outputs": outputs}
        regenerate = {"fn": self.regenerate, "inputs": [turns, editing, *sampling_inputs, index], "outputs": outputs}
        regenerate["concurrency_limit"] = None
        for event, action in (
            (transcript.edit_message, edit),
            (transcript.switch_version, switch),
            (transcript.regenerate_answer, regenerate),
        ):
            event(**picked, show_progress="hidden").then(**action, api_name=False, show_progress="hidden")
        transcript.edit_message(None, None, None, js=FOCUS_MESSAGE, api_name=False, queue=False)
        api_edit.click(**edit, api_name="edit_message")
        api_switch.click(**switch, api_name="switch_version")
        api_regenerate.click(**regenerate, api_name="regenerate_answer")


def clicked_message(evt: gr.EventData):
    """The index (and step) a transcript event sent: Edit, Regenerate or ‹ › under a message (assets/transcript.js)."""
    return _event_value(evt, "index"), _event_value(evt, "step")


def _event_value(evt, name: str):
    """A number the page's script sent with a transcript event (-1 when it sent none: no index, or no step)."""
    value = (getattr(evt, "_data", None) or {}).get(name) if evt is not None else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else -1
