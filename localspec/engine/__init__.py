"""The speculative decoding engine: the loop (loop.py), the step policy (policy.py) and its plans (plan.py), the one
step function (step.py), events, metrics and the adaptive controllers. Sits on runtime/ (sampling, trees, model
runner), proposers/ and verify/; knows only token ids and never imports the UI."""

from .events import EngineEvent, PrefillProgress, StepEvent, TokenEvent, steps
from .loop import Engine
from .metrics import StatsSnapshot

__all__ = ["Engine", "EngineEvent", "PrefillProgress", "StatsSnapshot", "StepEvent", "TokenEvent", "steps"]
