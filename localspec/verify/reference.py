"""The torch rejection sampler: the CPU path and the oracle every other implementation is checked against.

Greedy: accept draft token i while it is the target's argmax at position i; the first mismatch is replaced by
that argmax; after K accepted tokens the target's argmax at position K is the bonus.

Stochastic (Leviathan et al. / Chen et al.): accept draft token d_i when u_i < p_target(d_i) / p_draft(d_i);
at the first rejection draw from norm(max(0, p_target - p_draft)); after K accepted draw the bonus from p_target at
position K. An n-gram draft has no distribution: draft_probs is None and the draft is one-hot (p_draft(d_i) = 1).
The emitted tokens then follow the target's distribution exactly.
"""

from __future__ import annotations

import torch

from localspec.config import SamplingParams
from localspec.runtime.sampling import argmax_last, logits_to_probs, sample_with_noise

from .types import SamplerDraws, VerifyOutput


def rejection_sample(
    target_logits: torch.Tensor,  # [B, K+1, V]
    draft_token_ids: torch.Tensor,  # [B, K] int64
    draft_probs: torch.Tensor | None,  # [B, K, V] float32, or None for one-hot (n-gram) drafts
    sampling: SamplingParams,
    draws: SamplerDraws | None,  # None only in greedy mode
) -> VerifyOutput:
    batch, k_plus_1, _vocab = target_logits.shape
    k = k_plus_1 - 1
    target_probs = logits_to_probs(target_logits, sampling)  # [B, K+1, V]
    positions = torch.arange(k_plus_1, device=target_logits.device)
    gather_ids = draft_token_ids.clamp(min=0).unsqueeze(-1)  # [B, K, 1]
    target_probs_of_drafts = target_probs[:, :k].gather(-1, gather_ids).squeeze(-1)  # [B, K]
    if draft_probs is None:
        draft_probs_of_drafts = torch.ones_like(target_probs_of_drafts)
    else:
        draft_probs_of_drafts = draft_probs.float().gather(-1, gather_ids).squeeze(-1)

    if sampling.greedy:
        target_argmax = argmax_last(target_logits.float())  # [B, K+1]
        accepted = draft_token_ids == target_argmax[:, :k]  # [B, K]
        fallback_tokens = target_argmax  # [B, K+1]: recovered at 0..K-1, bonus at K
    else:
        if draws is None:
            raise ValueError("stochastic verification needs random draws")
        accepted = draws.uniforms * draft_probs_of_drafts < target_probs_of_drafts  # [B, K]
        if draft_probs is None:
            one_hot = torch.zeros_like(target_probs[:, :k]).scatter_(-1, gather_ids, 1.0)
            residual = (target_probs[:, :k] - one_hot).clamp(min=0.0)
        else:
            residual = (target_probs[:, :k] - draft_probs.float()).clamp(min=0.0)  # [B, K, V]
        # A residual that is numerically all zero can only arise when p_target == p_draft, where a rejection has
        # probability 0; fall back to p_target to stay well defined.
        empty = residual.sum(-1, keepdim=True) <= 0
        residual = torch.where(empty, target_probs[:, :k], residual)
        weights = torch.cat([residual, target_probs[:, k:]], dim=1)  # [B, K+1, V]
        fallback_tokens = sample_with_noise(weights, draws.noise)  # [B, K+1]

    num_accepted = torch.cumprod(accepted.long(), dim=-1).sum(-1)  # [B]
    padded_drafts = torch.cat([draft_token_ids, draft_token_ids.new_full((batch, 1), -1)], dim=1)  # [B, K+1]
    last_token = fallback_tokens.gather(1, num_accepted.unsqueeze(1))  # [B, 1]
    n = num_accepted.unsqueeze(1)
    output_token_ids = torch.where(
        positions < n, padded_drafts, torch.where(positions == n, last_token, torch.full_like(padded_drafts, -1))
    )
    target_prob_of_last = target_probs.gather(1, n.unsqueeze(-1).expand(-1, 1, target_probs.shape[-1]))
    target_prob_of_last = target_prob_of_last.squeeze(1).gather(-1, last_token).squeeze(-1)  # [B]
    return VerifyOutput(
        output_token_ids=output_token_ids,
        num_accepted=num_accepted,
        target_probs_of_drafts=target_probs_of_drafts,
        draft_probs_of_drafts=draft_probs_of_drafts,
        target_prob_of_last=target_prob_of_last,
    )
