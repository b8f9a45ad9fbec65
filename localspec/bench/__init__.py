"""`localspec bench`: our engine's modes side by side with Hugging Face generate(), on the same loaded weights."""

from .modes import Mode, RunResult, available_modes, parse_modes
from .prompts import BenchPrompt, load_prompts
from .runner import BenchRun, run_bench

__all__ = [
    "Mode",
    "RunResult",
    "available_modes",
    "parse_modes",
    "BenchPrompt",
    "load_prompts",
    "BenchRun",
    "run_bench",
]
