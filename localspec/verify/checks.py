"""Checks shared by the tests, `localspec selftest`, `localspec bench-sampler` and the GPU script.

- chi_square_p / emitted_distribution_pvalues: the emitted tokens of a sampler follow the target distribution.
- make_verify_case: a random verification input whose rows cover every branch (all accepted, first rejected,
  rejected part-way), for greedy or stochastic, n-gram or draft-model drafts.
- compare_outputs: one sampler's VerifyOutput against the reference's (tokens and counts exactly, probabilities
  within float32 tolerance).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from localspec.config import SamplingParams
from localspec.runtime.sampling import filter_logits

from .types import SamplerDraws, VerifyOutput, make_draws

Verifier = Callable[..., VerifyOutput]


def chi_square_p(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """p-value that `observed` counts come from `expected_probs`. Cells with expected count < 5 are pooled.

    A token emitted with zero expected probability gives p = 0. No scipy: torch has the regularised incomplete gamma.
    """
    observed = observed.double().cpu()
    expected_probs = expected_probs.double().cpu()
    if observed[expected_probs == 0].sum() > 0:
        return 0.0
    expected = expected_probs * observed.sum()
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = max(int(keep.sum()) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2.0))


def emitted_distribution_pvalues(
    sampler: Verifier,
    target_probs: torch.Tensor,  # [K+1, V] the target's distribution at each verified position (temperature 1)
    draft_probs: torch.Tensor | None,  # [K, V], or None for a fixed one-hot (n-gram) draft
    sampling: SamplingParams,
    samples: int = 20000,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[float, float, float, int, int]:
    """Run `sampler` on `samples` independent rows and test the emitted tokens against the target distribution.

    Returns (p first token, p second token given the first draft was accepted, p bonus given all accepted,
    rows behind the second test, rows behind the bonus test). The bonus test is skipped (p = 1) under 200 rows.
    """
    gen = torch.Generator().manual_seed(seed)
    k_plus_1, vocab = target_probs.shape
    k = k_plus_1 - 1
    if draft_probs is None:
        draft_ids = torch.tensor([[vocab - 1 - i % vocab for i in range(k)]]).expand(samples, k)
    else:
        draft_ids = torch.multinomial(draft_probs, samples, replacement=True, generator=gen).T  # [N, K]
    logits = target_probs.log().expand(samples, k_plus_1, vocab)
    draws = make_draws(gen, samples, k, vocab, "cpu")
    draws = SamplerDraws(draws.uniforms.to(device), draws.noise.to(device))
    expanded_draft = None if draft_probs is None else draft_probs.expand(samples, k, vocab).to(device)
    out = sampler(logits.to(device), draft_ids.to(device), expanded_draft, sampling, draws)
    expected = torch.softmax(torch.log(target_probs) / sampling.temperature, -1)
    expected = torch.softmax(filter_logits(torch.log(expected), sampling.top_k, sampling.top_p), -1)
    tokens = out.output_token_ids.cpu()
    num_accepted = out.num_accepted.cpu()
    p1 = chi_square_p(torch.bincount(tokens[:, 0], minlength=vocab), expected[0])
    rows = tokens[:, 0] == draft_ids[:, 0]
    p2 = chi_square_p(torch.bincount(tokens[rows, 1], minlength=vocab), expected[1]) if rows.sum() > 0 else 1.0
    full = num_accepted == k
    pb = chi_square_p(torch.bincount(tokens[full, k], minlength=vocab), expected[k]) if full.sum() > 200 else 1.0
    return p1, p2, pb, int(rows.sum()), int(full.sum())


@dataclass(frozen=True)
class VerifyCase:
    """One verification input, ready to hand to any sampler."""

    target_logits: torch.Tensor  # [B, K+1, V]
    draft_token_ids: torch.Tensor  # [B, K] int64
    draft_probs: torch.Tensor | None  # [B, K, V] float32, or None (n-gram)
    sampling: SamplingParams
    draws: SamplerDraws | None  # None in greedy mode

    def run(self, sampler: Verifier) -> VerifyOutput:
        return sampler(self.target_logits, self.draft_token_ids, self.draft_probs, self.sampling, self.draws)


def make_verify_case(
    seed: int,
    batch: int,
    k: int,
    vocab: int,
    *,
    temperature: float = 0.0,
    with_draft_probs: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> VerifyCase:
    """A random case whose rows plan their accepted prefix: row 0 all K, row 1 none, the others a random length.

    Draft tokens before the planned rejection are the target's (boosted) argmax; the planned rejection is a token the
    target finds unlikely; later tokens are random. Draft distributions are a perturbed target softmax.
    """
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=gen) * 2.5
    plans = [k if b == 0 else 0 if b == 1 else int(torch.randint(0, k + 1, (1,), generator=gen)) for b in range(batch)]
    if batch == 1:
        plans = [int(torch.randint(0, k + 1, (1,), generator=gen))]
    draft_ids = torch.randint(0, vocab, (batch, k), generator=gen)
    for b, plan in enumerate(plans):
        for i in range(min(plan, k)):
            logits[b, i, draft_ids[b, i]] = logits[b, i].max() + 4.0  # a draft the target likes
        if plan < k:
            logits[b, plan, draft_ids[b, plan]] = logits[b, plan].min() - 4.0  # a draft the target dislikes
    logits = logits.to(dtype)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    draft_probs = None
    if with_draft_probs:
        draft_logits = logits.float()[:, :k] + torch.randn(batch, k, vocab, generator=gen) * 0.5
        for b, plan in enumerate(plans):
            if plan < k:  # the draft likes the token the target dislikes: a near-certain rejection
                draft_logits[b, plan, draft_ids[b, plan]] = draft_logits[b, plan].max() + 4.0
        if not sampling.greedy:
            draft_logits = draft_logits / temperature
        draft_probs = torch.softmax(filter_logits(draft_logits, top_k, top_p), -1)
    draws = None if sampling.greedy else make_draws(gen, batch, k, vocab, "cpu")
    device = torch.device(device)
    return VerifyCase(
        target_logits=logits.to(device),
        draft_token_ids=draft_ids.to(device),
        draft_probs=None if draft_probs is None else draft_probs.to(device),
        sampling=sampling,
        draws=None if draws is None else SamplerDraws(draws.uniforms.to(device), draws.noise.to(device)),
    )


def compare_outputs(actual: VerifyOutput, expected: VerifyOutput, atol: float = 1e-6, rtol: float = 1e-4) -> list[str]:
    """Problems found comparing a sampler's output with the reference's; empty when they agree."""
    problems = []
    for name in ("output_token_ids", "num_accepted"):
        got, want = getattr(actual, name).cpu(), getattr(expected, name).cpu()
        if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
            problems.append(f"{name}: got {got.tolist()} ({got.dtype}), want {want.tolist()} ({want.dtype})")
    for name in ("target_probs_of_drafts", "draft_probs_of_drafts", "target_prob_of_last"):
        got, want = getattr(actual, name).cpu().float(), getattr(expected, name).cpu().float()
        if got.shape != want.shape:
            problems.append(f"{name}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
        elif not torch.allclose(got, want, atol=atol, rtol=rtol):
            worst = (got - want).abs().max().item()
            problems.append(f"{name}: differs by up to {worst:.3g}")
    return problems
