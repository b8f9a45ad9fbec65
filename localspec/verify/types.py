"""Inputs and outputs of the verification (rejection sampling) step, shared by every implementation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localspec.runtime.sampling import position_draw


@dataclass(frozen=True)
class SamplerDraws:
    """Random draws made by the engine outside any kernel: keyed to (seed, output position) by position_draws, so a
    position's draws do not depend on how many tokens a step drafted.

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

    def to_host(self, finite: torch.Tensor, row: int = 0) -> list[float]:
        """One row and a finiteness flag ([1], 1.0 = all finite) in one host transfer, laid out as from_host reads it:
        K+1 output ids, the accepted count, K target probs, K draft probs, the last token's target prob, the flag."""
        return torch.cat(
            [
                self.output_token_ids[row].to(torch.float64),
                self.num_accepted[row : row + 1].to(torch.float64),
                self.target_probs_of_drafts[row].to(torch.float64),
                self.draft_probs_of_drafts[row].to(torch.float64),
                self.target_prob_of_last[row : row + 1].to(torch.float64),
                finite.to(torch.float64).view(1),
            ]
        ).tolist()

    @staticmethod
    def from_host(packed: list[float], k: int) -> HostVerdict:
        """Read what to_host transferred for a step that drafted k tokens."""
        num_accepted = int(packed[k + 1])
        return HostVerdict(
            emitted=[int(t) for t in packed[: num_accepted + 1]],
            num_accepted=num_accepted,
            target_probs_of_drafts=packed[k + 2 : 2 * k + 2],
            draft_probs_of_drafts=packed[2 * k + 2 : 3 * k + 2],
            target_prob_of_last=packed[3 * k + 2],
            finite=packed[-1] == 1.0,
        )


@dataclass(frozen=True)
class HostVerdict:
    """One row of a VerifyOutput on the host, as plain Python values."""

    emitted: list[int]  # the accepted drafts plus the resampled / bonus token
    num_accepted: int
    target_probs_of_drafts: list[float]  # [K]
    draft_probs_of_drafts: list[float]  # [K]
    target_prob_of_last: float
    finite: bool  # target logits (and draft probabilities) held no NaN / inf


def make_draws(generator: torch.Generator, batch: int, k: int, vocab: int, device: torch.device | str) -> SamplerDraws:
    """Draw uniforms [B, K] and exponential noise [B, K+1, V] from the engine's generator."""
    uniforms = torch.rand((batch, k), generator=generator, device=device, dtype=torch.float32)
    noise = torch.empty((batch, k + 1, vocab), device=device, dtype=torch.float32)
    noise.exponential_(generator=generator)
    return SamplerDraws(uniforms=uniforms, noise=noise)


def position_draws(seed: int, start: int, k: int, vocab: int, device: torch.device | str) -> SamplerDraws:
    """A chain step's draws for one answer: row i (the acceptance test of draft i, the token at row i) belongs to
    output position start + i; uniforms [1, K], noise [1, K+1, V]."""
    draws = [position_draw(seed, start + i, vocab, device) for i in range(k + 1)]
    uniforms = torch.stack([u for u, _ in draws[:k]]).view(1, k) if k else torch.zeros((1, 0), device=device)
    return SamplerDraws(uniforms=uniforms, noise=torch.stack([n for _, n in draws]).unsqueeze(0))
