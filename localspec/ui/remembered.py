"""The window's settings kept in the browser (localStorage, through gr.BrowserState), so a reload, a new tab or a
restart of the app keeps them: the sampling controls, the stop strings, max new tokens, the colouring and "keep
speculating". The proposer, K and tree nodes belong to the model pair and come from it.

What the browser hands back is checked as the controls' own values are (settings.py): a group that does not pass is
left at the controls' defaults, so a stale or edited entry costs nothing but itself.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from localspec.config import ConfigError

from .settings import read_sampling, read_stops, sampling_dict

STORAGE_KEY = "localspec-settings"
# BrowserState encrypts what it keeps with its secret, a random one per launch unless given: a fixed one lets the
# settings outlive a restart of the app. They are sampling settings, nothing private.
SECRET = "localspec-window-settings"
# the sampling controls under sampling_dict's names (checked together, kept together), then the rest
SAMPLING = ("temperature", "top_p", "top_k", "max_new_tokens", "seed", "repetition_penalty")
NAMES = (*SAMPLING, "stop_strings", "colour", "keep")


def remember(*values: Any) -> dict:
    """The controls' values (in NAMES' order) as the browser keeps them."""
    return dict(zip(NAMES, values))


def restorable(saved: Any) -> dict:
    """The valid part of what the browser kept: name → value."""
    if not isinstance(saved, dict):
        return {}
    found: dict[str, Any] = {}
    try:
        found.update(sampling_dict(read_sampling(**{name: saved.get(name) for name in SAMPLING})))
    except ConfigError:
        pass
    stops = saved.get("stop_strings")
    if isinstance(stops, str):
        try:
            read_stops(stops)
            found["stop_strings"] = stops
        except ConfigError:
            pass
    found.update({name: saved[name] for name in ("colour", "keep") if isinstance(saved.get(name), bool)})
    return found


def restore(saved: Any) -> tuple:
    """One update per control in NAMES: the kept value where it is valid, else the control as it is."""
    found = restorable(saved)
    return tuple(gr.update(value=found[name]) if name in found else gr.skip() for name in NAMES)


def wire(demo: gr.Blocks, controls: dict[str, gr.components.Component]) -> None:
    """Every change of a control in NAMES is kept in the browser; a page load puts the kept values back."""
    kept = gr.BrowserState({}, storage_key=STORAGE_KEY, secret=SECRET)
    ordered = [controls[name] for name in NAMES]
    for control in ordered:
        control.change(remember, ordered, [kept], api_name=False, queue=False, show_progress="hidden")
    demo.load(restore, [kept], ordered, api_name=False, show_progress="hidden")
