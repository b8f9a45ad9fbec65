"""What a model proposer's drafts cost on this machine, timed once when a pair loads: the prior of the adaptive
controllers' drafting cost (engine/adaptive.py's CostModel), which the answers' own timings replace as they come.
Without it a controller takes drafting as free until it has drafted, so a model that drafts slowly (a draft model
whose token costs more than a target forward) is tried in the first steps of every session at a loss."""

from __future__ import annotations

import statistics
import time
from typing import Optional

import torch

from localspec.config import SamplingParams

from .base import DraftNoise, Proposer

CONTEXT = 32  # tokens of random context before the timed drafts
REPEATS = 3  # timed proposals (after one untimed, which feeds the context)
DRAFTS = 2  # tokens each timed proposal asks for: a draft model's cost per token hardly depends on it


@torch.inference_mode()
def seconds_per_token(proposer: Proposer, vocab_size: int, feature_size: int = 0, k: int = DRAFTS) -> Optional[float]:
    """Median seconds per drafted token asked for, of `proposer` asked for k greedy drafts after CONTEXT random
    token ids (and zero target features of width feature_size where it reads them), as the engine times a step's
    proposal; None when it drafts nothing. The proposer is left mid-answer: begin() it before using it."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (CONTEXT,), generator=generator).tolist()
    hidden = torch.zeros(CONTEXT - 1, feature_size) if proposer.wants_hidden and feature_size else None
    if proposer.wants_hidden and hidden is None:
        return None
    proposer.begin(ids, hidden)
    sampling, noise = SamplingParams(temperature=0.0), DraftNoise(generator)
    times = []
    for attempt in range(REPEATS + 1):
        started = time.perf_counter()
        drafted = proposer.propose(ids, k, sampling, noise).token_ids
        elapsed = time.perf_counter() - started
        if not drafted:
            return None
        if attempt:
            times.append(elapsed / k)
    return statistics.median(times)
