"""The preallocated KV cache: the same tokens and logits as transformers' DynamicCache, through crops and answers,
with its buffers allocated once."""

import pytest
import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.proposers import DraftModelProposer, NgramProposer
from localspec.runtime.model_runner import ModelRunner
from localspec.runtime.static_cache import PreallocatedCache, cache_supported
from tests.support import COUNTING_PROMPT

PROMPT = COUNTING_PROMPT


def _answer(target_model, draft_model, cache, proposer_name, k, sampling, prompt=PROMPT):
    engine = Engine(target_model)
    engine.target = ModelRunner(target_model, cache=cache)
    proposer = None
    if proposer_name == "ngram":
        proposer = NgramProposer(1, 3)
    elif proposer_name == "draft":
        proposer = DraftModelProposer(draft_model)
        proposer.runner = ModelRunner(draft_model, cache=cache)
    events = list(engine.generate(prompt, sampling, SpecConfig(proposer=proposer_name, k=k), proposer))
    assert events[-1].finish_reason == "length", events[-1].error
    return [t.token_id for e in events for t in e.tokens], [t.kind for e in events for t in e.tokens]


def test_the_tiny_models_get_the_preallocated_cache(tiny_models):
    target, draft = tiny_models
    assert ModelRunner(target).cache_kind == "static"
    assert DraftModelProposer(draft).runner.cache_kind == "static"


@pytest.mark.parametrize("proposer_name,k", [("none", 1), ("ngram", 4), ("draft", 3), ("draft", 6)])
def test_greedy_tokens_equal_the_dynamic_cache(tiny_models, proposer_name, k):
    target, draft = tiny_models
    sampling = SamplingParams(max_new_tokens=60)
    static_ids, kinds = _answer(target, draft, "static", proposer_name, k, sampling)
    dynamic_ids, _ = _answer(target, draft, "dynamic", proposer_name, k, sampling)
    assert static_ids == dynamic_ids
    if proposer_name == "draft":
        assert "resampled" in kinds  # rejections happened: the cache was cropped mid-answer


def test_sampled_tokens_equal_the_dynamic_cache(tiny_models):
    target, draft = tiny_models
    sampling = SamplingParams(temperature=0.8, max_new_tokens=40, seed=3)
    assert _answer(target, draft, "static", "draft", 3, sampling) == _answer(
        target, draft, "dynamic", "draft", 3, sampling
    )


def test_logits_match_through_extends_crops_and_resets(tiny_models):
    target, _ = tiny_models
    static, dynamic = ModelRunner(target, cache="static"), ModelRunner(target, cache="dynamic")
    script = [
        ("reset",),
        ("extend", PROMPT),
        ("extend", [7, 8, 9, 10]),
        ("crop", 41),
        ("extend", [11, 12]),
        ("crop", 30),
        ("extend", [3] * 9),
        ("reset",),
        ("extend", PROMPT[:12]),
        ("extend", [99]),
    ]
    for step in script:
        outs = []
        for runner in (static, dynamic):
            if step[0] == "reset":
                runner.reset()
            elif step[0] == "crop":
                runner.crop(step[1])
            else:
                outs.append(runner.extend(list(step[1])).logits)
        assert static.tokens == dynamic.tokens
        assert static.cache.get_seq_length() == len(static.tokens)
        if outs:
            torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_buffers_are_allocated_once_across_steps_and_answers(tiny_models):
    target, draft = tiny_models
    engine = Engine(target)
    runner = engine.target
    sampling = SamplingParams(max_new_tokens=50)
    spec = SpecConfig(proposer="draft", k=4)
    list(engine.generate(PROMPT, sampling, spec, DraftModelProposer(draft)))
    layers = len(runner.cache.layers)
    pointers = [layer.keys.data_ptr() for layer in runner.cache.layers]
    assert runner.cache.allocations == layers  # one keys + values buffer pair per layer, made once
    list(engine.generate(PROMPT[:20], sampling, spec, DraftModelProposer(draft)))
    assert runner.cache.allocations == layers
    assert [layer.keys.data_ptr() for layer in runner.cache.layers] == pointers


def test_a_prompt_longer_than_the_buffer_grows_it_and_keeps_its_contents(tiny_models):
    target, _ = tiny_models
    static, dynamic = ModelRunner(target, cache="static"), ModelRunner(target, cache="dynamic")
    static.reset()
    dynamic.reset()
    static.cache = PreallocatedCache(target.config, static.max_context, capacity=8)
    static.extend(PROMPT[:6])
    dynamic.extend(PROMPT[:6])
    torch.testing.assert_close(
        static.extend(PROMPT[6:30]).logits, dynamic.extend(PROMPT[6:30]).logits, rtol=1e-5, atol=1e-5
    )
    assert static.cache.layers[0].capacity == 32 and static.cache.allocations == 2 * len(static.cache.layers)
    with pytest.raises(ValueError, match="holds"):
        static.extend([1] * (static.max_context + 1))


def test_sliding_window_models_keep_the_dynamic_cache():
    from transformers import LlamaConfig, MistralConfig

    assert cache_supported(LlamaConfig(num_hidden_layers=2))
    assert not cache_supported(MistralConfig(num_hidden_layers=2, sliding_window=16))
