"""Inputs and outputs of the verification (rejection sampling) step, shared by every implementation."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplerDraws:
    """Random draws made by the engine from its seeded generator, outside any kernel.

    Giving the same draws to the torch reference and the fused kernel must give the same tokens.
    """

    uniforms: torch.Tensor  # [B, K] float32 in [0, 1): acceptance test of draft position i
    noise: torch.Tensor  # [B, K+1, V] float32 ~ Exp(1): sampling of the resampled / bonus token


@dataclass(frozen=True)
class VerifyOutput:
    """What the verifier decided for one step. Emitted tokens = the accepted prefix plus one."""

    output_token_ids: torch.Tensor  # [B, K+1] int64, emitted tokens, padded with -1 after the last
    num_accepted: torch.Tensor  # [B] int64, draft tokens accepted (emitted count = num_accepted + 1)
    target_probs_of_drafts: torch.Tensor  # [B, K] float32, p_target(draft token i) at position i
    draft_probs_of_drafts: torch.Tensor  # [B, K] float32, p_draft(draft token i); 1.0 for n-gram drafts
    target_prob_of_last: torch.Tensor  # [B] float32, p_target of the resampled / bonus token


def make_draws(
    generator: torch.Generator, batch: int, k: int, vocab: int, device: torch.device | str
) -> SamplerDraws:
    """Draw uniforms [B, K] and exponential noise [B, K+1, V] from the engine's generator."""
    uniforms = torch.rand((batch, k), generator=generator, device=device, dtype=torch.float32)
    noise = torch.empty((batch, k + 1, vocab), device=device, dtype=torch.float32)
    noise.exponential_(generator=generator)
    return SamplerDraws(uniforms=uniforms, noise=noise)
