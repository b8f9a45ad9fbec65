"""Number controls whose values reach the handlers exactly as sent (browser or API), so that one validation
(settings.read_sampling → SamplingParams / SpecConfig.validate in config.py) checks every range and type and
answers in the app's own words: no silent rounding, no Gradio bounds message, no raw preprocessing error."""

from __future__ import annotations

from typing import Any

import gradio as gr

class CheckedSlider(gr.Slider):
    is_template = True  # the browser shows a plain Slider

    def preprocess(self, payload: Any) -> Any:
        return payload
    from collections.abc import Callable, Sequence
    from typing import TYPE_CHECKING, Any, Literal

    from gradio.blocks import Block

    if TYPE_CHECKING:
        from gradio.components import Timer
        from gradio.components.base import Component

class CheckedNumber(gr.Number):
    is_template = True  # the browser shows a plain Number

    def preprocess(self, payload: Any) -> Any:
        return payload
    from collections.abc import Callable, Sequence
    from typing import TYPE_CHECKING, Any, Literal

    from gradio.blocks import Block

    if TYPE_CHECKING:
        from gradio.components import Timer
        from gradio.components.base import Component
