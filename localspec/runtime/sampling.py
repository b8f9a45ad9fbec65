"""Logits → probabilities, shared by every proposer and the target so both see the same distribution; and the
random draws of an output position, keyed to (seed, position) so the proposers and the verifiers draw alike."""

from __future__ import annotations

import numpy as np
import torch

from localspec.config import SamplingParams


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1), the first of equal maxima (a NaN counts as the maximum), [...] int64. On the CPU
    through numpy: torch's CPU argmax reads about 1 ns an element (0.2 ms for 5 rows of a 49k vocabulary), numpy's
    ~15x faster, with the same answer."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.requires_grad:
        return torch.argmax(x, dim=-1)
    return torch.from_numpy(np.asarray(np.argmax(x.numpy(), axis=-1)))


def all_finite(x: torch.Tensor) -> torch.Tensor:
    """[] bool: no NaN or infinity in x. On the CPU from one sum (a NaN or an infinity carries through it; only a
    sum that overflowed from huge finite values is checked element by element): 12 us instead of 280 for 5 rows of
    a 49k vocabulary. On a GPU the element-wise check, with no host sync."""
    if x.device.type != "cpu":
        return torch.isfinite(x).all()
    total = torch.isfinite(x.sum())
    return total if bool(total) else torch.isfinite(x).all()


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask (set to -inf) the tokens outside top-k / top-p. logits: [..., V], already temperature-scaled.

    top-p keeps the smallest set of tokens whose probability reaches top_p (the most likely token always stays).
    """
    if top_k and 0 < top_k < logits.shape[-1]:
        kth_value = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_value, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k / top-p masking. Greedy (temperature 0) keeps temperature 1 for display probabilities."""
    logits = logits.float()
    if not params.greedy:
        logits = logits / params.temperature
    return filter_logits(logits, params.top_k, params.top_p)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] → probabilities [..., V] (float32) under the sampling parameters."""
    return torch.softmax(process_logits(logits, params), dim=-1)


def top_logprobs(logits: torch.Tensor, params: SamplingParams, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The n most likely tokens of each row under the sampling parameters (the distribution logits_to_probs gives):
    (log-probabilities [..., n] float32, descending; token ids [..., n] int64). A token top-k / top-p masked out has
    log-probability -inf."""
    values, ids = torch.topk(torch.log_softmax(process_logits(logits, params), dim=-1), n, dim=-1)
    return values, ids


def chosen_and_top_logprobs(
    logits: torch.Tensor, params: SamplingParams, chosen: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """top_logprobs plus each row's chosen token's own log-probability ([...] float32), read from the same
    log-softmax: a chosen token among the top n has there exactly the value it has itself. chosen: [...] int64."""
    logprobs = torch.log_softmax(process_logits(logits, params), dim=-1)  # [..., V]
    values, ids = torch.topk(logprobs, n, dim=-1)
    return logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1), values, ids


def sample_with_noise(probs: torch.Tensor, exponential_noise: torch.Tensor) -> torch.Tensor:
    """Draw one token per row: argmax(probs / E) with E ~ Exp(1) is an exact sample from probs, with no host sync.

    probs may be unnormalised (any non-negative weights). probs, exponential_noise: [..., V] → [...] int64.
    """
    return argmax_last(probs / exponential_noise)


def position_generator(seed: int, position: int, device: torch.device | str) -> torch.Generator:
    """The generator of output position `position` of an answer seeded with `seed` (a fixed mix of the two)."""
    key = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) % (2**63)
    return torch.Generator(device=device).manual_seed(key)


def position_draw(
    seed: int, position: int, vocab: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output position `position`'s draws: (a uniform [] in [0, 1), exponential noise [V]), the same whichever step
    and whichever row of a forward the position falls in."""
    generator = position_generator(seed, position, device)
    uniform = torch.rand((), generator=generator, device=device, dtype=torch.float32)
    noise = torch.empty((vocab,), device=device, dtype=torch.float32).exponential_(generator=generator)
    return uniform, noise
