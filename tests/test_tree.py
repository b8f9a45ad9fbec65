"""Token trees: the mask and positions, the tree forward against per-path chain forwards, the cache compaction,
greedy identity with plain decoding, the sampled tree's emitted distribution (chi-square), and the head's tree."""

from __future__ import annotations

import pytest
import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.engine.events import TokenEvent
from localspec.engine.loop import Engine
from localspec.engine.tokens import tree_token_events
from localspec.proposers.head import HeadProposer
from localspec.runtime.model_runner import ModelRunner
from localspec.runtime.sampling import logits_to_probs
from localspec.runtime.tree import TokenTree, make_dummy, tree_attention_mask, tree_positions
from localspec.ui.spans import token_record, token_title
from localspec.verify.one_hot import verify_one_hot
from localspec.verify.tree import TreeDraws, make_tree_draws, verify_tree
from localspec.verify.types import SamplerDraws

from .stats import chi_square_p
from .support import HELLO_PROMPT as PROMPT
from .support import make_head

# root → 0 (a), 1 (b); 0 → 2 (c), 3 (d); 2 → 4 (e)
TREE = TokenTree([10, 11, 12, 13, 14], [-1, -1, 0, 0, 2])
PROMPTS = [PROMPT, [1, 200, 17, 99, 50, 51]]


def test_tree_structure_mask_and_positions():
    assert TREE.depth == [1, 1, 2, 2, 3]
    assert TREE.children == [[0, 1], [2, 3], [], [4], [], []]
    assert TREE.ancestors(4) == [0, 2, 4]
    mask = tree_attention_mask(TREE, 3, torch.float32)
    assert mask.shape == (1, 1, 6, 9)
    visible = (mask[0, 0] == 0).int()
    expected_tree = [  # rows: pending, a, b, c, d, e; columns the same
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ]
    assert visible[:, :3].tolist() == [[1, 1, 1]] * 6  # the whole prefix
    assert visible[:, 3:].tolist() == expected_tree
    assert (mask[0, 0][visible == 0] == torch.finfo(torch.float32).min).all()
    assert torch.equal(tree_attention_mask(TREE, 3, torch.bool)[0, 0], visible.bool())
    assert tree_positions(TREE, 3).tolist() == [[3, 4, 4, 5, 5, 6]]
    assert TokenTree.chain([5, 6, 7]).parents == [-1, 0, 1]
    assert TREE.within_depth(2).token_ids == [10, 11, 12, 13]
    assert make_dummy(6, 2).parents == [-1, -1, 0, 0, 1, 1]


def test_a_parent_after_its_child_is_refused():
    with pytest.raises(ValueError, match="earlier node"):
        TokenTree([1, 2], [1, -1])


def _chain_runner(target, ids: list[int]) -> ModelRunner:
    runner = ModelRunner(target)
    runner.reset()
    runner.extend(ids)
    return runner


@pytest.fixture(params=["sdpa", "eager"])
def attention(request, tiny_models):
    """The tiny target under each attention implementation (sdpa gets a bool tree mask, eager an additive one)."""
    target, _ = tiny_models
    target.set_attn_implementation(request.param)
    yield target
    target.set_attn_implementation("sdpa")


