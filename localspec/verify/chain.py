"""Verifying a chain of K drafts over the verify forward's logits [K+1, V], with every draw keyed to (seed, output
position): the target's own draw (one_hot.py) for one-hot drafts and, with a seed, for every draft; the rejection
sampler (reference.py / triton_fused.py) for soft drafts without one. One host read."""

from __future__ import annotations

from typing import Optional

import torch

from localspec.config import SamplingParams
from localspec.runtime.sampling import all_finite

from .one_hot import verify_one_hot
from .types import HostVerdict, VerifyOutput, position_draws


def verify_chain(
    logits: torch.Tensor,  # [K+1, V] row i: the distribution of output position start + i
    draft_ids: list[int],  # [K]
    draft_probs: Optional[torch.Tensor],  # [1, K, V] the drafts' distributions; None = one-hot
    sampling: SamplingParams,
    start: int,  # the output position of row 0
    rejection_sampler,  # a Verifier (verify/__init__.py) for soft drafts without a seed
    finite: Optional[torch.Tensor] = None,  # [] bool: whether the forward's logits were finite (default: these)
) -> Optional[HostVerdict]:
    """What the target kept, on the host; None when the logits held NaN / inf."""
    device, k = logits.device, len(draft_ids)
    logits = logits.unsqueeze(0)  # [1, K+1, V]
    draws = None if sampling.greedy else position_draws(sampling.seed, start, k, logits.shape[-1], device)
    drafts = torch.tensor([draft_ids], dtype=torch.long, device=device).view(1, k)
    own_draw = not sampling.greedy and (draft_probs is None or sampling.seeded)
    verify = verify_one_hot if own_draw else rejection_sampler
    result = verify(logits, drafts, draft_probs, sampling, draws)
    finite = all_finite(logits) if finite is None else finite
    verdict = VerifyOutput.from_host(result.to_host(finite), k)  # the step's one host read
    return verdict if verdict.finite else None
