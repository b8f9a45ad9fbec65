"""'ngram+head': n-gram lookup when it matches, the head otherwise. Greedy output equals the target alone, both sides
really draft, the head keeps up while the lookup drafts, and sampled output has the target's distribution."""

from __future__ import annotations

import pytest
import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.proposers import LookupFirstProposer, NgramProposer
from localspec.proposers.base import Proposer
from localspec.proposers.head import HeadProposer
from tests.stats import chi_square_p
from tests.support import HELLO_HELLO_PROMPT, make_head

# "Hello, w" then "Hello" again: the lookup matches at once, and stops matching once the answer wanders off
PROMPT = HELLO_HELLO_PROMPT


class Counting(Proposer):
    """Wraps a proposer and counts the steps it was asked to draft and those where it returned a draft."""

    def __init__(self, inner) -> None:
        self.inner, self.asked, self.drafts = inner, 0, 0
        self.name, self.wants_hidden = inner.name, inner.wants_hidden

    def begin(self, prompt_ids, prompt_hidden):
        self.inner.begin(prompt_ids, prompt_hidden)

    def propose(self, context_ids, k, sampling, generator):
        draft = self.inner.propose(context_ids, k, sampling, generator)
        self.asked += k > 0
        self.drafts += bool(draft.token_ids)
        return draft

    def on_verified(self, num_accepted, emitted_ids, target_hidden):
        self.inner.on_verified(num_accepted, emitted_ids, target_hidden)


def generate(target, proposer, k=3, temperature=0.0, max_new=40, seed=3, prompt=PROMPT, stop=frozenset({2})):
    engine = Engine(target, set(stop))
    spec = SpecConfig(proposer="none" if proposer is None else "ngram+head", k=k)
    ids = []
    for event in engine.generate(
        list(prompt), SamplingParams(temperature=temperature, max_new_tokens=max_new, seed=seed), spec, proposer
    ):
        assert event.finish_reason != "error", event.error
        ids.extend(t.token_id for t in event.tokens)
    return ids


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_greedy_is_lossless_and_both_sides_draft(tiny_models, kind):
    target, _ = tiny_models
    baseline = generate(target, None)
    for k in (1, 3):
        lookup = Counting(NgramProposer(2, 4))
        head = Counting(HeadProposer(make_head(target, kind, modules=3 if kind == "mtp" else 1)))
        combined = LookupFirstProposer(lookup, head)
        assert combined.name == "ngram+head" and combined.wants_hidden
        assert generate(target, combined, k=k) == baseline
        assert lookup.drafts > 0 and head.drafts > 0
        # the head was told every verified token while the lookup drafted: it could draft every time it was asked
        assert head.drafts == head.asked


@pytest.mark.slow  # thousands of sampled answers for the chi-square test
def test_sampled_output_has_the_target_distribution(tiny_models):
    """First two tokens over many seeds against the target's exact joint distribution of those two tokens."""
    target, _ = tiny_models
    head = make_head(target, "eagle")
    prompt = PROMPT
    with torch.inference_mode():
        first_probs = torch.softmax(target(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)  # [V]
        top_first = torch.topk(first_probs, 4).indices.tolist()
        rows = torch.tensor([prompt + [t] for t in top_first])
        second_probs = torch.softmax(target(input_ids=rows).logits[:, -1].float(), -1)  # [4, V]
    joint = first_probs[top_first, None] * second_probs  # [4, V]: P(t1, t2) for the 4 likeliest t1
    cells = [(a, b) for i, a in enumerate(top_first) for b in torch.topk(joint[i], 3).indices.tolist()]
    expected = [float(joint[top_first.index(a), b]) for a, b in cells]
    counts = [0] * (len(cells) + 1)  # the last cell: everything else
    runs = 800
    for seed in range(runs):
        proposer = LookupFirstProposer(NgramProposer(1, 4), HeadProposer(head))
        ids = generate(target, proposer, k=2, temperature=1.0, max_new=2, seed=seed, stop=())
        pair = (ids[0], ids[1])
        counts[cells.index(pair) if pair in cells else -1] += 1
    expected_probs = torch.tensor(expected + [1 - sum(expected)])
    assert chi_square_p(torch.tensor(counts), expected_probs) > 1e-3


def test_the_pair_offers_it_only_with_both_parts(tiny_session):
    assert "ngram+head" not in tiny_session.proposers  # the tiny pair has no head
    with pytest.raises(ConfigError, match="has no 'ngram\\+head' proposer"):
        tiny_session.make_proposer(SpecConfig(proposer="ngram+head"))


def test_a_pair_with_a_head_builds_it_with_a_two_token_lookup(tiny_pair, tiny_models, tmp_path):
    """models.yaml with an n-gram proposer and a head offers ngram+head; its lookup needs a match of ≥ 2 tokens
    (a 1-token match is a weaker guess than the head's), unless the entry's max_n is 1."""
    from localspec.chat import ChatSession
    from localspec.heads.io import save_head
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    target, _ = tiny_models
    save_head(make_head(target, "eagle"), tmp_path / "head")
    yaml_path = tmp_path / "models.yaml"
    yaml_path.write_text(
        f"- name: with-head\n  target: {{source: {tiny_pair['target']}, quant: none, dtype: float32}}\n"
        f"  proposers:\n    ngram: {{min_n: 1, max_n: 4}}\n    head: {tmp_path / 'head'}\n"
    )
    session = ChatSession(load_pair(load_registry(yaml_path)[0], device="cpu"))
    assert session.proposers == ("none", "ngram", "head", "ngram+head", "history", "history+head")
    proposer = session.make_proposer(session.default_spec(proposer="ngram+head"))
    assert isinstance(proposer, LookupFirstProposer) and proposer.name == "ngram+head"
    assert (proposer.lookup.min_n, proposer.lookup.max_n) == (2, 4)
    only_unigrams = session.make_proposer(session.default_spec(proposer="ngram+head", ngram_min=1, ngram_max=1))
    assert (only_unigrams.lookup.min_n, only_unigrams.lookup.max_n) == (1, 1)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=24)
    ids = list(PROMPT)
    base = [t.token_id for e in session.engine.generate(ids, sampling, SpecConfig(proposer="none")) for t in e.tokens]
    spec = session.default_spec(proposer="ngram+head", k=3)
    out = [t.token_id for e in session.engine.generate(ids, sampling, spec, proposer) for t in e.tokens]
    assert out == base


def test_adaptive_k_keeps_one_controller_per_part(tiny_models):
    """The lookup and the head differ in cost and acceptance: adaptive K learns each on its own steps."""
    target, _ = tiny_models
    engine = Engine(target, {2})
    baseline = generate(target, None)
    proposer = LookupFirstProposer(NgramProposer(2, 4), HeadProposer(make_head(target, "eagle")))
    spec = SpecConfig(proposer="ngram+head", k=4, adaptive=True)
    ids = [
        t.token_id
        for e in engine.generate(list(PROMPT), SamplingParams(max_new_tokens=40, seed=3), spec, proposer)
        for t in e.tokens
    ]
    assert ids == baseline
    parts = {key[0]: controller for key, controller in engine.controllers.chain.items()}
    assert set(parts) == {"ngram+head:ngram", "ngram+head:head"}
    assert all(sum(controller.reached) > 0 for controller in parts.values())  # each saw its own drafted steps
    lookup, head = parts["ngram+head:ngram"], parts["ngram+head:head"]
    assert lookup.costs.propose_per_token_s.value < head.costs.propose_per_token_s.value
    assert lookup.costs.verify is head.costs.verify is engine.controllers.verify  # the target's: one record
