"""Controls whose values reach the handlers exactly as sent (browser or API), so that one validation
(settings.read_sampling / read_k / read_proposer → SamplingParams / SpecConfig.validate in config.py) checks every
range, type and choice and answers in the app's own words: no silent rounding, no Gradio bounds message, no raw
preprocessing error (an API client may send a proposer the pair it is now talking to does not have)."""

from __future__ import annotations

from typing import Any

import gradio as gr


class CheckedSlider(gr.Slider):
    is_template = True  # the browser shows a plain Slider

    def preprocess(self, payload: Any) -> Any:
        return payload


class CheckedNumber(gr.Number):
    is_template = True  # the browser shows a plain Number

    def preprocess(self, payload: Any) -> Any:
        return payload


class CheckedRadio(gr.Radio):
    is_template = True  # the browser shows a plain Radio

    def preprocess(self, payload: Any) -> Any:
        return payload
