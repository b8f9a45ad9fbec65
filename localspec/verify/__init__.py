"""Verification: pick the rejection sampler implementation for a device."""

from __future__ import annotations

from collections.abc import Callable

import torch

from localspec.config import ConfigError

from .reference import rejection_sample
from .types import SamplerDraws, VerifyOutput, make_draws

Verifier = Callable[..., VerifyOutput]
# device → why 'auto' uses the torch sampler there (the Triton warm-up failed; see warmup.py)
AUTO_FALLBACK: dict[str, str] = {}

__all__ = ["SamplerDraws", "VerifyOutput", "make_draws", "rejection_sample", "get_verifier", "triton_available"]


def triton_available() -> bool:
    try:
        from localspec.verify import triton_fused  # noqa: F401
    except Exception:  # triton missing or broken: the torch reference is always there
        return False
    return True


def get_verifier(name: str, device: torch.device | str) -> tuple[str, Verifier]:
    """Return (resolved name, function). 'auto' = Triton on CUDA when it imports, the torch reference otherwise."""
    device = torch.device(device)
    if name == "torch":
        return "torch", rejection_sample
    if name in ("auto", "triton"):
        wants_triton = name == "triton" or (device.type == "cuda" and str(device) not in AUTO_FALLBACK)
        if wants_triton and triton_available():
            from .triton_fused import fused_rejection_sample

            return "triton", fused_rejection_sample
        if name == "triton":
            raise ConfigError("sampler 'triton' asked for, but the fused Triton kernel is not available here")
        return "torch", rejection_sample
    raise ConfigError(f"unknown sampler {name!r}; choose auto, torch or triton")
