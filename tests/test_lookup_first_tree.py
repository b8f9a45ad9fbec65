"""'ngram+head' with token trees: the lookup's tree when the lookup matches the context, the head's otherwise; greedy
output equals plain decoding, and the head keeps up with the answer while the lookup drafts."""

from __future__ import annotations

import pytest
import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.proposers import LookupFirstProposer, NgramProposer
from localspec.proposers.base import Draft, Proposer
from localspec.proposers.head import HeadProposer
from localspec.runtime.tree import TokenTree
from tests.support import HELLO_HELLO_PROMPT as PROMPT
from tests.support import make_head

NO_REPEAT = [1, 200, 17, 99, 50, 51]  # no token twice: the lookup never matches the prompt


class TreeCounting(Proposer):
    """Wraps a proposer; counts the chains and the trees it returned."""

    def __init__(self, inner: Proposer) -> None:
        self.inner, self.chains, self.trees = inner, 0, 0
        self.name, self.wants_hidden, self.supports_tree = inner.name, inner.wants_hidden, inner.supports_tree
        self.feature_layers = tuple(inner.feature_layers)

    def begin(self, prompt_ids, prompt_hidden):
        self.inner.begin(prompt_ids, prompt_hidden)

    def propose(self, context_ids, k, sampling, generator):
        draft = self.inner.propose(context_ids, k, sampling, generator)
        self.chains += k > 1 and bool(draft.token_ids)  # k = 1: the composite's peek
        return draft

    def propose_tree(self, context_ids, n_nodes, sampling, generator):
        tree = self.inner.propose_tree(context_ids, n_nodes, sampling, generator)
        self.trees += tree is not None
        return tree

    def on_verified(self, num_accepted, emitted_ids, target_hidden):
        self.inner.on_verified(num_accepted, emitted_ids, target_hidden)


class BranchingLookup(NgramProposer):
    """An n-gram lookup that offers trees: a wrong first branch (the found token, off by one), then the continuation
    it found as the second branch."""

    supports_tree = True

    def propose_tree(self, context_ids, n_nodes, sampling, generator):
        found = self.propose(context_ids, max(n_nodes - 1, 1), sampling, generator).token_ids
        if not found:
            return None
        wrong = (found[0] + 1) % 256
        return TokenTree([wrong] + found[: n_nodes - 1], [-1, -1] + list(range(1, len(found[: n_nodes - 1]))))


def _generate(target, spec, proposer, prompt=PROMPT, max_new=40):
    engine = Engine(target, {2})
    ids, events = [], []
    for event in engine.generate(list(prompt), SamplingParams(max_new_tokens=max_new, seed=3), spec, proposer):
        assert event.error is None, event.error
        ids.extend(t.token_id for t in event.tokens)
        events.append(event)
    return ids, events


def test_the_composite_offers_trees_when_a_part_does(tiny_models):
    target, _ = tiny_models
    head = HeadProposer(make_head(target, "eagle"))
    assert LookupFirstProposer(NgramProposer(2, 4), head).supports_tree
    assert LookupFirstProposer(BranchingLookup(2, 4), NgramProposer(1, 1)).supports_tree
    chain_only = [NgramProposer(2, 4), NgramProposer(1, 1)]
    for part in chain_only:
        part.supports_tree = False  # the composite reads its parts, not the class
    assert not LookupFirstProposer(*chain_only).supports_tree


@pytest.mark.parametrize("lookup_class", [NgramProposer, BranchingLookup])
@pytest.mark.parametrize("nodes", [4, 8])
def test_greedy_tree_output_equals_plain_decoding(tiny_models, lookup_class, nodes):
    target, _ = tiny_models
    for prompt in (PROMPT, NO_REPEAT):
        plain, _ = _generate(target, SpecConfig(proposer="none"), None, prompt)
        lookup = TreeCounting(lookup_class(2, 4))
        head = TreeCounting(HeadProposer(make_head(target, "eagle")))
        combined = LookupFirstProposer(lookup, head)
        got, events = _generate(target, SpecConfig(proposer="ngram+head", tree_nodes=nodes), combined, prompt)
        assert got == plain
        assert max(e.propose_token_num for e in events) <= nodes
        assert head.trees > 0  # the head drafted trees where the lookup had no match …
        assert head.chains == 0  # … and never fell back to chains: it kept up while the lookup drafted
        if prompt == PROMPT:  # the repeated "Hello" was drafted by the lookup: as its own trees when it has them
            assert (lookup.trees > 0) if lookup.supports_tree else (lookup.chains > 0)


def test_the_lookups_tree_on_a_repeated_context(tiny_models):
    """On a context that repeats, the composite's tree is the lookup's (its own tree when it has trees, else its
    chain as one branch), and the head is not asked; on one that does not, it is the head's tree."""
    target, _ = tiny_models
    head_model = make_head(target, "eagle")
    sampling, generator = SamplingParams(), torch.Generator()
    for lookup_class in (NgramProposer, BranchingLookup):
        lookup, head = TreeCounting(lookup_class(2, 4)), TreeCounting(HeadProposer(head_model))
        combined = LookupFirstProposer(lookup, head)
        combined.begin(PROMPT, None)
        assert combined.part(PROMPT) == "ngram"
        tree = combined.propose_tree(PROMPT, 4, sampling, generator)
        reference = lookup_class(2, 4)
        reference.begin(PROMPT, None)
        if reference.supports_tree:
            expected = reference.propose_tree(PROMPT, 4, sampling, generator)
        else:
            expected = TokenTree.chain(reference.propose(PROMPT, 4, sampling, generator).token_ids)
        assert (tree.token_ids, tree.parents) == (expected.token_ids, expected.parents)
        assert head.trees == 0 and head.chains == 0


def test_the_heads_tree_where_the_lookup_has_no_match(tiny_models):
    from localspec.runtime.model_runner import ModelRunner

    target, _ = tiny_models
    head_model = make_head(target, "eagle")
    runner = ModelRunner(target)
    runner.reset()
    hidden = runner.extend(NO_REPEAT[:-1], want_hidden=True).hidden
    sampling, generator = SamplingParams(), torch.Generator()
    combined = LookupFirstProposer(BranchingLookup(2, 4), HeadProposer(head_model))
    combined.begin(NO_REPEAT, hidden)
    alone = HeadProposer(head_model)
    alone.begin(NO_REPEAT, hidden)
    assert combined.part(NO_REPEAT) == "head"
    tree = combined.propose_tree(NO_REPEAT, 6, sampling, generator)
    expected = alone.propose_tree(NO_REPEAT, 6, sampling, generator)
    assert tree.size == 6 and (tree.token_ids, tree.parents) == (expected.token_ids, expected.parents)


class ChainOnly(Proposer):
    """A model part without trees: a fixed chain."""

    name = "fixed"

    def propose(self, context_ids, k, sampling, generator):
        return Draft(token_ids=[5, 6, 7, 8, 9][:k])


def test_a_part_without_trees_offers_its_chain_as_one_branch():
    combined = LookupFirstProposer(BranchingLookup(2, 4), ChainOnly())
    combined.begin(NO_REPEAT, None)
    tree = combined.propose_tree(NO_REPEAT, 3, SamplingParams(), torch.Generator())
    assert (tree.token_ids, tree.parents) == ([5, 6, 7], [-1, 0, 1])
