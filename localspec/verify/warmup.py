"""Warm the sampler 'auto' picks up at load time: compile (K = 0 and K = k, greedy and stochastic) and check it
against the torch reference, so a Triton compile or launch failure falls back to torch with a notice instead of
failing every answer."""

from __future__ import annotations

from typing import Optional

import torch

from . import AUTO_FALLBACK, get_verifier
from .checks import compare_outputs, make_verify_case
from .reference import rejection_sample

WARM_VOCAB = 4096


def warm_up_sampler(device: torch.device | str, k: int) -> Optional[str]:
    """Run 'auto''s sampler on `device` once per shape class; None when it works, else the notice (and 'auto' uses
    the torch sampler on that device from then on)."""
    device = torch.device(device)
    name, verify = get_verifier("auto", device)
    if name == "torch":
        return None
    try:
        for kk in sorted({0, k}):
            for temperature in (0.0, 1.0):
                case = make_verify_case(
                    kk + 1, 1, kk, WARM_VOCAB, temperature=temperature, with_draft_probs=kk > 0, device=device
                )
                problems = compare_outputs(case.run(verify), case.run(rejection_sample))
                if problems:
                    raise RuntimeError(f"disagrees with the torch reference at K={kk}: {problems[0]}")
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        AUTO_FALLBACK[str(device)] = reason
        return f"the fused Triton sampler failed its warm-up on {device} ({reason}); using the torch sampler"
    return None
