"""The "Models on this machine" panel: what discovery found (LM Studio, Ollama, llama.cpp, the Hugging Face cache),
a Rescan that reads those places and both models.yaml files again, and one click to add a found pair to the user's
models.yaml in the data folder (the shipped one is never edited)."""

from __future__ import annotations

import html

import gradio as gr

from localspec.config import ConfigError
from localspec.models.discovery import human_size
from localspec.models.untrusted import shown
from localspec.models.user_models import CatalogRead, add_user_pair, user_pair_names

from .manager import ModelManager

NOT_SCANNED = "Not scanned: the app was started with --no-scan."


def found_html(read: CatalogRead | None) -> str:
    """The found models as a table (name, where, architecture, quantization, size), and what was skipped."""
    if read is None or read.found is None:
        return f'<div class="ls-found">{NOT_SCANNED}</div>'
    found = read.found
    if not found.models:
        searched = ", ".join(html.escape(shown(r.path)) for r in found.roots)
        return f'<div class="ls-found">No models found. Searched: {searched}.</div>'
    rows = []
    for m in found.models:
        why = "" if m.loadable is None else f'<div class="ls-found-why">cannot load: {html.escape(m.loadable)}</div>'
        rows.append(
            f'<tr><td title="{html.escape(shown(m.path))}">{html.escape(m.name)}{why}</td><td>{html.escape(m.layout)}'
            f"</td><td>{html.escape(m.architecture)}</td><td>{html.escape(m.quantization)}</td>"
            f"<td>{human_size(m.size_bytes)}</td></tr>"
        )
    skipped = (
        f'<div class="ls-found-why">{len(found.skipped)} place(s) could not be read; '
        "<code>localspec models</code> says which and why.</div>"
        if found.skipped
        else ""
    )
    return (
        '<table class="ls-found"><thead><tr><th scope="col">model</th><th scope="col">from</th>'
        '<th scope="col">architecture</th><th scope="col">quantization</th><th scope="col">size</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>{skipped}"
    )


def addable(manager: ModelManager) -> list[str]:
    """Names of the proposed pairs the user's models.yaml does not hold yet (a found pair, not a user entry)."""
    read = manager.catalog_read
    if read is None:
        return []
    added = user_pair_names()
    return [pair.name for pair in read.proposed if pair.name not in added]


def _message(text: str, kind: str = "info") -> str:
    return f'<div class="ls-found-msg ls-{kind}" role="status">{html.escape(text)}</div>'


class MachinePanel:
    """Rescan and Add; both redraw the model dropdown's choices (the loaded pair stays selected)."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def _views(self, message: str):
        names = addable(self.manager)
        return (
            found_html(self.manager.catalog_read),
            gr.update(choices=names, value=names[0] if names else None, interactive=bool(names)),
            gr.update(interactive=bool(names)),
            message,
            gr.update(choices=self.manager.choices(), value=self.manager.name),
        )

    def rescan(self):
        """Outputs: found table, addable pairs, Add button, message, model dropdown."""
        try:
            read = self.manager.rescan()
        except ConfigError as exc:
            return self._views(_message(f"Rescan failed: {exc}", "error"))
        count = len(read.found.models) if read.found is not None else 0
        return self._views(_message(f"Rescanned: {count} model(s) found, {len(self.manager.pairs)} pair(s) offered."))

    def add(self, name: str | None):
        read = self.manager.catalog_read
        pair = next((p for p in read.proposed if p.name == name), None) if read is not None else None
        if pair is None:
            return self._views(_message(f"No found pair named {name!r}; press Rescan.", "error"))
        try:
            path = add_user_pair(pair)
            self.manager.rescan()
        except (ConfigError, OSError) as exc:
            return self._views(_message(f"Could not add {pair.name}: {exc}", "error"))
        return self._views(_message(f"Added {pair.name} to {path}."))


def machine_panel(manager: ModelManager, model: gr.Dropdown) -> None:
    """The accordion, wired: Rescan and Add update the found table, the addable pairs and the model dropdown. A
    window with no catalog (the echo demo, tests) has nothing to rescan and shows no panel."""
    if manager.catalog is None:
        return
    panel = MachinePanel(manager)
    names = addable(manager)
    with gr.Accordion("Models on this machine", open=False, elem_id="ls-machine"):
        table = gr.HTML(found_html(manager.catalog_read), js_on_load=None, elem_id="ls-found")
        rescan = gr.Button("Rescan", size="sm", elem_id="ls-rescan")
        choice = gr.Dropdown(
            names,
            value=names[0] if names else None,
            label="Found pair",
            interactive=bool(names),
            elem_id="ls-found-pair",
        )
        add = gr.Button(
            "Add to my models.yaml", size="sm", interactive=bool(names), elem_id="ls-add-pair", variant="secondary"
        )
        message = gr.HTML("", js_on_load=None, elem_id="ls-found-msg")
    outputs = [table, choice, add, message, model]
    rescan.click(panel.rescan, None, outputs, api_name="rescan", show_progress="hidden")
    add.click(panel.add, [choice], outputs, api_name="add_found_pair", show_progress="hidden")