def test_tree_forward_equals_a_chain_forward_of_each_path(attention):
    target = attention
    runner = _chain_runner(target, PROMPT[:-1])
    out = runner.extend_tree(PROMPT[-1], TREE, want_hidden=True)
    assert out.logits.shape == (TREE.size + 1, target.config.vocab_size)
    for leaf in (1, 3, 4):
        path = TREE.ancestors(leaf)
        chain = _chain_runner(target, PROMPT[:-1]).extend(
            [PROMPT[-1]] + [TREE.token_ids[i] for i in path], want_hidden=True
        )
        rows = [0] + [i + 1 for i in path]
        torch.testing.assert_close(out.logits[rows], chain.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.hidden[rows], chain.hidden, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", [[], [1], [0, 2, 4], [0, 3]])
def test_keep_path_leaves_the_cache_of_a_plain_forward_of_the_path(tiny_models, path):
    target, _ = tiny_models
    runner = _chain_runner(target, PROMPT[:-1])
    prefix_len = len(runner.tokens)
    runner.extend_tree(PROMPT[-1], TREE)
    runner.keep_path(prefix_len, [0] + [i + 1 for i in path])
    kept = PROMPT + [TREE.token_ids[i] for i in path]
    assert runner.tokens == kept
    assert runner.cache.get_seq_length() == len(kept)
    got = runner.extend([7, 8]).logits
    expected = _chain_runner(target, kept).extend([7, 8]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _generate(target, spec: SpecConfig, proposer, prompt, temperature=0.0, max_new=32, runner=None):
    engine = Engine(target, {2})
    if runner is not None:
        engine.target = runner
    ids, events = [], []
    for event in engine.generate(
        list(prompt), SamplingParams(temperature, max_new_tokens=max_new, seed=3), spec, proposer
    ):
        assert event.error is None, event.error
        ids.extend(t.token_id for t in event.tokens)
        events.append(event)
    return ids, events


@pytest.mark.parametrize("nodes", [1, 3, 8])
def test_greedy_tree_decoding_equals_plain_decoding(tiny_models, nodes):
    target, _ = tiny_models
    head = make_head(target, "eagle")
    for prompt in PROMPTS:
        plain, _ = _generate(target, SpecConfig(proposer="none"), None, prompt)
        got, events = _generate(target, SpecConfig(proposer="head", tree_nodes=nodes), HeadProposer(head), prompt)
        assert got == plain
        stats = events[-1].stats
        assert stats.drafted > 0 and stats.emitted == len(plain)
        assert max(e.propose_token_num for e in events) <= nodes
        assert stats.target_forwards == len(events)


def test_sampled_tree_decoding_is_reproducible_and_reports_top_logprobs(tiny_models):
    target, _ = tiny_models
    head = make_head(target, "eagle")
    spec = SpecConfig(proposer="head", tree_nodes=6)
    runs = []
    for _ in range(2):
        engine = Engine(target, {2})
        sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5, top_logprobs=2)
        events = list(engine.generate(list(PROMPT), sampling, spec, HeadProposer(head)))
        assert all(e.error is None for e in events)
        tokens = [t for e in events for t in e.tokens]
        assert len(tokens) == 24 and all(t.top_logprobs is not None and len(t.top_logprobs) == 2 for t in tokens)
        assert max(e.propose_token_num for e in events) > 1  # trees were drafted
        runs.append([t.token_id for t in tokens])
    assert runs[0] == runs[1]


def test_a_target_without_the_preallocated_cache_runs_chains(tiny_models):
    target, _ = tiny_models
    runner = ModelRunner(target, cache="dynamic")
    assert not runner.supports_tree
    plain, _ = _generate(target, SpecConfig(proposer="none"), None, PROMPT)
    spec = SpecConfig(proposer="head", k=3, tree_nodes=8)
    got, events = _generate(target, spec, HeadProposer(make_head(target, "eagle")), PROMPT, runner=runner)
    assert got == plain
    assert max(e.propose_token_num for e in events) <= 3  # chains of K = 3, never 8 nodes


def _peaked_logits(rows: list[int], vocab: int = 20) -> torch.Tensor:
    logits = torch.full((len(rows), vocab), -4.0)
    for row, token in enumerate(rows):
        logits[row, token] = 4.0
    return logits


def test_greedy_takes_the_second_branch_when_it_is_right():
    # the target's argmax: 11 after the pending token (node b, branch 1), then 5 after b (b is a leaf: bonus)
    logits = _peaked_logits([11, 12, 5, 0, 0, 0])
    verdict = verify_tree(logits, TREE, SamplingParams(), None)
    assert verdict.path == [1] and verdict.branches == [1] and verdict.emitted == [11, 5]
    assert verdict.rows == [0, 2] and verdict.rejected is None
    tokens = tree_token_events(verdict, TREE)
    assert [(t.kind, t.branch) for t in tokens] == [("accepted", 1), ("bonus", 0)]
    assert "branch 1" in token_title(token_record(tokens[0]))
    assert "branch" not in token_title(token_record(TokenEvent.accepted(11, 0.9, 1.0)))


def test_greedy_walks_the_first_branch_and_recovers():
    # a (branch 0) → c (branch 0) → e expected, but the target says 9 at c's row: 9 is recovered, e rejected
    logits = _peaked_logits([10, 12, 0, 9, 0, 0])
    verdict = verify_tree(logits, TREE, SamplingParams(), None)
    assert verdict.path == [0, 2] and verdict.emitted == [10, 12, 9] and verdict.branches == [0, 0]
    assert verdict.rejected[0] == 14
    assert [t.kind for t in tree_token_events(verdict, TREE)] == ["accepted", "accepted", "resampled"]


@pytest.fixture
def one_thread():
    """Thousands of tiny verifications: one torch thread (on a shared machine, waking a second costs ms per op)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sampled_tree_logits(seed: int, vocab: int = 12) -> torch.Tensor:
    """Logits [6, V] that make the tree's tokens likely enough for every branch to be tried often."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(TREE.size + 1, vocab, generator=gen)
    for i, parent in enumerate(TREE.parents):
        logits[parent + 1, TREE.token_ids[i] % vocab] += 1.0
    return logits


SMALL_TREE = TokenTree([t % 12 for t in TREE.token_ids], TREE.parents)  # the same shape in a 12-token vocab


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0), SamplingParams(temperature=1.5, top_p=0.9)],
)
def test_sampled_tree_emits_the_target_distribution(sampling, one_thread):
    """The first emitted token follows p_target at the root; given the walk moved to node a, the second follows
    p_target at a's row (a has children: an accepted child, or the recovered token from the residual)."""
    logits = _sampled_tree_logits(1)
    probs = logits_to_probs(logits, sampling)  # [6, V]
    gen = torch.Generator().manual_seed(7)
    first, second = torch.zeros(12), torch.zeros(12)
    for _ in range(10000):
        verdict = verify_tree(logits, SMALL_TREE, sampling, make_tree_draws(gen, SMALL_TREE.size, 12, "cpu"))
        first[verdict.emitted[0]] += 1
        if verdict.path[:1] == [0]:
            second[verdict.emitted[1]] += 1
    assert second.sum() > 800
    assert chi_square_p(first, probs[0]) > 1e-4
    assert chi_square_p(second, probs[1]) > 1e-4


