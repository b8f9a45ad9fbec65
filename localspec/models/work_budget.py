"""A time and size budget for work that a model file or a user supplies (a chat template, a tokenization, a
truncation), spent in the caller's own thread and stopped there: past its deadline, when its cancel flag is set, or
when a template's output grows past a bound.

A chat template is Jinja compiled to Python. While one renders, a trace function (sys.settrace: this thread only, and
only for the call) sees every line Python runs and every value a frame returns or yields, and raises in the running
frame once the budget is spent, so a template's loop of 100,000 × 100,000 ends at the deadline with a message naming
it. Native work (a tokenizer's encode) cannot be interrupted: its input's size bounds it, and the budget is checked
before and after each such call. A single built-in operation on huge values (`'a' * 10**10`, `9 ** 9 ** 9`) is one
native call too and is not bounded here.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Optional, TypeVar

from localspec.config import ConfigError

T = TypeVar("T")
TEMPLATE_FILE = "<template>"  # the file name Jinja gives the code it compiles from a string
MAX_TEMPLATE_CHARS = 64_000_000  # what one rendering may produce (a 4 MB request renders to a few MB)


class BudgetSpent(ConfigError):
    """The work ran out of its budget and was stopped; nothing else was affected."""

    def __init__(self, message: str, reason: Literal["time", "cancelled", "size"]) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class WorkBudget:
    """`what` names the work in messages ("building the prompt"); `limit_s` is its whole time."""

    what: str
    limit_s: float
    cancel: Optional[threading.Event] = None
    max_chars: int = MAX_TEMPLATE_CHARS
    deadline: float = field(init=False)
    _yielded: int = field(init=False, default=0)  # characters the template's generators produced so far

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.limit_s

    def check(self, part: str = "") -> None:
        """Raise BudgetSpent when cancelled or past the deadline; `part` names what was running (else `what`)."""
        if self.cancel is not None and self.cancel.is_set():
            raise BudgetSpent(f"{self.what} was stopped", "cancelled")
        if time.monotonic() > self.deadline:
            raise BudgetSpent(f"{part or self.what} took longer than {self.limit_s:g} s and was stopped", "time")

    def run(self, work: Callable[..., T], *args, part: str = "", **kwargs) -> T:
        """work(*args, **kwargs) under the budget, traced; `part` names it in a message (e.g. a model's template)."""
        self.check(part)
        previous = sys.gettrace()
        tracer = _Tracer(self, part)
        sys.settrace(tracer.on_call)
        try:
            return work(*args, **kwargs)
        finally:
            sys.settrace(previous)


class _Tracer:
    """sys.settrace's functions for one run: 'call' and 'line' look at the budget, 'return' at the output's size."""

    def __init__(self, budget: WorkBudget, part: str) -> None:
        self.budget, self.part = budget, part

    def on_call(self, frame, event: str, arg):
        self.budget.check(self.part)
        return self.on_event

    def on_event(self, frame, event: str, arg):
        if event == "line":
            self.budget.check(self.part)
        elif event == "return" and type(arg) is str:
            budget = self.budget
            grown = len(arg) > budget.max_chars
            if frame.f_code.co_filename == TEMPLATE_FILE:  # a template's generator yields its output piece by piece
                budget._yielded += len(arg)
                grown = grown or budget._yielded > budget.max_chars
            if grown:
                what = self.part or budget.what
                raise BudgetSpent(f"{what} produced more than {budget.max_chars:,} characters and was stopped", "size")
        return self.on_event
