"""Adaptive token trees: pick each step's shape (plain, a chain of K, or a tree of N nodes) from measured costs and
acceptance, the one with the highest predicted speedup, and switch speculation off when none beats plain decoding.

Model, in units of one plain step (a 1-token target forward + sampling), as the chain's (adaptive.py):
  tokens(N)  = 1 + A(N)                      A(N): accepted nodes per step of a tree of N nodes
  cost(N)    = (p(N) + t(N + 1)) / t(1)      p(N): seconds to propose it; t(rows): seconds to verify `rows` rows
  speedup(N) = tokens(N) / cost(N)
A(N) is a mean with exponential forgetting shrunk towards a prior worth `prior_weight` steps: an optimistic guess
from the chain's current acceptance (see _prior), so each size is tried before its own numbers decide. A chain step
ages the trees' evidence too (Tuning.age, slower): a size not chosen lately drifts back to the guess, which follows
the text, and is tried again. Without it one bad stretch would shut a size out for the rest of the session, since
a shape that never runs is never measured again. Answers carry their evidence on to the next.
The chain option's speedup is the chain controller's best K; both share one CostModel, whose verify seconds are
keyed by rows verified (the same forward for a chain and a tree). Pure Python, unit-tested with synthetic numbers.
"""

from __future__ import annotations

from localspec.runtime.speedup import expected_tokens

from .adaptive import AdaptiveController, OnOffSwitch, RunningTime, Tuning, _RecentMedian
from .metrics import PauseReason
from .plan import Shape

TREE_SIZES = (4, 8, 16)  # the tree sizes tried below the configured one
Choice = tuple[Shape, int]  # ("plain", 0), ("chain", K) or ("tree", N)


def tree_sizes(tree_nodes: int) -> tuple[int, ...]:
    """The tree sizes adaptive chooses among: TREE_SIZES below tree_nodes, and tree_nodes itself."""
    if tree_nodes <= 0:
        return ()
    return tuple(sorted({n for n in TREE_SIZES if n < tree_nodes} | {tree_nodes}))


