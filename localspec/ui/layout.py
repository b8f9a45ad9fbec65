"""The chat window: saved conversations in a left sidebar, the conversation filling the middle with the message box
pinned below it, stats and settings in a right sidebar (drawers on a phone, the conversation first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import gradio as gr

from localspec.chat import TRUNCATION_POLICY
from localspec.config import K_MAX, K_MIN, TEMPERATURE_MAX, TREE_NODES_MAX

from .actions import FOCUS_MESSAGE, Actions
from .controls import CheckedNumber, CheckedRadio, CheckedSlider
from .conversations import FOLLOW_EVENT, conversations_panel
from .handlers import Handlers
from .machine import machine_panel
from .manager import ModelManager
from .recorder import Recorder
from .remembered import wire as remember_settings
from .render import NO_COMPARE, legend_html, stats_html, status_html, transcript_html
from .settings import proposer_choices
from .system_prompt import system_prompt_box

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TITLE = "localspec"
CONNECTING = "Connecting to the model…"
PAIR_POLL_S = 2.0  # how often a tab checks whether another tab switched the pair
INTRO = "Local chat with speculative decoding: hover, tap or focus a token to see how it was made."


def stylesheet() -> str:
    path = ASSETS / "style.css"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def transcript_script() -> str:
    """The transcript's own script: the copy buttons of code blocks and answers (assets/transcript.js)."""
    path = ASSETS / "transcript.js"
    return path.read_text(encoding="utf-8") if path.exists() else None


