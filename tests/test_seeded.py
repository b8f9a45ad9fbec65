"""Seeded sampling that speculation cannot change: every draw keyed to (seed, output position), one-hot drafts
(n-gram chains, token trees) verified by the target's own draw, on the tiny pair with exact forwards."""

from __future__ import annotations

import pytest
import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.proposers import NgramProposer
from localspec.verify.one_hot import verify_one_hot
from localspec.verify.reference import rejection_sample
from localspec.verify.types import position_draws

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=32, seed=42)


@pytest.fixture(scope="module")
def engine(tiny_models):
    target, _ = tiny_models
    return Engine(target, exact=True)


def _prompt(engine) -> list[int]:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, engine.target.vocab_size, (24,), generator=generator).tolist()
    return ids * 3  # repeats: the n-gram lookup drafts


def answer(engine, spec: SpecConfig, sampling: SamplingParams = SAMPLED) -> list[int]:
    proposer = None if spec.proposer == "none" else NgramProposer(1, 4)
    return [t.token_id for e in engine.generate(_prompt(engine), sampling, spec, proposer) for t in e.tokens]


def test_a_seeded_answer_is_plain_seeded_sampling_for_any_k_tree_or_adaptive(engine):
    plain = answer(engine, SpecConfig(proposer="none"))
    assert answer(engine, SpecConfig(proposer="none")) == plain  # back-to-back calls agree
    specs = [SpecConfig(proposer="ngram", k=k) for k in (1, 3, 8)]
    specs += [SpecConfig(proposer="ngram", k=4, adaptive=True), SpecConfig(proposer="ngram", k=4, tree_nodes=8)]
    specs += [SpecConfig(proposer="ngram", k=4, tree_nodes=8, adaptive=True)]
    for spec in specs:
        assert answer(engine, spec) == plain, spec


def test_another_seed_gives_another_answer(engine):
    """The check above can fail: the answer does depend on the draws."""
    plain = answer(engine, SpecConfig(proposer="none"))
    reseeded = SamplingParams(temperature=1.0, max_new_tokens=32, seed=7)
    other = answer(engine, SpecConfig(proposer="ngram", k=3), reseeded)
    assert other != plain


def test_a_position_has_the_same_draws_in_any_step():
    one = position_draws(5, 10, 3, 50, "cpu")  # positions 10..13
    two = position_draws(5, 12, 1, 50, "cpu")  # positions 12..13
    assert torch.equal(one.noise[0, 2:], two.noise[0]) and torch.equal(one.uniforms[0, 2:], two.uniforms[0])
    assert not torch.equal(position_draws(6, 10, 0, 50, "cpu").noise, one.noise[:, :1])  # another seed


def test_one_hot_verification_accepts_a_draft_with_probability_p_of_it():
    """Over many positions' draws, a one-hot draft d is accepted at the rate p(d) (the p/q test's, q = 1), and the
    emitted first token follows p."""
    vocab, n = 6, 20000
    logits = torch.log(torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05]))
    target = logits.expand(n, 2, vocab)  # [n, K+1 = 2, V]
    draws = [position_draws(1, 2 * i, 1, vocab, "cpu") for i in range(n)]
    noise = torch.cat([d.noise for d in draws])  # [n, 2, V]
    uniforms = torch.cat([d.uniforms for d in draws])
    sampling = SamplingParams(temperature=1.0)
    drafts = torch.full((n, 1), 1, dtype=torch.long)
    from localspec.verify.types import SamplerDraws

    out = verify_one_hot(target, drafts, None, sampling, SamplerDraws(uniforms, noise))
    assert abs(out.num_accepted.float().mean().item() - 0.3) < 0.015  # 4.6 sigma at n = 20000
    first = torch.bincount(out.output_token_ids[:, 0], minlength=vocab).float() / n
    assert (first - torch.softmax(logits, -1)).abs().max() < 0.015
    reference = rejection_sample(target, drafts, None, sampling, SamplerDraws(uniforms, noise))
    assert abs(reference.num_accepted.float().mean().item() - 0.3) < 0.015  # the same rate as the p/q test


def test_greedy_one_hot_verification_is_the_reference_greedy():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, 30, generator=generator)
    drafts = torch.argmax(logits[:, :4], -1)
    drafts[1, 2] = (drafts[1, 2] + 1) % 30
    greedy = SamplingParams()
    got, want = verify_one_hot(logits, drafts, None, greedy, None), rejection_sample(logits, drafts, None, greedy, None)
    assert torch.equal(got.output_token_ids, want.output_token_ids)
    assert torch.equal(got.num_accepted, want.num_accepted)
