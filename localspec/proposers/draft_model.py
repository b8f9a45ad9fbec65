"""A standalone draft model with the target's tokenizer: K autoregressive steps on its own KV cache."""

from __future__ import annotations

from typing import Optional

import torch

from localspec.config import SamplingParams
from localspec.runtime.model_runner import ModelRunner
from localspec.runtime.sampling import logits_to_probs

from .base import Draft, DraftNoise, Proposer


class DraftModelProposer(Proposer):
    """Drafts with a small causal LM. Its cache always holds a prefix of the context: before each proposal it is
    cropped to the longest common prefix with the new context (the rollback after a rejection) and the missing
    tokens are fed (one token normally; two, the catch-up, after all K were accepted)."""

    name = "draft"
    wants_hidden = False

    def __init__(self, model: torch.nn.Module, vocab_size: Optional[int] = None) -> None:
        """vocab_size: the target's output rows, when the draft's vocabulary is a prefix of them (Qwen2.5 0.5B has
        151,936 rows, 7B 152,064): the draft's probabilities are zero-padded to that width. Exact, since the draft
        never proposes a padded id."""
        self.runner = ModelRunner(model)
        self.pad = max(0, (vocab_size or self.runner.vocab_size) - self.runner.vocab_size)

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.pad:
            return logits
        return torch.nn.functional.pad(logits.float(), (0, self.pad), value=float("-inf"))

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        self.runner.reset()

    @torch.inference_mode()
    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, noise: DraftNoise) -> Draft:
        runner = self.runner
        keep = min(runner.common_prefix(context_ids), len(context_ids) - 1)
        runner.crop(keep)
        logits = self._logits(runner.extend(context_ids[keep:], logits_to_keep=1).logits[-1])  # [V]
        token_ids: list[int] = []
        probs_rows: list[torch.Tensor] = []
        for step in range(k):
            probs = logits_to_probs(logits, sampling)  # [V]
            token = torch.argmax(logits, dim=-1) if sampling.greedy else noise.sample(step, probs)
            probs_rows.append(probs)
            token_ids.append(token)
            if step < k - 1:
                logits = self._logits(runner.extend([int(token)], logits_to_keep=1).logits[-1])
        ids = torch.stack(token_ids).tolist() if token_ids else []
        return Draft(token_ids=ids, probs=torch.stack(probs_rows) if probs_rows else None)

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        pass  # the next propose() crops to the common prefix
