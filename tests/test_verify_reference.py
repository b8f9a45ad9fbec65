"""The torch rejection sampler: greedy rules, and the emitted distribution equals the target's (chi-square)."""

import pytest
import torch

from localspec.config import SamplingParams
from localspec.verify import make_draws, rejection_sample
from localspec.verify.checks import emitted_distribution_pvalues

from .stats import chi_square_p

N = 20000


def test_greedy_accepts_matching_prefix_then_corrects():
    logits = torch.full((1, 4, 6), -5.0)
    for pos, tok in enumerate([1, 2, 3, 4]):
        logits[0, pos, tok] = 5.0
    out = rejection_sample(logits, torch.tensor([[1, 2, 5]]), None, SamplingParams(), None)
    assert out.num_accepted.tolist() == [2]
    assert out.output_token_ids.tolist() == [[1, 2, 3, -1]]
    out = rejection_sample(logits, torch.tensor([[1, 2, 3]]), None, SamplingParams(), None)
    assert out.output_token_ids.tolist() == [[1, 2, 3, 4]]  # bonus
    out = rejection_sample(logits, torch.tensor([[0, 2, 3]]), None, SamplingParams(), None)
    assert out.output_token_ids.tolist() == [[1, -1, -1, -1]]
    out = rejection_sample(logits[:, :1], torch.zeros((1, 0), dtype=torch.long), None, SamplingParams(), None)
    assert out.output_token_ids.tolist() == [[1]]  # K = 0: plain decoding


def _emitted_distribution_check(target_probs, draft_probs, sampling, seed=0):
    """target_probs [K+1, V]; draft_probs [K, V] or None (one-hot n-gram draft given as fixed tokens)."""
    return emitted_distribution_pvalues(rejection_sample, target_probs, draft_probs, sampling, samples=N, seed=seed)


def _rand_probs(gen, rows, vocab, sharp=2.0):
    return torch.softmax(torch.randn(rows, vocab, generator=gen) * sharp, -1)


CASES = {
    "overlapping": lambda g: (_rand_probs(g, 3, 12), _rand_probs(g, 2, 12)),
    "disjoint_supports": lambda g: (
        torch.tensor([[0.5, 0.5, 0, 0, 0, 0]] * 3) + 1e-30,
        torch.tensor([[0, 0, 0.5, 0.5, 0, 0]] * 2),
    ),
    "draft_mass_where_target_has_none": lambda g: (
        torch.tensor([[0.2, 0.3, 0.5, 0, 0, 0]] * 3) + 1e-30,
        torch.tensor([[0.1, 0.1, 0.1, 0.3, 0.2, 0.2]] * 2),
    ),
    "identical": lambda g: ((p := _rand_probs(g, 1, 10)).expand(3, 10).clone(), p.expand(2, 10).clone()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_stochastic_emits_target_distribution(case):
    gen = torch.Generator().manual_seed(1)
    target_probs, draft_probs = CASES[case](gen)
    target_probs = target_probs / target_probs.sum(-1, keepdim=True)
    p1, p2, pb, n2, nb = _emitted_distribution_check(target_probs, draft_probs, SamplingParams(temperature=1.0))
    assert min(p1, p2, pb) > 1e-4, (p1, p2, pb, n2, nb)


def test_ngram_one_hot_draft_emits_target_distribution():
    gen = torch.Generator().manual_seed(2)
    target_probs = _rand_probs(gen, 3, 8, sharp=1.0)
    target_probs[:, -1] += 0.5  # make the n-gram's tokens likely enough to test positions 2 and bonus
    target_probs[:, -2] += 0.5
    target_probs /= target_probs.sum(-1, keepdim=True)
    p1, p2, pb, n2, nb = _emitted_distribution_check(target_probs, None, SamplingParams(temperature=1.0))
    assert n2 > 1000 and min(p1, p2, pb) > 1e-4, (p1, p2, pb, n2, nb)


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=0.7, top_k=4), SamplingParams(temperature=1.3, top_p=0.8)]
)
def test_top_k_top_p_applied_to_both(params):
    from localspec.runtime.sampling import logits_to_probs

    gen = torch.Generator().manual_seed(3)
    target_logits = torch.randn(3, 10, generator=gen) * 2
    draft_logits = target_logits[:2] + torch.randn(2, 10, generator=gen)
    draft_probs = logits_to_probs(draft_logits, params)
    p1, p2, pb, *_ = _emitted_distribution_check(torch.softmax(target_logits, -1), draft_probs, params)
    assert min(p1, p2, pb) > 1e-4


def test_chi_square_detects_a_wrong_sampler():
    """The check above can fail: a sampler that always accepts the draft is caught."""
    gen = torch.Generator().manual_seed(4)
    target_probs, draft_probs = _rand_probs(gen, 2, 12), _rand_probs(gen, 1, 12)
    draft_ids = torch.multinomial(draft_probs, N, replacement=True, generator=gen).T
    p = chi_square_p(torch.bincount(draft_ids[:, 0], minlength=12), target_probs[0])
    assert p < 1e-6


def test_same_draws_same_tokens():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 5, 50, generator=gen)
    draft_probs = _rand_probs(gen, 4 * 4, 50).view(4, 4, 50)
    draft_ids = torch.randint(0, 50, (4, 4), generator=gen)
    draws = make_draws(torch.Generator().manual_seed(9), 4, 4, 50, "cpu")
    a = rejection_sample(logits, draft_ids, draft_probs, SamplingParams(temperature=1.0), draws)
    b = rejection_sample(logits, draft_ids, draft_probs, SamplingParams(temperature=1.0), draws)
    assert torch.equal(a.output_token_ids, b.output_token_ids)
