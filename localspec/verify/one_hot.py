"""Verifying drafts by the target's own draw at each position: one-hot drafts (n-gram chains; plain decoding, K = 0)
always, and with a seed every draft (a draft model's, a head's: their probabilities are only reported).

At draft position i the target draws its own token t_i = argmax(p_i / E_i) (greedy: argmax p_i) with that output
position's noise E_i (types.position_draws); draft d_i is accepted while d_i == t_i, and the first t_i that differs
(or t_K after K accepted drafts) is emitted. A one-hot draft is then accepted with probability p_i(d_i), as the p/q
test accepts it (q = 1), every emitted token follows p exactly, and the emitted tokens are the ones plain seeded
sampling draws at the same positions: a seeded answer does not change with K, the proposer or its drafts. A soft
draft d_i ~ q_i is kept with probability P(d_i == t_i): sampled with the same position's noise (proposers/base.py
DraftNoise), d_i = argmax(q_i / E_i) equals t_i always when q_i = p_i and at least (1 - TV) / (1 + TV) of the time
otherwise (Gumbel-max coupling), a little below the rejection sampler's 1 - TV. Without a seed, soft drafts may keep
the rejection sampler (reference.py / triton_fused.py).
"""

from __future__ import annotations

import torch

from localspec.config import SamplingParams
from localspec.runtime.sampling import argmax_last, logits_to_probs, sample_with_noise

from .types import SamplerDraws, VerifyOutput


def verify_one_hot(
    target_logits: torch.Tensor,  # [B, K+1, V]
    draft_token_ids: torch.Tensor,  # [B, K] int64
    draft_probs: torch.Tensor | None,  # [B, K, V] reported, never tested; None for one-hot drafts (reported as 1)
    sampling: SamplingParams,
    draws: SamplerDraws | None,  # None only in greedy mode
) -> VerifyOutput:
    batch, k_plus_1, _vocab = target_logits.shape
    k = k_plus_1 - 1
    probs = logits_to_probs(target_logits, sampling)  # [B, K+1, V]
    if sampling.greedy:
        own = argmax_last(target_logits.float())  # [B, K+1]
    else:
        if draws is None:
            raise ValueError("stochastic verification needs random draws")
        own = sample_with_noise(probs, draws.noise)  # [B, K+1] the target's token at each position
    accepted = draft_token_ids == own[:, :k]  # [B, K]
    num_accepted = torch.cumprod(accepted.long(), dim=-1).sum(-1)  # [B]
    n = num_accepted.unsqueeze(1)  # [B, 1]
    positions = torch.arange(k_plus_1, device=target_logits.device)
    output_token_ids = torch.where(positions <= n, own, torch.full_like(own, -1))  # accepted drafts equal own
    gather_ids = draft_token_ids.clamp(min=0).unsqueeze(-1)  # [B, K, 1]
    target_probs_of_drafts = probs[:, :k].gather(-1, gather_ids).squeeze(-1)  # [B, K]
    if draft_probs is None:
        draft_probs_of_drafts = torch.ones_like(target_probs_of_drafts)
    else:
        draft_probs_of_drafts = draft_probs.float().gather(-1, gather_ids).squeeze(-1)  # [B, K]
    last_token = own.gather(1, n)  # [B, 1]
    target_prob_of_last = probs.gather(1, n.unsqueeze(-1).expand(-1, 1, probs.shape[-1])).squeeze(1)  # [B, V]
    return VerifyOutput(
        output_token_ids=output_token_ids,
        num_accepted=num_accepted,
        target_probs_of_drafts=target_probs_of_drafts,
        draft_probs_of_drafts=draft_probs_of_drafts,
        target_prob_of_last=target_prob_of_last.gather(-1, last_token).squeeze(-1),  # [B]
    )
