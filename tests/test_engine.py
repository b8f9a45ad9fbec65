"""The engine on the tiny random pair: lossless greedy output, KV rollback, seeded sampling, limits, cancel."""

import math
import threading

import pytest
import torch

from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.engine.events import steps
from localspec.engine.loop import Engine
from localspec.proposers import DraftModelProposer, NgramProposer
from tests.support import COUNTING_PROMPT

PROMPT = COUNTING_PROMPT


def run(engine, proposer, spec, sampling, prompt=PROMPT, cancel=None):
    events = list(steps(engine.generate(prompt, sampling, spec, proposer, cancel)))  # a long prompt's progress left out
    tokens = [t for e in events for t in e.tokens]
    return [t.token_id for t in tokens], tokens, events


@pytest.fixture(scope="module")
def engine(tiny_models):
    return Engine(tiny_models[0], stop_token_ids=set())


def hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("proposer_name", ["ngram", "draft"])
def test_greedy_speculative_equals_transformers_generate(engine, tiny_models, proposer_name, k):
    target, draft = tiny_models
    expected = hf_greedy(target, PROMPT, 48)
    proposer = NgramProposer(1, 3) if proposer_name == "ngram" else DraftModelProposer(draft)
    ids, tokens, events = run(
        engine, proposer, SpecConfig(proposer=proposer_name, k=k), SamplingParams(max_new_tokens=48)
    )
    assert ids == expected
    assert events[-1].finish_reason == "length"
    stats = events[-1].stats
    assert stats.emitted == 48 and stats.target_forwards == len(events)
    assert stats.drafted == sum(e.propose_token_num for e in events)
    assert stats.accepted == sum(e.accept_token_num for e in events) == sum(t.kind == "accepted" for t in tokens)


def test_baseline_is_plain_decoding(engine, tiny_models):
    ids, tokens, events = run(engine, None, SpecConfig(proposer="none"), SamplingParams(max_new_tokens=20))
    assert ids == hf_greedy(tiny_models[0], PROMPT, 20)
    assert {t.kind for t in tokens} == {"target"} and len(events) == 20


def test_kinds_follow_the_rules(engine, tiny_models):
    _, tokens, events = run(
        engine, DraftModelProposer(tiny_models[1]), SpecConfig(proposer="draft", k=3), SamplingParams(max_new_tokens=60)
    )
    kinds = {t.kind for t in tokens}
    assert {"accepted", "resampled"} <= kinds
    for event in events:
        step_kinds = [t.kind for t in event.tokens]
        assert step_kinds[:-1] == ["accepted"] * (len(step_kinds) - 1)
        assert len(step_kinds) == event.accept_token_num + 1
        last = event.tokens[-1]
        if last.kind == "resampled":
            assert last.rejected_token_id is not None and last.rejected_token_id != last.token_id
        if last.kind == "bonus":
            assert event.accept_token_num == event.propose_token_num > 0


def test_kv_rollback_matches_fresh_forward(engine, tiny_models):
    """After many steps with rejections, the cached next-token logits equal a fresh full forward."""
    target, draft = tiny_models
    ids, _, events = run(
        engine,
        DraftModelProposer(draft),
        SpecConfig(proposer="draft", k=5),
        SamplingParams(max_new_tokens=70, temperature=1.0, seed=3),
    )
    assert sum(e.propose_token_num - e.accept_token_num for e in events) > 10  # there were rejections
    runner = engine.target
    context = PROMPT + ids
    # the cache holds the context minus the last emitted token (it is the next step's first input)
    assert runner.tokens == context[:-1]
    cached = runner.extend([context[-1]]).logits[-1]
    with torch.inference_mode():
        fresh = target(torch.tensor([context])).logits[0, -1]
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_sampling_is_reproducible_and_seed_dependent(engine, tiny_models):
    spec = SpecConfig(proposer="draft", k=4)
    a, _, _ = run(engine, DraftModelProposer(tiny_models[1]), spec, SamplingParams(temperature=1.0, seed=7))
    b, _, _ = run(engine, DraftModelProposer(tiny_models[1]), spec, SamplingParams(temperature=1.0, seed=7))
    c, _, _ = run(engine, DraftModelProposer(tiny_models[1]), spec, SamplingParams(temperature=1.0, seed=8))
    assert a == b and a != c


def test_stop_token_ends_the_answer(tiny_models):
    target = tiny_models[0]
    first = hf_greedy(target, PROMPT, 12)
    stop = first[5]
    engine = Engine(target, stop_token_ids={stop})
    ids, _, events = run(
        engine, NgramProposer(1, 3), SpecConfig(proposer="ngram", k=4), SamplingParams(max_new_tokens=40)
    )
    assert ids == first[: first.index(stop) + 1]
    assert events[-1].finish_reason == "stop"


def test_cancel_stops_and_keeps_partial(engine, tiny_models):
    cancel = threading.Event()
    gen = engine.generate(PROMPT, SamplingParams(max_new_tokens=200), SpecConfig(proposer="none"), None, cancel)
    got = [next(gen) for _ in range(5)]
    cancel.set()
    rest = list(gen)
    assert len(got) == 5 and rest[-1].finish_reason == "cancelled" and rest[-1].finished


def test_empty_and_overlong_prompts_are_refused(engine):
    with pytest.raises(ConfigError, match="empty"):
        list(engine.generate([], SamplingParams(), SpecConfig(), None))
    with pytest.raises(ConfigError, match="context holds"):
        list(engine.generate([5] * (engine.max_context + 1), SamplingParams(), SpecConfig(), None))


def test_answer_budget_is_capped_by_context(engine):
    prompt = [7] * (engine.max_context - 10)
    ids, _, events = run(
        engine, NgramProposer(), SpecConfig(proposer="ngram", k=8), SamplingParams(max_new_tokens=100), prompt=prompt
    )
    assert len(ids) == 10 and events[-1].finish_reason == "length"