def test_the_chi_square_check_catches_a_sampler_that_skips_renormalising():
    """Accepting the second child with p(c2) instead of p(c2) / (1 - p(c1)) emits it too rarely: caught."""
    a, b = SMALL_TREE.token_ids[0], SMALL_TREE.token_ids[1]
    logits = _sampled_tree_logits(1)
    logits[0, a] += 2.0  # a likely first child: the second is tried less often, and wrongly
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0))
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(12)
    for _ in range(6000):
        u = torch.rand(2, generator=gen).tolist()
        if u[0] < probs[0, a]:
            counts[a] += 1
        elif u[1] < probs[0, b]:  # the wrong rule
            counts[b] += 1
        else:
            residual = probs[0].clone()
            residual[[a, b]] = 0
            counts[int(torch.multinomial(residual, 1, generator=gen))] += 1
    assert chi_square_p(counts, probs[0]) < 1e-4


def test_a_tree_accepts_at_least_what_its_first_branch_does_as_a_chain(one_thread):
    """The tree's first-child path is the chain; with the chain's rows given the same positions' noise (both verify
    one-hot drafts by the target's own draw), the tree keeps every token the chain keeps (and sometimes more,
    through a second branch)."""
    sampling = SamplingParams(temperature=1.0)
    vocab, chain_nodes = 12, [0, 2, 4]  # a → c → e
    chain_ids = torch.tensor([[SMALL_TREE.token_ids[i] for i in chain_nodes]])
    gen = torch.Generator().manual_seed(11)
    more = 0
    for trial in range(300):
        logits = _sampled_tree_logits(100 + trial)
        draws = make_tree_draws(gen, SMALL_TREE.size, vocab, "cpu")
        tree_verdict = verify_tree(logits, SMALL_TREE, sampling, draws)
        chain_logits = logits[[0] + [i + 1 for i in chain_nodes]][None]  # [1, 4, V]
        rows = [0] + [i + 1 for i in chain_nodes]
        chain_draws = SamplerDraws(uniforms=draws.uniforms[chain_nodes][None], noise=draws.noise[rows][None])
        chain = verify_one_hot(chain_logits, chain_ids, None, sampling, chain_draws)
        chain_accepted = int(chain.num_accepted[0])
        assert tree_verdict.num_accepted >= chain_accepted
        more += tree_verdict.num_accepted > chain_accepted
    assert more > 10


