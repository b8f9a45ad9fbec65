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