class RecordingProposer(NgramProposer):
    """Checks the engine hands hidden states of the right shape to feature-level proposers."""

    wants_hidden = True

    def __init__(self):
        super().__init__(1, 3)
        self.seen = []

    def begin(self, prompt_ids, prompt_hidden):
        super().begin(prompt_ids, prompt_hidden)
        self.seen.append(("begin", len(prompt_ids), tuple(prompt_hidden.shape)))

    def on_verified(self, num_accepted, emitted_ids, target_hidden):
        super().on_verified(num_accepted, emitted_ids, target_hidden)
        self.seen.append(("verified", num_accepted, tuple(target_hidden.shape)))


def test_hidden_states_reach_feature_proposers(engine, tiny_models):
    proposer = RecordingProposer()
    run(engine, proposer, SpecConfig(proposer="ngram", k=3), SamplingParams(max_new_tokens=30))
    hidden = tiny_models[0].config.hidden_size
    assert proposer.seen[0] == ("begin", len(PROMPT), (len(PROMPT) - 1, hidden))
    for _, accepted, shape in proposer.seen[1:]:
        assert shape == (accepted + 1, hidden)


def test_model_failure_mid_answer_becomes_an_error_event(engine, tiny_models):
    """An exception inside a forward pass ends the answer with a message; the engine still answers afterwards."""
    calls = {"n": 0}

    def explode(module, args, output):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("kernel missing")

    handle = tiny_models[0].model.layers[-1].mlp.down_proj.register_forward_hook(explode)  # once per forward
    try:
        _, tokens, events = run(engine, None, SpecConfig(proposer="none"), SamplingParams(max_new_tokens=20))
    finally:
        handle.remove()
    assert events[-1].finish_reason == "error" and "kernel missing" in events[-1].error
    assert len(tokens) == 2  # the prefill and two steps ran before the failure
    ids, _, events = run(engine, None, SpecConfig(proposer="none"), SamplingParams(max_new_tokens=5))
    assert len(ids) == 5 and events[-1].finish_reason == "length"


def test_top_logprobs_under_greedy_lead_with_the_emitted_token(engine, tiny_models):
    _, tokens, _ = run(
        engine,
        DraftModelProposer(tiny_models[1]),
        SpecConfig(proposer="draft", k=3),
        SamplingParams(max_new_tokens=30, top_logprobs=5),
    )
    assert {"accepted", "resampled"} <= {t.kind for t in tokens}  # every kind of position carries them
    for token in tokens:
        assert len(token.top_logprobs) == 5
        assert token.top_logprobs[0][0] == token.token_id
        assert token.top_logprobs[0][1] == pytest.approx(math.log(token.target_prob), abs=1e-5)
        values = [lp for _, lp in token.top_logprobs]
        assert values == sorted(values, reverse=True) and len({i for i, _ in token.top_logprobs}) == 5


def test_top_logprobs_are_of_the_sampled_distribution(engine, tiny_models):
    """After temperature and top-k: the emitted token is among the top-k with its p_target, the rest are -inf."""
    _, tokens, _ = run(
        engine,
        NgramProposer(1, 3),
        SpecConfig(proposer="ngram", k=3),
        SamplingParams(temperature=0.7, top_k=3, max_new_tokens=30, seed=3, top_logprobs=6),
    )
    for token in tokens:
        kept = dict(token.top_logprobs[:3])
        assert token.token_id in kept and kept[token.token_id] == pytest.approx(math.log(token.target_prob), abs=1e-5)
        assert sum(math.exp(lp) for lp in kept.values()) == pytest.approx(1.0, abs=1e-5)
        assert all(lp == -math.inf for _, lp in token.top_logprobs[3:])


def test_top_logprobs_zero_adds_nothing_and_the_range_is_checked(engine):
    _, tokens, _ = run(engine, NgramProposer(1, 3), SpecConfig(proposer="ngram", k=3), SamplingParams(max_new_tokens=8))
    assert tokens and all(t.top_logprobs is None for t in tokens)
    for bad in (21, -1):
        with pytest.raises(ConfigError, match="top logprobs must be between 0 and 20"):
            SamplingParams(top_logprobs=bad).validate()


def test_a_long_prompt_is_read_with_progress_between_chunks_and_the_same_answer(engine, monkeypatch):
    from localspec.engine.events import PrefillProgress, StepEvent

    sampling, spec = SamplingParams(max_new_tokens=8), SpecConfig(proposer="none")
    whole, _, _ = run(engine, None, spec, sampling)  # read in one forward
    monkeypatch.setattr("localspec.engine.loop.PREFILL_CHUNK", 12)
    events = list(engine.generate(PROMPT, sampling, spec))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    stepped = [e for e in events if isinstance(e, StepEvent)]
    assert events[: len(progress)] == progress  # all before the first step
    assert [p.read for p in progress] == [12, 24, 36, len(PROMPT)]  # 39 cached in 4 forwards, then all read
    assert {p.total for p in progress} == {len(PROMPT)}
    assert all(a.elapsed_s <= b.elapsed_s for a, b in zip(progress, progress[1:]))
    assert [t.token_id for e in stepped for t in e.tokens] == whole  # reading in chunks changes no token
    assert stepped[-1].stats.target_forwards == len(stepped) == 8  # no progress event counted as a step

    # a prompt read in one forward (all of it but its last token, which the first step reads) says nothing
    monkeypatch.setattr("localspec.engine.loop.PREFILL_CHUNK", len(PROMPT) - 1)
    assert all(isinstance(e, StepEvent) for e in engine.generate(PROMPT, sampling, spec))
