"""torch.compile of the target's verify forward, off by default (LOCALSPEC_COMPILE=off | default | reduce-overhead).

Only verify-sized forwards (at most the largest bucket of rows, on top of a filled cache) go through the compiled
backbone; a prompt's prefill stays eager. Row counts are padded up to a bucket (1, 2, 4, 8, 16): the padding rows
come after the real ones, so causal attention keeps the real rows' outputs as they are, and their cache positions
are cropped right after. K changing from step to step therefore reuses the few graphs already built.

"default" is inductor (the CPU choice; measured in scripts/compile_check.py). "reduce-overhead" records CUDA graphs
and so needs fixed shapes and addresses: the runner then uses transformers' StaticCache (the whole capacity is
attended to, masked) instead of the preallocated cache that attends to the filled prefix only.
"""

from __future__ import annotations

import torch

from localspec.config import COMPILE_MODES, CompileMode  # noqa: F401  (read from the environment in config.py)

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16)


def bucket(rows: int) -> int | None:
    """The padded row count for a verify forward of `rows` tokens; None above the largest bucket (eager)."""
    return next((b for b in BUCKETS if rows <= b), None)


def compile_backbone(backbone: torch.nn.Module, mode: CompileMode):
    """The compiled backbone (dynamic in the cache length, so only the row bucket picks a graph)."""
    if mode == "reduce-overhead":
        return torch.compile(backbone, mode="reduce-overhead", dynamic=False)
    return torch.compile(backbone, dynamic=True)