class TreeSizeController(OnOffSwitch):
    """Asked by the engine for the step's shape before each step; told a tree step's outcome after (chain and plain
    steps are told to the chain controller, whose costs it shares). Switching off and probing work as in the chain
    controller: below `off_below` plain steps, with a probe of the best option spaced to spend at most
    `probe_budget` of the time; back on above `on_above`."""

    def __init__(
        self,
        chain: AdaptiveController,
        tree_nodes: int,
        tuning: Tuning = Tuning(),
    ) -> None:
        if tree_nodes < 1:
            raise ValueError("tree_nodes must be ≥ 1")
        self.chain = chain
        self.costs = chain.costs
        self.sizes = tree_sizes(tree_nodes)
        self.tuning = tuning
        self.propose_s = {n: RunningTime(tuning.memory) for n in self.sizes}
        self.depth = {n: _RecentMedian() for n in self.sizes}  # the depth of the trees the proposer drafted
        self.steps = {n: 0.0 for n in self.sizes}  # decayed count of tree steps of size n
        self.accepted = {n: 0.0 for n in self.sizes}  # … and of the nodes they accepted
        self.speculating = True
        self._options: tuple[tuple, dict[Choice, float], tuple[Choice, float]] | None = None  # as of a state
        self.begin()

    def begin(self) -> None:
        """A new answer: keep the costs and the (decayed) acceptance evidence; reset the on/off state's counters."""
        self.steps_off = 0
        self.probing = self.measuring_plain = self.rested = False
        self.due_every = 0  # the answer's first step evaluates its options

    def _forget(self, factor: float) -> None:
        for m in self.sizes:
            self.steps[m] *= factor
            self.accepted[m] *= factor

    # -- estimates -------------------------------------------------------------------------------------------------
    def _prior(self, n: int) -> float:
        """An optimistic guess, so that every size gets tried and its own numbers take over: the chain's current
        acceptance with two tries per depth (1 - (1 - a)²) down to the depth of the trees of n nodes the proposer
        drafted (log2(n) + 1 before one was drafted; a lookup's single long match goes deeper), and at least what
        a smaller measured size accepts."""
        depth = round(self.depth[n].value) if self.depth[n].count else n.bit_length()
        rates = self.chain.acceptance()
        rates = [1 - (1 - a) ** 2 for a in rates + rates[-1:] * max(depth - len(rates), 0)]
        guess = expected_tokens(rates, depth) - 1.0
        smaller = [self.accepted_per_step(m) for m in self.sizes if m < n and self.steps[m] > 0]
        return max([guess] + smaller)

    def accepted_per_step(self, n: int) -> float:
        """A(n): accepted nodes per tree step of n nodes (the measured mean shrunk towards its prior)."""
        weight = self.tuning.prior_weight
        return (self.accepted[n] + weight * self._prior(n)) / (self.steps[n] + weight)

    def proposal_s(self, n: int) -> float:
        """p(n): the measured median; unmeasured, the nearest measured size's (a tree's proposal grows with its
        depth, not its node count); none measured, the chain's per-token cost times a depth of log2(n) + 1."""
        if self.propose_s[n].count:
            return self.propose_s[n].value
        measured = [m for m in self.sizes if self.propose_s[m].count]
        if measured:
            return self.propose_s[min(measured, key=lambda m: abs(m - n))].value
        per_token = self.costs.propose_per_token_s
        return per_token.value * n.bit_length() if per_token.count else 0.0

    def cost(self, n: int) -> float:
        """cost(n) in plain steps; the prior verify shape before anything is measured."""
        plain = self.costs.plain_time()
        verify = self.costs.verify_ratio(n + 1)
        if plain is None or plain <= 0 or verify is None:
            return 1 + self.costs.verify.prior_slope * n
        return self.proposal_s(n) / plain + verify

    def predicted(self, n: int) -> float:
        """Predicted speedup of a tree of n nodes (one of self.sizes)."""
        return (1.0 + self.accepted_per_step(n)) / self.cost(n)

    def _state(self) -> tuple:
        """What options() and best() depend on: equal states, equal answers."""
        measured = tuple((self.propose_s[n].count, self.propose_s[n].value, self.depth[n].count, self.depth[n].value)
                         for n in self.sizes)  # fmt: skip
        mine = (tuple(self.steps.values()), tuple(self.accepted.values()), measured, self.tuning)
        return (mine, self.chain.evidence(), self.costs.state())

    def _evaluated(self) -> tuple[dict[Choice, float], tuple[Choice, float]]:
        """(options, best) as of the current state, computed once per state (the engine asks several times a
        step)."""
        state = self._state()
        if self._options is None or self._options[0] != state:
            k, chain_speedup = self.chain.best()
            found: dict[Choice, float] = {("plain", 0): 1.0, ("chain", k): chain_speedup}
            found.update({("tree", n): self.predicted(n) for n in self.sizes})
            drafting = [(choice, s) for choice, s in found.items() if choice[0] != "plain"]
            best = max(drafting, key=lambda item: (item[1], -self._cost_of(item[0])))
            self._options = (state, found, best)
        return self._options[1], self._options[2]

    def options(self) -> dict[Choice, float]:
        """Every shape this controller chooses among, with its predicted speedup (plain: 1). Shared until the state
        changes: read it, never change it."""
        return self._evaluated()[0]

    def best(self) -> tuple[Choice, float]:
        """The drafting shape (chain or tree) with the highest predicted speedup; ties go to the cheaper."""
        return self._evaluated()[1]

    def _cost_of(self, choice: Choice) -> float:
        if choice[0] == "tree":
            return self.cost(choice[1])
        draft_c, verify = self.costs.ratios(self.chain.max_k)
        return choice[1] * draft_c + verify[choice[1]]

    def probe_every(self, choice: Choice) -> int:
        loss = max(self._cost_of(choice) - 1.0, 0.0)
        return self.tuning.probe_every(loss)

    def _pause_now(self) -> PauseReason:
        """Why speculation is off, in the record of AdaptiveController's (k: the tokens or nodes the best option
        drafts)."""
        (shape, size), speedup = self.best()
        cost = self._cost_of((shape, size))
        drafting = "tree" if shape == "tree" else "chain"
        return PauseReason(drafting, size, cost, speedup * cost, speedup, self.probe_every((shape, size)))

    # -- the two calls the engine makes ----------------------------------------------------------------------------
    def choose(self) -> Choice:
        if self.rest():
            return ("plain", 0)
        choice, speedup = self.best()
        return choice if self.switch(speedup, lambda: self.probe_every(choice)) else ("plain", 0)

    def observe_tree(
        self,
        n: int,
        drafted: int,
        num_accepted: int,
        propose_s: float,
        verify_s: float,
        whole: bool = True,
        depth: int | None = None,
        first_branch: tuple[int, int] | None = None,
    ) -> None:
        """One tree step asked for n nodes: the proposer drafted `drafted` nodes `depth` deep, the target kept
        num_accepted, and the seconds spent proposing and verifying. whole False: the token budget cut the tree,
        so its acceptance says little about a tree of n nodes (only the costs are kept). first_branch: (its
        length, how many of it the target kept) for a greedy step, where the first branch fares exactly as the
        chain of its tokens would: the chain controller learns from it, so the chain option and the trees' prior
        stay current while trees run."""
        self.costs.observe_verify(drafted + 1, verify_s)
        if drafted == 0:
            return
        self.propose_s[n].add(propose_s)
        self.steps_off = 0
        if not whole:
            return
        if depth is not None:
            self.depth[n].add(float(depth))
        if first_branch is not None and first_branch[0] > 0:
            length, kept = first_branch
            self.chain.observe_acceptance(min(length, self.chain.max_k), min(kept, length))
        self._forget(self.tuning.forget)
        self.steps[n] += 1.0
        self.accepted[n] += num_accepted
        if self.probing and self.best()[1] > self.tuning.on_above:
            self.speculating = True

    def observe_chain(self, drafted: int) -> None:
        """A chain or plain step this controller chose (the chain controller is told its outcome). One that drafted
        ages the trees' evidence (tuning.age; a plain step learns nothing, so it ages nothing)."""
        if drafted:
            self.steps_off = 0
            self._forget(self.tuning.age)
        if self.probing and drafted and self.best()[1] > self.tuning.on_above:
            self.speculating = True
