"""Penalties on the target's distribution (runtime/penalties.py): per-row processing against a plain reference,
greedy speculation equal to greedy plain decoding with the same penalty, and the rejection sampler exact for the
penalised distribution."""

from __future__ import annotations

import pytest
import torch

from localspec.config import ConfigError, SamplingParams
from localspec.runtime.logits_processors import chain_paths, tree_paths
from localspec.runtime.penalties import Penalties, PenaltyProcessor, penalties_for
from localspec.runtime.sampling import logits_to_probs
from localspec.runtime.tree import TokenTree
from localspec.verify import make_draws, rejection_sample

from .stats import chi_square_p


def reference_row(row: list[float], prompt: list[int], answer: list[int], rule: Penalties) -> list[float]:
    """One row penalised token by token, straight from the definitions."""
    out = list(row)
    for token in range(len(out)):
        count = answer.count(token)
        if rule.repetition != 1.0 and (token in prompt or count > 0):
            out[token] = out[token] / rule.repetition if out[token] > 0 else out[token] * rule.repetition
        out[token] -= rule.frequency * count
        out[token] -= rule.presence * (count > 0)
    return out


RULES = [Penalties(repetition=1.3), Penalties(frequency=0.6), Penalties(presence=-0.8), Penalties(1.7, 0.4, 1.1)]


@pytest.mark.parametrize("rule", RULES, ids=["repetition", "frequency", "presence", "all"])
def test_each_row_is_penalised_as_its_own_prefix_says(rule):
    gen = torch.Generator().manual_seed(0)
    vocab, prompt, committed = 16, [3, 4, 4, 9], [5, 5, 1]
    tree = TokenTree([5, 7, 2, 7, 3], [-1, 0, 1, -1, 3])
    logits = torch.randn(tree.size + 1, vocab, generator=gen) * 3
    logits[2, 6] = float("-inf")  # a grammar's forbidden token stays forbidden
    processor = PenaltyProcessor(rule, prompt)
    processor.commit(committed[:2])  # before the first process: kept for it
    processor.process(logits[:1], [[]])
    processor.commit(committed[2:])
    paths = tree_paths(tree)
    out = processor.process(logits, paths)
    for r, path in enumerate(paths):
        expected = reference_row(logits[r].tolist(), prompt, committed + path, rule)
        assert torch.allclose(out[r], torch.tensor(expected), rtol=1e-6, atol=1e-6), (r, path)
    assert out[2, 6] == float("-inf")


def test_a_row_is_bitwise_the_same_alone_or_among_drafts():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=gen).to(torch.bfloat16)
    processor = PenaltyProcessor(Penalties(1.3, 0.5, 0.25), [1, 2, 3])
    processor.commit([7, 7, 8])
    drafts = [7, 9, 9]
    together = processor.process(logits, chain_paths(drafts))
    for r, path in enumerate(chain_paths(drafts)):
        alone = processor.process(logits[r : r + 1], [path])
        assert torch.equal(alone[0], together[r])


def test_neutral_penalties_build_no_processor():
    assert penalties_for(SamplingParams(), [1, 2]) == ()
    assert len(penalties_for(SamplingParams(frequency_penalty=0.1), [1, 2])) == 1


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("repetition_penalty", 0.0, "repetition penalty"),
        ("repetition_penalty", float("nan"), "repetition penalty"),
        ("frequency_penalty", 2.5, "frequency penalty"),
        ("presence_penalty", -3.0, "presence penalty"),
        ("presence_penalty", "0.5", "presence penalty"),
    ],
)
def test_out_of_range_penalties_are_refused_by_name(field, value, named):
    with pytest.raises(ConfigError, match=named):
        SamplingParams(**{field: value}).validate()


# ---- the rejection sampler stays exact for the penalised distribution ----------------------------------------------
VOCAB, K, SAMPLES = 8, 2, 20000
RULE = Penalties(repetition=2.0, frequency=0.7, presence=0.5)


def _penalised_rows(processor, raw: torch.Tensor, ignore_paths: bool) -> torch.Tensor:
    """[V, V, K+1, V]: the processed rows of every chain of K = 2 drafts (d0, d1)."""
    table = torch.empty(VOCAB, VOCAB, K + 1, VOCAB)
    for d0 in range(VOCAB):
        for d1 in range(VOCAB):
            paths = [[]] * (K + 1) if ignore_paths else chain_paths([d0, d1])
            table[d0, d1] = processor.process(raw, paths)
    return table


