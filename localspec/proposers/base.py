"""The proposer interface: anything that drafts tokens for the target to verify."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, runtime_checkable

import torch

from localspec.config import SamplingParams
from localspec.runtime.sampling import position_draw, sample_with_noise
from localspec.runtime.tree import TokenTree


@dataclass(frozen=True)
class Draft:
    """K proposed tokens, with the proposer's distribution at each position when it has one."""

    token_ids: list[int]  # K ids (may be fewer than asked, or empty: then the step is a plain target step)
    probs: Optional[torch.Tensor] = None  # [K, V] float32 under the shared logits_to_probs; None = one-hot (n-gram)


@dataclass(frozen=True)
class DraftNoise:
    """The noise a proposer samples a step's i-th draft token with: token = argmax(probs / E_i), E_i ~ Exp(1).

    Seeded (seed given): E_i is output position start + i's own noise, the one the target draws that position with
    (verify/one_hot.py), so a draft is kept exactly where it equals the target's seeded draw, which it does more
    often the closer the draft's distribution is to the target's (a draft equal to the target is always kept). Not
    seeded: fresh noise from the answer's generator, independent of the rejection sampler's draws."""

    generator: torch.Generator
    seed: Optional[int] = None  # None: not seeded
    start: int = 0  # the output position of the step's first draft token

    def sample(self, i: int, probs: torch.Tensor) -> torch.Tensor:
        """The i-th draft token ([] int64) from probs [V]."""
        if self.seed is None:
            noise = torch.empty_like(probs).exponential_(generator=self.generator)
        else:
            noise = position_draw(self.seed, self.start + i, probs.shape[-1], probs.device)[1]
        return sample_with_noise(probs, noise)


PEEK = SamplingParams()  # a lookup draws nothing: peeking at it (which part drafts next) needs no answer's noise
PEEK_NOISE = DraftNoise(torch.Generator())


@runtime_checkable
class Proposer(Protocol):
    """Drafts tokens; is told after each step what the target kept.

    Proposers subclass it, and inherit the defaults of the members they do not need.

    wants_hidden: when True, the engine passes the target's features (from the same verify forward, no extra pass)
    to begin() and on_verified(), so feature-level heads (EAGLE / MTP) plug in unchanged: the last-layer hidden
    state, after the outputs of the decoder layers listed in `feature_layers` (layer indices; F = H × (len + 1),
    see features.py).

    supports_tree: when True, propose_tree drafts a token tree (runtime/tree.py) that the target verifies in one
    forward (SpecConfig.tree_nodes > 0); the others draft chains only.

    context_only: when True, a draft is a function of context_ids alone (a lookup: n-gram, history), so it may be
    asked to continue a context that ends in drafts not yet verified (proposers/grammar.py does, after the tokens a
    grammar forces); a proposer with state that on_verified keeps (a head, a draft model) drafts after the verified
    answer only.
    """

    name: str
    wants_hidden: bool = False
    feature_layers: tuple[int, ...] = ()
    feature_size: int = 0  # F, the width of the features it is given (wants_hidden)
    supports_tree: bool = False
    context_only: bool = False

    def part(self, context_ids: list[int]) -> Optional[str]:
        """For a proposer made of parts (ngram+head): the part that drafts after context_ids, so adaptive K keeps one
        controller per part. None: a proposer of one part."""
        return None

    def certain(self, context_ids: list[int]) -> int:
        """How many of the drafts after context_ids the target is certain to keep (a grammar's forced tokens): the
        step's plan drafts at least these (engine/policy.py). 0: none."""
        return 0

    def begin(self, prompt_ids: list[int], prompt_hidden: Optional[torch.Tensor]) -> None:
        """A new answer starts. prompt_hidden: [len(prompt_ids) - 1, F] for the prefilled prompt, or None."""

    def propose(self, context_ids: list[int], k: int, sampling: SamplingParams, noise: DraftNoise) -> Draft:
        """Draft up to k tokens that follow context_ids (the prompt plus everything emitted so far); a sampled
        draft token i is noise.sample(i, its probabilities)."""

    def propose_tree(
        self, context_ids: list[int], n_nodes: int, sampling: SamplingParams, noise: DraftNoise
    ) -> Optional[TokenTree]:
        """Draft a tree of up to n_nodes nodes that follows context_ids; None: no tree here (a plain step)."""
        return None

    def on_verified(self, num_accepted: int, emitted_ids: list[int], target_hidden: Optional[torch.Tensor]) -> None:
        """The target kept num_accepted draft tokens; emitted_ids = those plus the resampled / bonus token.

        target_hidden: [num_accepted + 1, F], the features at the positions whose predictions were emitted.
        """


def tree_of(
    part: Proposer, context_ids: list[int], n_nodes: int, sampling: SamplingParams, noise: DraftNoise
) -> Optional[TokenTree]:
    """part's tree after context_ids; a part without trees gives its chain of n_nodes drafts as a one-branch tree
    (the tree verifier treats every node as a one-hot draft). None: it drafts nothing here."""
    if part.supports_tree:
        tree = part.propose_tree(context_ids, n_nodes, sampling, noise)
        return tree if tree is not None and tree.size else None
    token_ids = part.propose(context_ids, n_nodes, sampling, noise).token_ids[:n_nodes]
    return TokenTree.chain(token_ids) if token_ids else None
