"""Penalties on the target's distribution, as a target processor (logits_processors.py): vLLM's repetition penalty
and OpenAI's frequency and presence penalties.

For a row whose prefix is the prompt, the answer so far and its path (the drafted tokens before it), with count(t)
the times token t is in the answer so far plus the path:
  repetition r   every token seen in the prompt or the prefix's answer: a logit > 0 is divided by r, any other
                 multiplied by r (r > 1 lowers each, whatever its sign)
  frequency  f   minus f · count(t)
  presence   p   minus p where count(t) > 0
in that order, each an elementwise operation on the row alone: a row is processed bitwise the same whether it is
scored alone or among drafts, which keeps the rejection sampler exact for the penalised distribution and greedy
speculation equal to greedy plain decoding. Neutral values build no processor (penalties_for returns none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from localspec.config import SamplingParams


@dataclass(frozen=True)
class Penalties:
    repetition: float = 1.0  # vLLM's repetition_penalty: 1 = off
    frequency: float = 0.0  # OpenAI's frequency_penalty: 0 = off
    presence: float = 0.0  # OpenAI's presence_penalty: 0 = off

    @classmethod
    def of(cls, sampling: SamplingParams) -> Penalties:
        return cls(sampling.repetition_penalty, sampling.frequency_penalty, sampling.presence_penalty)

    @property
    def neutral(self) -> bool:
        return self.repetition == 1.0 and self.frequency == 0.0 and self.presence == 0.0


class PenaltyProcessor:
    """The penalties for one answer to `prompt_ids`: the answer's token counts live on the logits' device (made at
    the first process, when the vocabulary is known), grown by each commit."""

    def __init__(self, penalties: Penalties, prompt_ids: Sequence[int]) -> None:
        self.penalties = penalties
        self.prompt_ids = list(prompt_ids)
        self.counts: Optional[torch.Tensor] = None  # [V] float32, each token's count in the answer so far
        self.in_prompt: Optional[torch.Tensor] = None  # [V] bool
        self.pending: list[int] = []  # committed before the counts existed

    def _state(self, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.counts is None or self.in_prompt is None:
            self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)
            self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
            self.in_prompt[_ids(self.prompt_ids, vocab, device)] = True
            self._count(self.pending)
            self.pending = []
        return self.counts, self.in_prompt

    def _count(self, tokens: Sequence[int]) -> None:
        assert self.counts is not None
        vocab = self.counts.shape[0]
        ids = _ids(tokens, vocab, self.counts.device)
        self.counts.index_put_((ids,), torch.ones_like(ids, dtype=torch.float32), accumulate=True)

    def process(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """logits [rows, V] → the penalised logits [rows, V] (float32, a new tensor)."""
        rows, vocab = logits.shape
        counts, in_prompt = self._state(vocab, logits.device)
        counts = counts.expand(rows, vocab).clone()  # [rows, V] the answer's counts, then each row's path on top
        flat = [(row, token) for row, path in enumerate(paths) for token in path if 0 <= token < vocab]
        if flat:
            index = torch.tensor(flat, dtype=torch.long).to(logits.device)  # [n, 2] (row, token)
            ones = torch.ones(len(flat), dtype=torch.float32, device=logits.device)
            counts.index_put_((index[:, 0], index[:, 1]), ones, accumulate=True)
        out = logits.to(torch.float32)
        seen = counts > 0  # [rows, V]
        rule = self.penalties
        if rule.repetition != 1.0:
            penalised = torch.where(out > 0, out / rule.repetition, out * rule.repetition)
            out = torch.where(seen | in_prompt, penalised, out)
        if rule.frequency != 0.0:
            out = out - rule.frequency * counts
        if rule.presence != 0.0:
            out = out - rule.presence * seen.to(torch.float32)
        return out  # a new tensor: some penalty is not neutral

    def commit(self, tokens: Sequence[int]) -> None:
        if self.counts is None:
            self.pending.extend(tokens)
        else:
            self._count(tokens)


def _ids(tokens: Sequence[int], vocab: int, device: torch.device) -> torch.Tensor:
    """The tokens inside the vocabulary as an index tensor on `device` (made on the host, one copy)."""
    return torch.tensor([t for t in tokens if 0 <= t < vocab], dtype=torch.long).to(device)


def penalties_for(sampling: SamplingParams, prompt_ids: Sequence[int]) -> tuple[PenaltyProcessor, ...]:
    """The answer's penalty processor, or none at all where every penalty is neutral (nothing changes, nothing
    costs)."""
    penalties = Penalties.of(sampling)
    return () if penalties.neutral else (PenaltyProcessor(penalties, prompt_ids),)
