"""Grammar-guided drafts (proposers/grammar.py): forced tokens, the lookup's free parts cut where the grammar refuses
them, forced tokens again after them, in chains and trees; a drawn draft keeps its distribution and the tokens after
it get one-hot rows. The grammar here is a toy one (a template of forced and free positions) so every expected draft
can be written down; tests/test_structured.py runs the real one through the engine."""

from __future__ import annotations

import numpy as np
import torch

from localspec.config import SamplingParams
from localspec.proposers import NgramProposer
from localspec.proposers.base import Draft, DraftNoise, Proposer
from localspec.proposers.grammar import FORCED_PART, LOOKUP_PART, GrammarGuidedProposer

FREE = None  # a template position where any token from FREE_TOKENS may come
FREE_TOKENS = range(10, 20)
SAMPLING = SamplingParams(temperature=0.0)
NOISE = DraftNoise(torch.Generator())


class Template:
    """Answers of the template's shape: a forced position takes its token only, a free one any of FREE_TOKENS."""

    def __init__(self, template: list) -> None:
        self.template, self.done = template, 0  # done: the positions the answer has committed

    def allowed_length(self, path) -> int:
        for i, token in enumerate(path):
            at = self.done + i
            want = self.template[at] if at < len(self.template) else -1
            if not (token == want if want is not FREE else token in FREE_TOKENS):
                return i
        return len(path)

    def forced(self, after=()) -> list[int]:
        if self.allowed_length(after) < len(after):
            return []
        out = []
        for want in self.template[self.done + len(after) :]:
            if want is FREE:
                break
            out.append(want)
        return out

    def commit(self, tokens) -> None:
        self.done += len(tokens)


class Fixed(Proposer):
    """The entry's proposer: drafts the same tokens (with a distribution when given one) after any context."""

    name = "fixed"

    def __init__(self, tokens: list[int], probs: torch.Tensor | None = None) -> None:
        self.tokens, self.probs, self.asked = tokens, probs, 0

    def propose(self, context_ids, k, sampling, noise):
        self.asked += 1
        probs = None if self.probs is None else self.probs[:k]
        return Draft(self.tokens[:k], probs)


def guided(template: list, inner: Proposer, prompt: list[int]) -> GrammarGuidedProposer:
    proposer = GrammarGuidedProposer(Template(template), inner, NgramProposer(1, 4))
    proposer.begin(prompt, None)
    return proposer


def test_forced_then_the_lookups_value_cut_by_the_grammar_then_forced_again():
    # the request holds "… 7 11 12 13 99": the answer's 7 is followed by the lookup's 11 12 13 (99 is no value)
    prompt = [5, 7, 11, 12, 13, 99]
    proposer = guided([1, 7, FREE, FREE, FREE, 2, 3, FREE], Fixed([]), prompt)
    assert proposer.part(prompt) == FORCED_PART
    draft = proposer.propose(prompt, 8, SAMPLING, NOISE)
    assert draft.token_ids == [1, 7, 11, 12, 13, 2, 3] and draft.probs is None


def test_k_caps_the_whole_chain_and_nothing_forced_asks_the_lookup_first():
    prompt = [5, 11, 12, 13]
    proposer = guided([FREE, FREE, FREE, 4], Fixed([19, 19]), prompt)
    context = prompt + [11]  # the answer so far: the lookup continues its 11 with 12 13
    proposer.grammar.commit([11])
    assert proposer.part(context) == LOOKUP_PART
    assert proposer.propose(context, 2, SAMPLING, NOISE).token_ids == [12, 13]
    assert proposer.inner.asked == 0


def test_without_a_match_the_entrys_proposer_drafts_and_forced_tokens_follow_with_one_hot_rows():
    vocab = 24
    probs = torch.softmax(torch.randn(3, vocab), dim=-1)
    inner = Fixed([15, 16, 99], probs)  # 99: refused by the grammar, cut with its row
    proposer = guided([FREE, FREE, 3, 4], inner, [5, 6])
    assert proposer.part([5, 6]) == "fixed"
    draft = proposer.propose([5, 6], 6, SAMPLING, NOISE)
    assert draft.token_ids == [15, 16, 3, 4]
    assert draft.probs is not None and draft.probs.shape == (4, vocab)
    assert torch.equal(draft.probs[:2], probs[:2])
    assert draft.probs[2, 3] == 1 and draft.probs[3, 4] == 1 and float(draft.probs[2:].sum()) == 2


def test_a_draft_the_grammar_refuses_from_its_first_token_drafts_nothing():
    proposer = guided([FREE, 1], Fixed([99, 98]), [5, 6])
    assert proposer.propose([5, 6], 4, SAMPLING, NOISE).token_ids == []


def test_tree_the_forced_trunk_the_lookups_branches_the_grammar_allows_and_forced_after_the_first_branch():
    # 7 was followed by 11 12 and, once, by 13 99 in the request: two branches after the trunk; 99 is refused
    prompt = [7, 13, 99, 5, 7, 11, 12, 6]
    proposer = guided([1, 7, FREE, FREE, 2, 3], Fixed([]), prompt)
    tree = proposer.propose_tree(prompt, 9, SAMPLING, NOISE)
    paths = {tuple(tree.token_ids[a] for a in tree.ancestors(node)) for node in range(tree.size)}
    assert (1, 7, 11, 12, 2, 3) in paths  # the first branch (most recent occurrence) and the forced tokens after it
    assert (1, 7, 13) in paths and not any(99 in path for path in paths)
    assert tree.size <= 9


def test_the_lookup_reads_each_context_it_is_asked_about_not_a_stale_one_of_the_same_length():
    lookup = NgramProposer(1, 4)
    answer = [1, 2, 3, 9, 1, 2]
    lookup.begin(answer, None)
    assert lookup.propose(answer + [7], 2, SAMPLING, NOISE).token_ids == []  # a context ending in a draft
    lookup.on_verified(0, [3], None)
    answer.append(3)
    # the answer and a draft: as long as the stale "answer + [7] + [3]", but it ends "3 9", which follows 2 3 9
    assert lookup.propose(answer + [9], 4, SAMPLING, NOISE).token_ids == [1, 2, 3, 9]
    assert lookup.propose(answer, 2, SAMPLING, NOISE).token_ids == [9, 1]
    assert np.array_equal(lookup._context.array, answer)


def test_forced_rows_allow_the_tokenizers_own_split_only(tiny_session):
    from localspec.runtime.logits_processors import chain_paths
    from localspec.structured.grammar import json_schema_constraint
    from tests.test_structured import SCHEMA

    processor = tiny_session.grammars.processor(json_schema_constraint(SCHEMA, "response_format"))
    forced = processor.forced()
    assert len(forced) >= 2  # '{"name": "' is forced
    rows = processor.process(torch.zeros(3, tiny_session.vocab_size), chain_paths(forced[:2]))
    for row in range(3):
        allowed = torch.isfinite(rows[row]).nonzero().flatten().tolist()
        assert allowed == [forced[row]] if row < len(forced) else len(allowed) > 1