def build_app(manager: ModelManager, store: Any = None, notice: Optional[str] = None) -> gr.Blocks:
    """Build the Blocks for a ModelManager (which holds the registry and the session factory).

    store: a ConversationStore; with it every answer is saved as it streams and the saved-conversations panel shows.
    notice: a startup message for the status line (e.g. where a damaged database was moved).
    """
    recorder = Recorder(store) if store is not None else None
    if store is not None:  # the history proposers learn from what is saved, and only from that
        from localspec.store.history import HistoryBook

        manager.attach_history(HistoryBook(store))
    handlers = Handlers(manager, recorder, notice)
    actions = Actions(handlers)
    session = manager.session
    available = tuple(session.proposers) if session is not None else ("none",)
    spec = session.default_spec() if session is not None else None

    with gr.Blocks(title=TITLE, fill_width=True, fill_height=True) as demo:
        turns = gr.State([])
        with gr.Column(elem_id="ls-chat"):
            with gr.Row(elem_id="ls-header"):
                gr.HTML(f'<div class="ls-title"><b>localspec</b> <span>{INTRO}</span></div>', js_on_load=None)
                new_chat = gr.Button("New chat", size="sm", elem_id="ls-new-chat", scale=0, min_width=80)
            transcript = gr.HTML(
                transcript_html([]),
                js_on_load=transcript_script(),
                elem_id="ls-transcript",
                padding=False,
            )
            compare_panel = gr.HTML(NO_COMPARE, js_on_load=None, elem_id="ls-compare-panel")
            # "ready" comes from the page-load event, with the controls it sets: a choice made before it would be
            # undone by it, so the page does not say ready until then
            status = gr.HTML(status_html(CONNECTING), js_on_load=None, elem_id="ls-status")
            with gr.Row(equal_height=True, elem_id="ls-compose"):
                message = gr.Textbox(
                    placeholder="Message (Enter sends, Shift+Enter for a new line)",
                    label="Message",  # its accessible name; not shown
                    show_label=False,
                    lines=1,
                    max_lines=8,
                    scale=6,
                    elem_id="ls-message",
                    autofocus=True,
                )
                send = gr.Button("Send", variant="primary", elem_id="ls-send", scale=0, min_width=72)
                stop = gr.Button("Stop", variant="secondary", elem_id="ls-stop", scale=0, min_width=64)
            with gr.Row(elem_id="ls-actions"):
                clear = gr.Button("Clear", size="sm", elem_id="ls-clear", scale=0, min_width=60)
                compare = gr.Button("Compare with baseline", size="sm", elem_id="ls-compare", scale=0, min_width=60)
                redo = actions.buttons()
        with gr.Sidebar(label="Settings and stats", position="right", open=True, width=340, elem_id="ls-settings"):
            stats = gr.HTML(stats_html(None), js_on_load=None, elem_id="ls-stats")
            model = gr.Dropdown(
                manager.choices(), value=manager.name, label="Model pair", interactive=True, elem_id="ls-model"
            )
            machine_panel(manager, model)
            system, make_default = system_prompt_box(handlers.system_prompts)
            proposer = CheckedRadio(
                proposer_choices(available),
                value=spec.proposer if spec else "none",
                label="Proposer",
                elem_id="ls-proposer",
            )
            k = CheckedSlider(
                K_MIN, K_MAX, value=spec.k if spec else 4, step=1, label="K (draft tokens per step)", elem_id="ls-k"
            )
            tree_nodes = CheckedSlider(
                0,
                TREE_NODES_MAX,
                value=spec.tree_nodes if spec else 0,
                step=1,
                label="Tree nodes (0 = chains of K)",
                info="draft a token tree of this many nodes per step, where the proposer drafts trees",
                elem_id="ls-tree-nodes",
            )
            keep = gr.Checkbox(
                False,
                label="Keep speculating anyway",
                info="adaptive K off for the next answers: draft K tokens every step even where it measured that "
                "drafting does not pay",
                elem_id="ls-keep-speculating",
            )
            max_new = CheckedNumber(256, label="Max new tokens", elem_id="ls-max-new")
            colour = gr.Checkbox(
                False,
                label="Full token colours",
                info="off: a faint underline marks each token's kind; on: every token in a coloured box",
                elem_id="ls-colour",
            )
            gr.HTML(legend_html(), js_on_load=None)
            with gr.Accordion("Sampling (temperature, top-p, top-k, seed, penalty, stop strings)", open=False):
                temperature = CheckedSlider(
                    0.0,
                    TEMPERATURE_MAX,
                    value=0.0,
                    step=0.05,
                    label="Temperature (0 = greedy)",
                    elem_id="ls-temperature",
                )
                top_p = CheckedSlider(0.05, 1.0, value=1.0, step=0.05, label="Top-p", elem_id="ls-top-p")
                with gr.Row():
                    top_k = CheckedNumber(
                        0,
                        label="Top-k",
                        info="0 = off",
                        min_width=70,
                        elem_id="ls-top-k",
                        elem_classes="ls-compact",
                    )
                    seed = CheckedNumber(0, label="Seed", min_width=70, elem_id="ls-seed", elem_classes="ls-compact")
                repetition = CheckedSlider(
                    0.8,
                    2.0,
                    value=1.0,
                    step=0.05,
                    label="Repetition penalty",
                    info="1 = off; above 1 makes the prompt's and the answer's tokens less likely (vLLM's)",
                    elem_id="ls-repetition-penalty",
                )
                stop_strings = gr.Textbox(
                    "",
                    label="Stop strings",
                    info="the answer ends where one appears (it is left out); comma- or newline-separated",
                    lines=1,
                    max_lines=4,
                    elem_id="ls-stop-strings",
                )
            with gr.Accordion("Events of the last answer (JSON)", open=False):
                events = gr.JSON(None, elem_id="ls-events")
            gr.HTML(f'<div class="ls-policy">Long conversations: {TRUNCATION_POLICY}</div>', js_on_load=None)
        parts = {
            "turns": turns,
            "transcript": transcript,
            "stats": stats,
            "status": status,
            "events": events,
            "colour": colour,
            "compare_panel": compare_panel,
            "system": system,
            "system_prompts": handlers.system_prompts,
        }
        if store is not None:
            with gr.Sidebar(label="Conversations", position="left", open=True, width=300, elem_id="ls-sidebar"):
                conversations_panel(store, recorder, manager, parts)

        # tree_nodes and what follows last: a gradio_client caller written for the inputs before them may leave them
        # out (a raw HTTP call sends every input)
        sampling_inputs = [
            *(proposer, k, temperature, top_p, top_k, max_new, seed, colour, tree_nodes, keep, system),
            *(repetition, stop_strings),
        ]
        send_outputs = [transcript, stats, status, events, message, turns]
        sent = gr.on(
            [send.click, message.submit],
            handlers.send,
            [message, turns, *sampling_inputs],
            send_outputs,
            api_name="send",
            concurrency_limit=None,
            show_progress="hidden",
        )
        clearing = [clear.click, new_chat.click]  # both empty the window: the next message starts a new chat
        redone = actions.wire(redo, sent, clearing, dict(parts, message=message), sampling_inputs)
        if "refresh_list" in parts:  # a new or longer conversation moves to the top of the saved list
            refresh_list, chooser, search = parts["refresh_list"]
            sent.then(refresh_list, [search], [chooser], api_name=False, show_progress="hidden")
            redone.then(refresh_list, [search], [chooser], api_name=False, show_progress="hidden")
            demo.load(refresh_list, [search], [chooser], api_name=False, show_progress="hidden")
            follow, follow_outputs = parts["follow"]
            demo.load(follow, [colour], follow_outputs, **FOLLOW_EVENT)
        # the compare panel belongs to the answer it compared: a new answer, a regenerated one, Edit, Clear and
        # opening another conversation take it away (Clear and open say so in their own outputs)
        for trigger in (
            send.click,
            message.submit,
            redo["regenerate"].click,
            redo["sampled"].click,
            redo["edit"].click,
            transcript.edit_message,
            transcript.switch_version,
            transcript.regenerate_answer,
        ):
            trigger(lambda: NO_COMPARE, None, [compare_panel], api_name=False, queue=False, show_progress="hidden")
        stop.click(handlers.stop_button, None, [status], api_name=False, queue=False, show_progress="hidden")
        with gr.Group(visible=False):  # the API's stop, never shown: it answers with what it did
            api_stop = gr.Button("stop", elem_id="ls-api-stop")
        api_stop.click(
            handlers.stop, None, [status], api_name="stop", concurrency_limit=None, queue=False, show_progress="hidden"
        )
        cleared = gr.on(
            clearing,
            handlers.clear,
            None,
            [transcript, stats, status, events, compare_panel, turns, system],
            api_name="clear",
            concurrency_limit=None,
            show_progress="hidden",
        )
        new_chat.click(None, None, None, js=FOCUS_MESSAGE, api_name=False, queue=False)
        if "refresh_list" in parts:  # no conversation open: no title, none chosen in the list
            gr.on(clearing, lambda: "", None, [parts["title"]], api_name=False, queue=False, show_progress="hidden")
            cleared.then(refresh_list, [search], [chooser], api_name=False, show_progress="hidden")
        make_default.click(
            handlers.system_prompts.save_default, [system], [status], api_name=False, show_progress="hidden"
        )
        demo.load(handlers.system_prompts.default, None, [system], api_name=False, show_progress="hidden")
        remembered = dict(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new, seed=seed)
        remember_settings(
            demo, remembered | dict(repetition_penalty=repetition, stop_strings=stop_strings, colour=colour, keep=keep)
        )
        compare.click(
            handlers.compare,
            [turns],
            [compare_panel, status],
            api_name="compare",
            concurrency_limit=None,
            show_progress="hidden",
        )
        colour.change(handlers.recolour, [colour, turns], [transcript], api_name=False, show_progress="hidden")
        model.input(
            handlers.switch,
            [model],
            [status, model, proposer, k, tree_nodes],
            api_name="switch_model",
            concurrency_limit=None,
            show_progress="hidden",
        )
        demo.load(
            handlers.on_load, None, [model, proposer, k, tree_nodes, status], api_name=False, show_progress="hidden"
        )
        # a switch in another tab redraws this tab's pair and proposer controls within a tick
        gr.Timer(PAIR_POLL_S).tick(
            handlers.refresh_pair,
            None,
            [model, proposer, k, tree_nodes, status],
            api_name=False,
            concurrency_limit=None,
            show_progress="hidden",
        )
    return demo


def window_script() -> Optional[str]:
    """The page's own script: names for Gradio's drawer buttons, the phone drawer closing (assets/window.js)."""
    path = ASSETS / "window.js"
    return path.read_text(encoding="utf-8") if path.exists() else None


def launch_options() -> dict:
    """Keyword arguments for Blocks.launch() that belong to the look (Gradio 6 takes css and js there). The saved
    conversations are the window's history: Gradio's run history and its footer (with the Runs link) are off; the
    API page stays at /?view=api."""
    return {"css": stylesheet(), "js": window_script(), "footer_links": [], "run_history": False}