def _second_token_pvalue(ignore_paths: bool) -> tuple[float, float]:
    """Soft drafts of K = 2 verified against penalised rows (each row counted with its own drafts, or wrongly
    without them); the emitted first token against row 0's penalised distribution, and the second (given the first
    draft a was kept) against row 1's with a counted."""
    gen = torch.Generator().manual_seed(3)
    raw = torch.randn(K + 1, VOCAB, generator=gen)
    raw[:, 2] += 1.5  # a likely draft, so that many rows test the second position
    draft_probs = torch.softmax(raw[:K] + 0.5 * torch.randn(K, VOCAB, generator=gen), -1)  # [K, V]
    processor = PenaltyProcessor(RULE, prompt_ids=[2, 5])
    processor.commit([3])
    sampling = SamplingParams(temperature=1.0)
    table = _penalised_rows(processor, raw, ignore_paths)
    true_table = table if not ignore_paths else _penalised_rows(processor, raw, False)
    draft_ids = torch.multinomial(draft_probs, SAMPLES, replacement=True, generator=gen).T  # [N, K]
    logits = table[draft_ids[:, 0], draft_ids[:, 1]]  # [N, K+1, V]
    draws = make_draws(gen, SAMPLES, K, VOCAB, "cpu")
    out = rejection_sample(logits, draft_ids, draft_probs.expand(SAMPLES, K, VOCAB), sampling, draws)
    tokens = out.output_token_ids
    first = chi_square_p(torch.bincount(tokens[:, 0], minlength=VOCAB), logits_to_probs(true_table[0, 0, 0], sampling))
    kept = (tokens[:, 0] == 2) & (draft_ids[:, 0] == 2)
    assert kept.sum() > 2000
    expected = logits_to_probs(true_table[2, 0, 1], sampling)  # row 1 after the draft 2
    return first, chi_square_p(torch.bincount(tokens[kept, 1], minlength=VOCAB), expected)


def test_sampled_tokens_follow_the_penalised_distribution_of_each_rows_prefix():
    first, second = _second_token_pvalue(ignore_paths=False)
    assert first > 1e-4 and second > 1e-4, (first, second)


def test_the_check_catches_rows_penalised_without_their_drafts():
    _, second = _second_token_pvalue(ignore_paths=True)
    assert second < 1e-6


# ---- greedy speculation equals greedy plain decoding with the same penalty -----------------------------------------
def greedy_answer(session, sampling, proposer="none", tree_nodes=0):
    ids, _ = session.prompt_ids([{"role": "user", "content": "Say it again and again and again."}], 64)
    spec = session.default_spec(proposer=proposer, k=4, tree_nodes=tree_nodes)
    events = list(session.stream_ids(ids, sampling, spec))
    return [tok.token_id for event in events for tok in event.tokens], events[-1]


PENALISED = [
    SamplingParams(temperature=0.0, max_new_tokens=48, repetition_penalty=1.3),
    SamplingParams(temperature=0.0, max_new_tokens=48, frequency_penalty=0.2),
]


@pytest.mark.parametrize("sampling", PENALISED, ids=["repetition", "frequency"])
@pytest.mark.parametrize("proposer, tree_nodes", [("ngram", 0), ("draft", 0), ("ngram", 6)])
def test_penalised_speculation_equals_penalised_plain_decoding(tiny_session, sampling, proposer, tree_nodes):
    plain, _ = greedy_answer(tiny_session, sampling)
    fast, last = greedy_answer(tiny_session, sampling, proposer, tree_nodes)
    assert fast == plain
    assert last.stats.drafted > 0  # speculation ran


@pytest.mark.parametrize("sampling", PENALISED, ids=["repetition", "frequency"])
def test_the_penalty_changes_a_repetitive_answer(tiny_session, sampling):
    unpenalised, _ = greedy_answer(tiny_session, SamplingParams(temperature=0.0, max_new_tokens=48))
    penalised, _ = greedy_answer(tiny_session, sampling)
    assert penalised != unpenalised
    most_repeated = lambda ids: max(ids.count(t) for t in set(ids))  # noqa: E731
    assert most_repeated(penalised) < most_repeated(unpenalised)
