"""Regenerate the last answer, and edit and resend the last message.

Regenerate drops the last answer and answers the same user message again with the controls' current settings; the
saved conversation keeps one answer to it. Edit takes the last exchange out of the conversation (it stays in view,
marked, with what to do) and puts its message back in the box; the next Send replaces that exchange (in the window
and in the saved conversation), and Cancel edit puts it back. The edit in progress lives in a gr.State: None, or
{"turns": [the user turn, its answer], "at": how many turns stayed}.
"""

from __future__ import annotations

from typing import Optional

import gradio as gr

from localspec.config import ConfigError

from .handlers import Handlers, history_of, owner_of
from .manager import Busy
from .render import stats_html, status_html, transcript_html
from .settings import read_sampling, read_speculation, read_stops, sampling_dict
from .system_prompt import system_text
from .turns import AssistantTurn, turns_from_state

STREAMING = "an answer is still streaming in this window; press Stop or wait for it"
NOTHING_TO_REDO = "Send a message first: there is no answer to regenerate or message to edit."
SAMPLED_TEMPERATURE = 0.7  # what "Regenerate sampled" answers with when the temperature control is at 0
GREEDY_NOTE = (
    "At temperature 0 (greedy) regenerating gives the same answer; “Regenerate sampled” answers again at "
    f"temperature {SAMPLED_TEMPERATURE}."
)
EDITING = "Editing your last message: change it and press Send to replace it and its answer, or Cancel edit."


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


class Actions:
    def __init__(self, handlers: Handlers) -> None:
        self.handlers = handlers
        self.manager = handlers.manager
        self.recorder = handlers.recorder

    def _editing(self, editing, turns: list[dict], owner: str) -> bool:
        """An edit is in progress in this window (not ended by Clear or by opening another conversation)."""
        if not editing or len(turns) != editing["at"]:
            return False
        return self.recorder is None or self.recorder.is_editing(owner)

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
        request: gr.Request = None,
    ):
        """Outputs: transcript, stats, status, events, state. The answer is given the system prompt in the box now."""
        owner = owner_of(request)
        turns = list(turns or [])
        at = last_exchange(turns)
        try:
            if self._editing(editing, turns, owner):
                raise ConfigError("finish the edit first: press Send, or Cancel edit")
            if self.manager.is_answering(owner):
                raise Busy(STREAMING)
            if at is None:
                raise ConfigError(NOTHING_TO_REDO)
            sampling = read_sampling(temperature, top_p, top_k, max_new_tokens, seed, repetition_penalty)
            stops = read_stops(stop_strings)
            choice = read_speculation(proposer, k, tree_nodes, keep_speculating)
        except ConfigError as exc:
            yield gr.skip(), gr.skip(), status_html(str(exc), "error"), gr.skip(), turns
            return
        old = turns[-1]
        user_text = turns[at]["content"]
        system = system_text(system_prompt)
        settings = sampling_dict(sampling, stops)
        answer = AssistantTurn(streaming=True, proposer=proposer, k=choice.k, sampling=settings, system=system)
        kept = turns[:-1]
        turns = kept + [answer.to_state()]
        note = GREEDY_NOTE if sampling.greedy else ""
        shown = f"Regenerating… {note}".strip()
        yield transcript_html(turns, colour), stats_html(None), status_html(shown), gr.skip(), turns
        sink = None
        if self.recorder is not None:
            sink = self.recorder.sink(owner, user_text, settings, replaces="answer", system=system)
        history = history_of(turns_from_state(kept), system)
        replaced = tuple(int(r["id"]) for r in old.get("tokens", []) if "id" in r)  # the history's first source
        for _, status in self.handlers._run(owner, history, sampling, choice, answer, sink, replaced, stops):
            if answer.finish_reason == "error" and not answer.tokens:
                turns = kept + [old]  # nothing was said: the previous answer stays
                yield (
                    transcript_html(turns, colour),
                    gr.skip(),
                    status_html(f"{answer.error} (the previous answer is kept)", "error"),
                    gr.skip(),
                    turns,
                )
                return
            turns = kept + [answer.to_state()]
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
        request: gr.Request = None,
    ):
        """Regenerate with a temperature above 0: the control's, or SAMPLED_TEMPERATURE where it is at 0."""
        sampled = temperature if isinstance(temperature, (int, float)) and temperature > 0 else SAMPLED_TEMPERATURE
        settings = (proposer, k, sampled, top_p, top_k, max_new_tokens, seed, colour, tree_nodes, keep_speculating)
        last = (system_prompt, repetition_penalty, stop_strings)
        yield from self.regenerate(turns, editing, *settings, *last, request=request)

    # ---- edit and resend -------------------------------------------------------------------------------------
    def edit(self, turns, editing, colour, request: gr.Request = None):
        """Outputs: transcript, status, message box, state, edit state, Cancel edit button."""
        owner = owner_of(request)
        turns = list(turns or [])
        at = last_exchange(turns)
        problem = (
            "already editing: press Send or Cancel edit"
            if self._editing(editing, turns, owner)
            else STREAMING
            if self.manager.is_answering(owner)
            else NOTHING_TO_REDO
            if at is None
            else None
        )
        if problem:
            return gr.skip(), status_html(problem, "error"), gr.skip(), turns, editing, gr.skip()
        if self.recorder is not None:
            self.recorder.begin_edit(owner)
        kept, taken = turns[:at], turns[at:]
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
        if self.recorder is not None:
            self.recorder.end_edit(owner)
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
        if self.recorder is not None:
            self.recorder.end_edit(owner_of(request))
        return None, gr.update(visible=False)

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
