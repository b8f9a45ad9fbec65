"""What the engine loop carries between steps (Run) and what one step decided (Proposal, StepOutcome)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.proposers.base import Proposer
from localspec.runtime.sampling import top_logprobs
from localspec.verify import Verifier
from localspec.verify.types import HostVerdict

from .adaptive import AdaptiveController, CostModel, VerifyCosts
from .adaptive_tree import TreeSizeController
from .events import FinishReason, StepEvent, TokenEvent
from .metrics import StatsSnapshot

TopLogprobs = tuple[tuple[int, float], ...]  # (token id, log-probability), most likely first

NON_FINITE = "the target produced NaN or infinite logits; the answer was stopped"

ControllerKey = tuple[str, int, bool]  # (proposer or proposer:part, K, adaptive)
TreeControllerKey = tuple[str, int, int, bool]  # (proposer or proposer:part, K, tree nodes, adaptive)


@dataclass
class Controllers:
    """The engine's adaptive controllers, kept across answers (the costs are the machine's): one per proposer part
    for chains, and one per part for tree sizes (sharing that part's chain costs)."""

    chain: dict[ControllerKey, AdaptiveController] = field(default_factory=dict)
    tree: dict[TreeControllerKey, TreeSizeController] = field(default_factory=dict)
    verify: VerifyCosts = field(default_factory=VerifyCosts)  # the target's, shared by all of them


@dataclass
class Run:
    """One answer in progress: its settings, where it stands, and its statistics."""

    sampling: SamplingParams
    spec: SpecConfig
    proposer: Optional[Proposer]  # None: plain decoding
    verify: Verifier
    generator: torch.Generator
    max_new: int  # the token budget: the request's, capped by the context left
    max_k: int  # draft tokens per step at most (0 without a proposer)
    context: list[int]  # the prompt plus every emitted token
    controllers: Controllers  # the engine's, kept across answers
    stats: StatsSnapshot
    pending: int = 0  # the last known token: its logits are the next verified position
    produced: int = 0
    controller: Optional[AdaptiveController] = None  # of the part drafting this step
    tree_controller: Optional[TreeSizeController] = None
    forced_k: Optional[int] = None  # the K a tree-size controller chose for this step's chain (0: plain)
    begun: set[str] = field(default_factory=set)  # the parts whose controllers this answer has begun
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(
        cls,
        prompt_ids: list[int],
        sampling: SamplingParams,
        spec: SpecConfig,
        proposer: Optional[Proposer],
        verify: Verifier,
        device: torch.device,
        max_context: int,
        controllers: Controllers,
    ) -> Run:
        """A new answer to prompt_ids: seeded generator, token budget capped by the context left, empty statistics."""
        sampling.validate()
        spec.validate()
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        if len(prompt_ids) >= max_context:
            raise ConfigError(f"the prompt has {len(prompt_ids)} tokens; this model's context holds {max_context}")
        max_k = spec.k if proposer is not None else 0
        return cls(
            sampling=sampling,
            spec=spec,
            proposer=proposer,
            verify=verify,
            generator=torch.Generator(device=device).manual_seed(sampling.seed),
            max_new=min(sampling.max_new_tokens, max_context - len(prompt_ids)),
            max_k=max_k,
            context=list(prompt_ids),
            controllers=controllers,
            stats=StatsSnapshot.start(max_k),
            pending=prompt_ids[-1],
        )

    @property
    def wants_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.wants_hidden

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The earlier target layers a head reads besides the last (multi-layer features), from the same forwards."""
        return tuple(self.proposer.feature_layers) if self.wants_hidden else ()

    def snapshot(self) -> StatsSnapshot:
        return replace(self.stats, elapsed_s=time.perf_counter() - self.started)

    def observe(self, outcome: StepOutcome, emitted: int) -> None:
        """Tell the controller and the statistics what the step cost and kept."""
        proposal, num_accepted = outcome.proposal, outcome.verdict.num_accepted
        stats = self.stats
        if self.controller is not None:
            self.controller.observe(
                proposal.asked, proposal.k, num_accepted, proposal.propose_s, outcome.score_s + outcome.sampler_s
            )
            stats = replace(stats, k=proposal.asked)
            if proposal.budget_k > 0:  # the last step of a length-capped answer cannot draft: it predicts nothing
                stats = replace(stats, predicted_speedup=self.controller.predicted(proposal.asked))
            stats = replace(stats, paused=self.pause_reason())
        if self.tree_controller is not None:
            self.tree_controller.observe_chain(proposal.k)
        self.stats = stats.after_step(
            proposal.k, num_accepted, emitted, proposal.propose_s, outcome.score_s, outcome.sampler_s
        )

    def pause_reason(self) -> Optional[dict]:
        """Why adaptive speculation is off (the tree-size controller's reason when it decides), else None."""
        if not self.spec.adaptive:
            return None
        decider = self.tree_controller or self.controller
        return None if decider is None else decider.pause_reason()

    def choose_k(self) -> tuple[int, int]:
        """(the budget's K, the K to ask for). Never drafts past the token budget, since K+1 tokens may be emitted;
        adaptive K asks for fewer, or none (a plain step), when the measured costs say so (or the K the tree-size
        controller chose, when it chose a chain or a plain step)."""
        budget_k = min(self.max_k, self.max_new - self.produced - 1)
        forced, self.forced_k = self.forced_k, None
        if forced is not None:
            return budget_k, min(budget_k, forced)
        self.tree_controller = None
        if self.proposer is not None:
            self.controller = self._controller_for(self.proposer.part(self.context))
        if self.controller is not None and self.spec.adaptive:
            return budget_k, min(budget_k, self.controller.choose_k())
        return budget_k, budget_k

    def tree_controller_for(self, part: Optional[str]) -> TreeSizeController:
        """The tree-size controller of this step's part (sharing the costs of the part's chain controller, which
        becomes run.controller too)."""
        self.controller = self._controller_for(part)
        name = self.proposer.name if part is None else f"{self.proposer.name}:{part}"
        key = (name, self.max_k, self.spec.tree_nodes, self.spec.adaptive)
        found = self.controllers.tree.get(key)
        if found is None or found.chain is not self.controller:
            found = self.controllers.tree[key] = TreeSizeController(self.controller, self.spec.tree_nodes)
        if f"tree:{name}" not in self.begun:
            found.begin()
            self.begun.add(f"tree:{name}")
        self.tree_controller = found
        return found

    def _controller_for(self, part: Optional[str]) -> AdaptiveController:
        """Each part of a proposer made of parts (ngram+head) has its own controller: the parts differ in cost and
        acceptance, and so in their best K. Told each step's costs and outcome, a controller predicts the speedup
        (the break-even meter); when adaptive it also picks K."""
        name = self.proposer.name if part is None else f"{self.proposer.name}:{part}"
        key = (name, self.max_k, self.spec.adaptive)
        found = self.controllers.chain.get(key)
        if found is None:
            costs = CostModel(self.controllers.verify)
            found = self.controllers.chain[key] = AdaptiveController(self.max_k, costs)
        if name not in self.begun:
            found.begin()
            self.begun.add(name)
        return found


@dataclass(frozen=True)
class Proposal:
    """What the proposer drafted this step."""

    budget_k: int
    asked: int  # K asked for (adaptive may ask fewer than the budget)
    token_ids: list[int]  # may be fewer than asked, or none
    probs: Optional[torch.Tensor]  # [1, K, V] the proposer's distributions; None = one-hot
    propose_s: float

    @property
    def k(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class StepOutcome:
    """What the target decided about one proposal, on the host."""

    proposal: Proposal
    verdict: HostVerdict
    hidden: Optional[torch.Tensor]  # [K+1, F] the verify forward's features, when the proposer wants them
    score_s: float
    sampler_s: float
    top: Optional[list[TopLogprobs]] = None  # per emitted position, when the sampling parameters ask for it


def read_top_logprobs(logits: torch.Tensor, sampling: SamplingParams, rows: int) -> list[TopLogprobs]:
    """The first `rows` positions' top-n (n = sampling.top_logprobs) from the verify forward's logits [K+1, V], in
    one host read."""
    n = min(sampling.top_logprobs, logits.shape[-1])
    values, ids = top_logprobs(logits[:rows], sampling, n)
    packed = torch.cat([ids.to(torch.float64), values.to(torch.float64)], dim=-1).tolist()  # [rows, 2n]
    return [tuple((int(row[i]), row[n + i]) for i in range(n)) for row in packed]


def token_events(outcome: StepOutcome) -> list[TokenEvent]:
    """One TokenEvent per emitted token: the accepted drafts, then the resampled token (a draft was rejected), the
    bonus token (every draft was kept) or the target's own token (nothing was drafted)."""
    verdict, draft_ids, k = outcome.verdict, outcome.proposal.token_ids, outcome.proposal.k
    n = verdict.num_accepted
    tokens = [
        TokenEvent.accepted(token_id, verdict.target_probs_of_drafts[i], verdict.draft_probs_of_drafts[i])
        for i, token_id in enumerate(verdict.emitted[:n])
    ]
    last = verdict.emitted[n]
    if n < k:
        tokens.append(
            TokenEvent.resampled(
                last,
                verdict.target_prob_of_last,
                draft_ids[n],
                verdict.target_probs_of_drafts[n],
                verdict.draft_probs_of_drafts[n],
            )
        )
    else:
        tokens.append(TokenEvent(last, "bonus" if k > 0 else "target", verdict.target_prob_of_last))
    if outcome.top is not None:
        tokens = [replace(token, top_logprobs=top) for token, top in zip(tokens, outcome.top)]
    return tokens


def cut_at_stop(tokens: list[TokenEvent], stop_token_ids: frozenset[int]) -> tuple[list[TokenEvent], bool]:
    """The tokens up to and including the first stop token, and whether there was one."""
    for i, token in enumerate(tokens):
        if token.token_id in stop_token_ids:
            return tokens[: i + 1], True
    return tokens, False


def step_event(
    tokens: list[TokenEvent], outcome: StepOutcome, stats: StatsSnapshot, finish_reason: Optional[FinishReason]
) -> StepEvent:
    """The event of one step that kept `tokens`: its time split, its draft counts and the answer's statistics."""
    return StepEvent(
        tuple(tokens),
        outcome.proposal.propose_s * 1e6,
        outcome.score_s * 1e6,
        outcome.sampler_s * 1e6,
        propose_token_num=outcome.proposal.k,
        accept_token_num=outcome.verdict.num_accepted,
        stats=stats,
        finished=finish_reason is not None,
        finish_reason=finish_reason,
    )
