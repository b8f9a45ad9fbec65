"""The tree-size controller's decisions on synthetic costs and acceptances (pure Python), and adaptive trees in the
engine: greedy output equals plain decoding, and the stats keep their K, predicted speedup and pause."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict

import pytest

from localspec.config import SamplingParams, SpecConfig
from localspec.engine.adaptive import AdaptiveController
from localspec.engine.adaptive_tree import TreeSizeController, tree_sizes
from localspec.runtime.speedup import expected_tokens

PLAIN_S = 0.02


def simulate(
    tree_accept: dict[int, float],
    chain_accept: float,
    slope: float,
    propose_s=0.0,
    steps=400,
    seed=0,
    max_k=4,
    tree_nodes=16,
    trees: TreeSizeController | None = None,
):
    """A world where a tree of n nodes accepts each further depth with probability tree_accept[n] (up to depth
    n.bit_length() + 1), a chain accepts each position with chain_accept, verifying r rows costs
    PLAIN_S·(1 + slope·(r - 1)), and a proposal costs propose_s per step. Returns (tokens/s, shapes chosen,
    controller). trees: go on with this controller (a world that changes)."""
    rng = random.Random(seed)
    if trees is None:
        trees = TreeSizeController(AdaptiveController(max_k), tree_nodes)
    chain = trees.chain
    tokens = seconds = 0.0
    shapes: Counter = Counter()
    for _ in range(steps):
        shape, size = trees.choose()
        shapes[shape, size] += 1
        verify = PLAIN_S * (1 + slope * size)
        accepted = 0
        if shape == "tree":
            while accepted < size.bit_length() + 1 and rng.random() < tree_accept[size]:
                accepted += 1
            trees.observe_tree(size, size, accepted, propose_s, verify)
        else:
            while accepted < size and rng.random() < chain_accept:
                accepted += 1
            chain.observe(size, size, accepted, propose_s if size else 0.0, verify)
            trees.observe_chain(size)
        tokens += accepted + 1
        seconds += verify + (propose_s if size else 0.0)
    return tokens / seconds, shapes, trees


def test_the_sizes_tried_are_bounded_by_the_configured_one():
    assert tree_sizes(16) == (4, 8, 16)
    assert tree_sizes(6) == (4, 6)
    assert tree_sizes(3) == (3,)
    assert tree_sizes(32) == (4, 8, 16, 32)
    assert tree_sizes(0) == ()


def test_the_prior_of_an_unmeasured_tree_is_the_chains_acceptance_with_two_tries_per_depth():
    chain = AdaptiveController(4)  # prior acceptance 0.5 per position
    trees = TreeSizeController(chain, 8)
    prior_4 = trees.accepted_per_step(4)
    assert prior_4 == pytest.approx(expected_tokens([0.75] * 3, 3) - 1)
    assert trees.accepted_per_step(8) == pytest.approx(expected_tokens([0.75] * 4, 4) - 1)
    for _ in range(12):
        trees.observe_tree(4, 4, 0, 0.0, PLAIN_S)
    assert trees.accepted_per_step(4) < 0.2 * prior_4  # its own numbers (none accepted) take over
    trees.observe_tree(4, 4, 4, 0.0, PLAIN_S)
    # a bigger tree is expected to accept at least what a smaller measured one does
    assert trees.accepted_per_step(8) >= trees.accepted_per_step(4)


def test_free_verify_rows_and_a_deep_accepting_tree_pick_the_biggest_tree():
    rate, shapes, trees = simulate({4: 0.5, 8: 0.7, 16: 0.85}, chain_accept=0.5, slope=0.0)
    assert shapes.most_common(1)[0][0] == ("tree", 16)
    assert rate > 2.0 / PLAIN_S  # well above plain decoding (1 / PLAIN_S)
    assert trees.predicted(16) > trees.predicted(4)


def test_costly_rows_pick_a_small_tree_or_a_chain():
    """Each row costs half a plain step: a 16-node tree costs 9 plain steps and cannot pay."""
    _, shapes, trees = simulate({4: 0.6, 8: 0.65, 16: 0.7}, chain_accept=0.6, slope=0.5)
    late = shapes
    assert late[("tree", 16)] < 0.1 * sum(late.values())
    assert trees.predicted(16) < trees.predicted(4)


def test_no_acceptance_switches_off_and_probes_within_budget():
    rate, shapes, trees = simulate({4: 0.0, 8: 0.0, 16: 0.0}, chain_accept=0.0, slope=0.15)
    assert shapes[("plain", 0)] > 0.85 * sum(shapes.values())
    assert rate > 0.9 / PLAIN_S  # probes cost little
    reason = trees.pause_reason()
    assert reason is not None and reason.speedup < 1.0 and reason.probe_every >= trees.tuning.min_probe_every
    assert set(asdict(reason)) >= {"k", "cost", "tokens", "speedup", "probe_every"}


def test_near_the_best_fixed_shape():
    """Against every fixed shape in the same world, adaptive reaches ≥ 0.9× the best one."""
    world = ({4: 0.55, 8: 0.7, 16: 0.75}, 0.55, 0.06)
    adaptive, _, _ = simulate(*world, steps=800)
    fixed = []
    for n, accept in world[0].items():
        depth = n.bit_length() + 1
        tokens = expected_tokens([accept] * depth, depth)
        fixed.append(tokens / (PLAIN_S * (1 + world[2] * n)))
    fixed.append(expected_tokens([world[1]] * 4, 4) / (PLAIN_S * (1 + world[2] * 4)))
    fixed.append(1 / PLAIN_S)
    assert adaptive >= 0.9 * max(fixed)


def test_the_engine_runs_adaptive_trees_losslessly_and_reports_them(tiny_models):
    from localspec.engine.loop import Engine
    from localspec.proposers.head import HeadProposer
    from tests.support import HELLO_PROMPT as PROMPT
    from tests.support import make_head

    target, _ = tiny_models
    engine = Engine(target, {2})
    sampling = SamplingParams(max_new_tokens=32, seed=3)
    plain = [t.token_id for e in engine.generate(list(PROMPT), sampling, SpecConfig(proposer="none")) for t in e.tokens]
    spec = SpecConfig(proposer="head", k=3, tree_nodes=8, adaptive=True).validate()
    events = list(engine.generate(list(PROMPT), sampling, spec, HeadProposer(make_head(target, "eagle"))))
    assert all(e.error is None for e in events)
    assert [t.token_id for e in events for t in e.tokens] == plain
    assert len(engine.controllers.tree) == 1
    trees = next(iter(engine.controllers.tree.values()))
    tree_steps = [e for e in events if e.propose_token_num > 3]  # more than a chain of K = 3 could draft
    assert tree_steps, "the controller's prior favours trees at first"
    # the plan says the tree's size; the statistics count a tree per path (k is its depth, metrics.after_step)
    assert all(e.plan.shape == "tree" and e.plan.size in trees.sizes for e in tree_steps)
    assert all(e.stats.predicted_speedup is not None and e.stats.k <= e.plan.size for e in tree_steps)
    assert sum(trees.propose_s[n].count for n in trees.sizes) == len(tree_steps)
    assert trees.costs is engine.controllers.chain[("head", 3, True)].costs  # one cost model per part


def test_a_tree_shut_out_by_a_bad_stretch_is_tried_again_when_the_text_changes():
    """Trees accept nothing for 300 steps, so chains run; then trees accept deeply. The trees' old evidence ages
    on the chain steps too, so they are tried again and win, instead of staying shut out by stale numbers; the
    retries in the bad stretch stay few."""
    _, early, trees = simulate({4: 0.0, 8: 0.0}, chain_accept=0.6, slope=0.02, steps=300, tree_nodes=8)
    assert sum(n for (shape, _), n in early.items() if shape == "tree") < 0.15 * 300
    _, late, trees = simulate({4: 0.9, 8: 0.95}, chain_accept=0.6, slope=0.02, steps=300, seed=1, trees=trees)
    assert sum(n for (shape, _), n in late.items() if shape == "tree") > 0.6 * 300, late


def test_trees_that_go_deeper_on_code_take_over_from_the_chain():
    """Chat (chains and trees accept little) then code (an 8-node tree accepts deeply, beyond the chain's K)."""
    _, _, trees = simulate({4: 0.3, 8: 0.35}, chain_accept=0.3, slope=0.02, steps=300, tree_nodes=8)
    _, code, trees = simulate({4: 0.85, 8: 0.9}, chain_accept=0.8, slope=0.02, steps=300, seed=1, trees=trees)
    assert sum(n for (shape, _), n in code.items() if shape == "tree") > 0.6 * 300, code


def test_the_depth_of_the_drafted_trees_sets_the_prior():
    """A lookup's tree of 8 nodes can be one 8-deep match: the guess for it goes as deep as the trees drafted."""
    chain = AdaptiveController(4)
    trees = TreeSizeController(chain, 8)
    shallow = trees.accepted_per_step(8)
    trees.observe_tree(8, 8, 0, 0.0, PLAIN_S, depth=8)
    trees.steps[8] = trees.accepted[8] = 0.0  # keep only the depth: the prior alone
    assert trees.accepted_per_step(8) == pytest.approx(expected_tokens([0.75] * 8, 8) - 1)
    assert trees.accepted_per_step(8) > shallow


def test_a_greedy_tree_steps_first_branch_teaches_the_chain():
    """While trees run, the chain controller learns from each tree's first branch (the chain it grew from), so the
    chain option and the trees' prior follow the text; without it they would keep what chains saw last."""
    from localspec.runtime.tree import make_dummy

    assert make_dummy(7, 2).first_branch() == [0, 2, 6]  # the first child at each depth
    chain = AdaptiveController(4)
    trees = TreeSizeController(chain, 8)
    before = chain.acceptance()
    for _ in range(30):
        trees.observe_tree(8, 8, 3, 0.0, PLAIN_S, depth=4, first_branch=(4, 3))  # kept 3 of the first branch's 4
    rates = chain.acceptance()
    assert rates[0] > 0.9 and rates[1] > 0.9 and rates[2] > 0.9 and rates[3] < 0.2
    assert rates != before
    untaught = AdaptiveController(4)
    others = TreeSizeController(untaught, 8)
    for _ in range(30):
        others.observe_tree(8, 8, 3, 0.0, PLAIN_S, depth=4)  # sampled: no first branch, nothing learned
    assert untaught.acceptance() == before


def test_the_remembered_options_follow_every_change_of_the_state():
    rng = random.Random(5)
    trees = TreeSizeController(AdaptiveController(4), 16)
    for step in range(300):
        trees.options()  # remembered as of the state before the step
        shape, size = trees.choose()
        accepted = sum(rng.random() < (0.7 if step < 150 else 0.2) for _ in range(size.bit_length() if size else 0))
        verify = PLAIN_S * (1 + 0.1 * size)
        if shape == "tree":
            trees.observe_tree(size, size, accepted, 3e-4, verify, depth=size.bit_length())
        else:
            trees.chain.observe(size, size, min(accepted, size), 2e-4 if size else 0.0, verify)
            trees.options()  # remembered between the chain's sample and the trees' ageing, which samples nothing
            trees.observe_chain(size)
        remembered = dict(trees.options()), trees.best()
        trees._options = None  # computed afresh
        trees.chain._acceptance = trees.chain._speedups = None
        assert remembered == (trees.options(), trees.best())
