"""Penalties on the target's distribution, as a target processor (logits_processors.py): vLLM's repetition penalty
and OpenAI's frequency and presence penalties.

For a row whose prefix is the prompt, the answer so far and its path (the drafted tokens before it), with count(t)
the times token t is in the answer so far plus the path:
  repetition r   every token seen in the prompt or the prefix's answer: a logit > 0 is divided by r, any other
                 multiplied by r (r > 1 lowers each, whatever its sign)
  frequency  f   minus f · count(t)
  presence   p   minus p where count(t) > 0
in that order, each an elementwise operation on one logit: a row is processed bitwise the same whether it is scored
alone or among drafts, which keeps the rejection sampler exact for the penalised distribution and greedy speculation
equal to greedy plain decoding. Neutral values build no processor (penalties_for returns none).
"""

from __future__ import annotations

from collections import Counter
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
    """The penalties for one answer to `prompt_ids`. Only the tokens seen so far (the prompt's and the answer's) are
    read and rewritten, each from the forward's own logit by one rule (penalise), so a row's tokens get the same
    values whether its counts are committed or come from its path. The answer's counts live on the logits' device
    (made at the first process, when the vocabulary is known), grown by each commit."""

    def __init__(self, penalties: Penalties, prompt_ids: Sequence[int]) -> None:
        self.penalties = penalties
        self.seen: set[int] = set(prompt_ids)  # the tokens a penalty applies to: the prompt's and the answer's
        self.committed: list[int] = []  # the answer's tokens not yet counted on the device
        self.counts: Optional[torch.Tensor] = None  # [V] float32, each token's count in the answer so far
        self.index: Optional[torch.Tensor] = None  # [S] the seen tokens inside the vocabulary, made when needed

    def penalise(self, logits: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The rule for seen tokens: their logits [...] float32 and answer counts [...] (0 for a prompt token)."""
        rule, out = self.penalties, logits
        if rule.repetition != 1.0:
            out = torch.where(out > 0, out / rule.repetition, out * rule.repetition)
        if rule.frequency != 0.0:
            out = out - rule.frequency * counts
        if rule.presence != 0.0:
            out = out - rule.presence * (counts > 0).to(torch.float32)
        return out

    def _state(self, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The answer's counts [V] and the seen tokens' index [S], brought up to date with the commits."""
        if self.counts is None:
            self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        if self.committed:
            ids = _ids(self.committed, vocab, device)
            self.counts.index_put_((ids,), torch.ones_like(ids, dtype=torch.float32), accumulate=True)
            self.committed = []
        if self.index is None:
            self.index = _ids(sorted(self.seen), vocab, device)
        return self.counts, self.index

    def process(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """logits [rows, V] → the penalised logits [rows, V] (float32, a new tensor)."""
        rows, vocab = logits.shape
        counts, index = self._state(vocab, logits.device)
        out = logits.to(torch.float32, copy=True)
        if index.numel():  # the committed counts, every row
            out[:, index] = self.penalise(out[:, index], counts[index].expand(rows, -1))
        extra = [(row, token, n) for row, path in enumerate(paths) for token, n in Counter(path).items()]
        extra = [(row, token, n) for row, token, n in extra if 0 <= token < vocab]
        if extra:  # each row's own drafts on top, recomputed from the forward's logits
            at = torch.tensor(extra, dtype=torch.long).to(logits.device)  # [n, 3] (row, token, count in the path)
            row, token = at[:, 0], at[:, 1]
            total = counts[token] + at[:, 2].to(torch.float32)
            out[row, token] = self.penalise(logits[row, token].to(torch.float32), total)
        return out

    def commit(self, tokens: Sequence[int]) -> None:
        self.committed.extend(tokens)
        if not self.seen.issuperset(tokens):
            self.seen.update(tokens)
            self.index = None


def _ids(tokens: Sequence[int], vocab: int, device: torch.device) -> torch.Tensor:
    """The tokens inside the vocabulary as an index tensor on `device` (made on the host, one copy)."""
    return torch.tensor([t for t in tokens if 0 <= t < vocab], dtype=torch.long).to(device)


def penalties_for(sampling: SamplingParams, prompt_ids: Sequence[int]) -> tuple[PenaltyProcessor, ...]:
    """The answer's penalty processor, or none at all where every penalty is neutral (nothing changes, nothing
    costs)."""
    penalties = Penalties.of(sampling)
    return () if penalties.neutral else (PenaltyProcessor(penalties, prompt_ids),)