def test_same_tree_draws_same_tokens():
    logits = _sampled_tree_logits(3)
    draws = make_tree_draws(torch.Generator().manual_seed(5), SMALL_TREE.size, 12, "cpu")
    a = verify_tree(logits, SMALL_TREE, SamplingParams(temperature=1.0), draws)
    b = verify_tree(logits, SMALL_TREE, SamplingParams(temperature=1.0), draws)
    assert a == b
    assert isinstance(draws, TreeDraws) and draws.noise.shape == (6, 12)


@pytest.mark.parametrize("kind,modules", [("eagle", 1), ("eagle3", 1), ("mtp", 3)])
def test_head_tree_is_ancestor_closed_and_rolls_back(tiny_models, kind, modules):
    target, _ = tiny_models
    head = make_head(target, kind, modules)
    runner = ModelRunner(target)
    runner.reset()
    hidden = runner.extend(PROMPT[:-1], want_hidden=True).hidden  # [len - 1, F] the prompt's features
    proposer = HeadProposer(head)
    proposer.begin(PROMPT, hidden[: len(PROMPT) - 1])
    sampling = SamplingParams()
    chain = proposer.propose(PROMPT, 3, sampling, torch.Generator())
    lengths = [cache.length for cache in proposer.caches]
    for nodes in (1, 4, 8):
        tree = proposer.propose_tree(PROMPT, nodes, sampling, torch.Generator())
        assert tree.size == nodes
        assert all(p < i for i, p in enumerate(tree.parents))
        assert tree.token_ids[0] == chain.token_ids[0]  # the most probable first token comes first
        siblings = [[tree.token_ids[c] for c in kids] for kids in tree.children]
        assert all(len(set(s)) == len(s) for s in siblings)
        assert [cache.length for cache in proposer.caches] == lengths  # the draft rows were cropped
    # the tree's first-child path at 8 nodes follows the chain as long as the chain is the most probable path
    again = proposer.propose(PROMPT, 3, sampling, torch.Generator())
    assert again.token_ids == chain.token_ids


def test_tree_nodes_are_validated_in_one_place():
    with pytest.raises(ConfigError, match="tree nodes"):
        SpecConfig(tree_nodes=33).validate()
    with pytest.raises(ConfigError, match="tree nodes"):
        SpecConfig(tree_nodes=-1).validate()
    assert SpecConfig(tree_nodes=4, adaptive=True).validate().adaptive  # adaptive picks the tree size
    assert SpecConfig(tree_nodes=8).validate().tree_nodes == 8


@pytest.mark.slow
def test_head_tree_on_the_embedded_model_is_within_the_guarantee(embedded_session):
    from tests.conftest import shared_prompts
    from tests.lossless import assert_within_guarantee

    session = embedded_session
    if session.loaded.spec.head is None:
        pytest.skip("the default models.yaml entry names no head")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=48)
    accepted = 0
    for n, prompt in enumerate(shared_prompts(limit_mt=1, limit_code=1)):
        ids, _ = session.prompt_ids([{"role": "user", "content": prompt}], 48)
        plain = session.engine.generate(ids, sampling, SpecConfig(proposer="none"))
        base = [t.token_id for e in plain for t in e.tokens]
        spec = SpecConfig(proposer="head", tree_nodes=8)
        proposer = session.make_proposer(session.default_spec(proposer="head"))
        got, stats = [], None
        for event in session.engine.generate(ids, sampling, spec, proposer):
            got.extend(t.token_id for t in event.tokens)
            stats = event.stats
        assert_within_guarantee(session, ids, base, got, f"prompt {n} head tree of 8", tree=True)
        accepted += stats.accepted
    assert accepted > 0
