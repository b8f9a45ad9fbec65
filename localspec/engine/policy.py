"""The step policy: the one place that decides each step's plan (plain, a chain of K, a tree of N nodes) and the one
place the adaptive controllers learn, through observe(plan, outcome).

It owns the answer's view of the engine's controllers (Controllers, kept across answers: the costs are the
machine's): one chain controller per proposer part, and one tree-size controller per part that shares that part's
chain costs. Without SpecConfig.adaptive the plan is the configured one (a tree of tree_nodes where the proposer and
the target run trees, else a chain of K) and the controllers only predict the speedup."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from localspec.config import SpecConfig
from localspec.proposers.base import Proposer

from .adaptive import AdaptiveController, CostModel, RunningTime, Tuning, VerifyCosts
from .adaptive_tree import TreeSizeController
from .metrics import PauseReason
from .plan import PLAIN, StepOutcome, StepPlan

if TYPE_CHECKING:
    from .run import Run

ControllerKey = tuple[str, int, bool]  # (proposer or proposer:part, K, adaptive)
TreeControllerKey = tuple[str, int, int, bool]  # (proposer or proposer:part, K, tree nodes, adaptive)


@dataclass
class Controllers:
    """The engine's adaptive controllers, kept across answers: one per proposer part for chains, and one per part
    for tree sizes (sharing that part's chain costs). `tuning` is every one of them's, and the verify line's."""

    chain: dict[ControllerKey, AdaptiveController] = field(default_factory=dict)
    tree: dict[TreeControllerKey, TreeSizeController] = field(default_factory=dict)
    verify: VerifyCosts = field(default_factory=VerifyCosts)  # the target's, shared by all of them
    tuning: Tuning = Tuning()
    # a model proposer's (head, draft) seconds per drafted token, timed at load (proposers/timing.py): the prior of
    # the drafting cost of every controller of that part, until it has drafted
    propose_priors: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.verify.tuning = self.tuning

    @classmethod
    def retuned(cls, start: Controllers, tuning: Tuning) -> Controllers:
        """Fresh controllers that learn with `tuning`, from `start`'s verify costs (what the load timed)."""
        verify = dataclasses.replace(start.verify, by_rows={}, anchor={}, drifted=False)
        return cls(verify=verify, tuning=tuning, propose_priors=dict(start.propose_priors))


def drafts_trees(spec: SpecConfig, proposer: Optional[Proposer], target_supports_tree: bool) -> bool:
    """Whether an answer drafts token trees (else chains of K): tree_nodes asked for, a proposer that drafts trees
    and a target whose cache verifies them (the preallocated cache)."""
    return spec.tree_nodes > 0 and proposer is not None and proposer.supports_tree and target_supports_tree


@dataclass(frozen=True)
class Reading:
    """What the controllers say after a step, for the answer's statistics."""

    k: int  # the step's size: K asked for, or tree nodes
    predicted_speedup: Optional[float]  # None: nothing predicted (the token budget left no room to draft)
    paused: Optional[PauseReason]
    plain_step_s: Optional[float] = None  # the running estimate of a plain step's seconds, measured on this machine


class StepPolicy:
    """One answer's policy: plan() before each step, observe() after it."""

    def __init__(
        self,
        controllers: Controllers,
        spec: SpecConfig,
        proposer: Optional[Proposer],
        max_k: int,
        target_supports_tree: bool,
    ) -> None:
        self.controllers = controllers
        self.spec = spec
        self.proposer = proposer
        self.max_k = max_k
        self.trees = drafts_trees(spec, proposer, target_supports_tree)
        self.begun: set[str] = set()  # the parts whose controllers this answer has begun
        self.chain: Optional[AdaptiveController] = None  # the controllers that decided the last plan
        self.tree: Optional[TreeSizeController] = None

    def plan(self, run: Run) -> StepPlan:
        """This step's plan. Never drafts past the token budget (K+1 tokens may be emitted). Drafts the target is
        certain to keep (Proposer.certain: a grammar's forced tokens) are always drafted, whatever the controller
        chose (as a chain of them where it chose fewer), except on a plain step taken to measure the plain step's
        cost."""
        plan = self._chosen(run)
        certain = min(self.proposer.certain(run.context), run.room) if self.proposer is not None else 0
        if certain <= plan.size or self._measuring():
            return plan
        return StepPlan.chain(certain)  # they are a chain (a tree's sizes stop at tree_nodes)

    def _measuring(self) -> bool:
        decider = self.tree or self.chain
        return decider is not None and decider.measuring_plain and self.spec.adaptive

    def _chosen(self, run: Run) -> StepPlan:
        """The controllers' plan (the configured one without SpecConfig.adaptive)."""
        if self.proposer is None:
            return PLAIN
        if self.trees and run.room >= 1:
            self.tree = self._tree_controller(self.proposer.part(run.context))
            if not self.spec.adaptive:
                return StepPlan("tree", self.spec.tree_nodes)
            shape, size = self.tree.choose()
            budget_k = min(self.max_k, run.room)
            return StepPlan("tree", size) if shape == "tree" else StepPlan.chain(min(budget_k, size))
        return self.chain_plan(run)

    def chain_plan(self, run: Run) -> StepPlan:
        """A chain or plain plan, decided by the chain controller of the step's part: every step's without trees,
        and a tree plan's when the proposer drafts no tree here."""
        if self.proposer is None:
            return PLAIN
        budget_k = min(self.max_k, run.room)
        self.chain, self.tree = self._chain_controller(self.proposer.part(run.context)), None
        return StepPlan.chain(min(budget_k, self.chain.choose_k()) if self.spec.adaptive else budget_k)

    def observe(self, plan: StepPlan, outcome: StepOutcome) -> Optional[Reading]:
        """Teach the controllers that decided `plan` what it cost and kept; None for plain decoding."""
        if self.chain is None:
            return None
        if plan.shape == "tree" and self.tree is not None:
            self.tree.observe_tree(
                plan.size,
                outcome.drafted,
                outcome.num_accepted,
                outcome.propose_s,
                outcome.verify_s,
                outcome.whole,
                depth=outcome.depth,
                first_branch=outcome.first_branch,
            )
            return Reading(plan.size, self.tree.predicted(plan.size), self.pause_reason(), self._plain_s())
        self.chain.observe(plan.size, outcome.drafted, outcome.num_accepted, outcome.propose_s, outcome.verify_s)
        # the last step of a length-capped answer cannot draft: it predicts nothing; a plain step taken to measure
        # while speculating predicts what the speculating steps do
        measuring = self._measuring()
        predicted = None
        if min(self.max_k, outcome.room) > 0:
            predicted = (self.tree or self.chain).best()[1] if measuring else self.chain.predicted(plan.size)
        reading = Reading(plan.size, predicted, self.pause_reason(), self._plain_s())
        if self.tree is not None:  # a chain or plain step the tree-size controller chose
            self.tree.observe_chain(outcome.drafted)
        return reading

    def pause_reason(self) -> Optional[PauseReason]:
        """Why adaptive speculation is off (the tree-size controller's reason when it decided), else None."""
        if not self.spec.adaptive:
            return None
        decider = self.tree or self.chain
        return None if decider is None else decider.pause_reason()

    def _plain_s(self) -> Optional[float]:
        return self.controllers.verify.plain_s()

    def _tree_controller(self, part: Optional[str]) -> TreeSizeController:
        """The tree-size controller of this step's part, sharing the costs of the part's chain controller (which
        becomes self.chain too)."""
        self.chain = self._chain_controller(part)
        name = self._name(part)
        key = (name, self.max_k, self.spec.tree_nodes, self.spec.adaptive)
        found = self.controllers.tree.get(key)
        if found is None or found.chain is not self.chain:
            found = self.controllers.tree[key] = TreeSizeController(
                self.chain, self.spec.tree_nodes, self.controllers.tuning
            )
        if f"tree:{name}" not in self.begun:
            found.begin()
            self.begun.add(f"tree:{name}")
        return found

    def _chain_controller(self, part: Optional[str]) -> AdaptiveController:
        """Each part of a proposer made of parts (ngram+head) has its own controller: the parts differ in cost and
        acceptance, and so in their best K. Told each step's costs and outcome, a controller predicts the speedup
        (the break-even meter); when adaptive it also picks K."""
        name = self._name(part)
        key = (name, self.max_k, self.spec.adaptive)
        found = self.controllers.chain.get(key)
        if found is None:
            costs = CostModel(self.controllers.verify)
            prior = self.controllers.propose_priors.get(part or self.proposer.name)
            if prior is not None:
                costs.propose_per_token_s = RunningTime.prior(prior, self.controllers.tuning.memory)
            found = self.controllers.chain[key] = AdaptiveController(self.max_k, costs, tuning=self.controllers.tuning)
        if name not in self.begun:
            found.begin()
            self.begun.add(name)
        return found

    def _name(self, part: Optional[str]) -> str:
        assert self.proposer is not None
        return self.proposer.name if part is None else f"{self.proposer.name}:{part}"
