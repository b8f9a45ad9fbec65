import torch

from localspec.config import SamplingParams
from localspec.runtime.sampling import filter_logits, logits_to_probs, sample_with_noise


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    kept = torch.isfinite(filter_logits(logits, top_k=2))
    assert kept.tolist() == [[False, True, False, True, False]]


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = torch.isfinite(filter_logits(probs.log(), top_p=0.8))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(filter_logits(probs.log(), top_p=0.81))
    assert kept.tolist() == [[True, True, True, False]]
    # the most likely token always stays
    assert torch.isfinite(filter_logits(probs.log(), top_p=0.01)).tolist() == [[True, False, False, False]]


def test_temperature_and_greedy_display():
    logits = torch.tensor([0.0, 1.0])
    hot = logits_to_probs(logits, SamplingParams(temperature=2.0))
    assert torch.allclose(hot, torch.softmax(logits / 2.0, -1))
    greedy = logits_to_probs(logits, SamplingParams(temperature=0.0))
    assert torch.allclose(greedy, torch.softmax(logits, -1))


def test_exponential_race_samples_the_distribution():
    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.1, 0.6, 0.3])
    noise = torch.empty(40000, 3).exponential_(generator=gen)
    counts = torch.bincount(sample_with_noise(probs.expand(40000, 3), noise), minlength=3).float() / 40000
    assert torch.allclose(counts, probs, atol=0.01)


def test_argmax_last_and_all_finite_answer_as_torchs_own_checks():
    from localspec.runtime.sampling import all_finite, argmax_last

    generator = torch.Generator().manual_seed(3)
    x = torch.randint(-3, 4, (6, 1000), generator=generator).float()  # many ties: the first maximum wins
    x[1, ::2] = float("-inf")
    x[2, 10] = float("nan")  # a NaN counts as the maximum, as in torch
    x[3] = float("-inf")
    for rows in (x, x[0], x[:, ::3], x.double()):
        assert torch.equal(argmax_last(rows), torch.argmax(rows, dim=-1))
    assert argmax_last(x[0]).shape == torch.argmax(x[0], dim=-1).shape == ()
    finite = torch.randn(4, 1000, generator=generator)
    assert bool(all_finite(finite))
    for bad in (float("nan"), float("inf"), float("-inf")):
        spoiled = finite.clone()
        spoiled[2, 7] = bad
        assert not bool(all_finite(spoiled))
    huge = torch.full((2, 1000), 3e38)  # finite, though its sum overflows
    assert bool(all_finite(huge))
