"""Greedy losslessness on the real embedded model (SmolLM2-135M-Instruct) over prompts from ../shared/data."""
import warnings

import pytest
import torch

from localspec.config import SamplingParams, SpecConfig

from .conftest import shared_prompts

pytestmark = pytest.mark.slow
NEW_TOKENS = 32
KS = (1, 3, 5, 8)


def near_tie_gap(model, context):
    """Top-2 logit gap of the target's next-token prediction after `context` (fresh full forward)."""
    with torch.inference_mode():
        logits = model(torch.tensor([context])).logits[0, -1].float()
    top2 = torch.topk(logits, 2).values
    return float(top2[0] - top2[1])


def assert_same_or_near_tie(session, prompt_ids, expected, got, label):
    if got == expected:
        return
    j = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    gap = near_tie_gap(session.loaded.target, prompt_ids + expected[:j])
    # a (K+1)-token forward and a 1-token forward round differently; that may only flip a genuine near-tie
    assert gap < 1e-3, f"{label}: outputs differ at token {j} where the top-2 logit gap is {gap:.2e} (not a tie)"
    warnings.warn(f"{label}: near-tie flip at token {j} (top-2 logit gap {gap:.2e})")


def ids_of(session, prompt_ids, spec):
    events = session.stream_ids(prompt_ids, SamplingParams(max_new_tokens=NEW_TOKENS), spec)
    return [t.token_id for e in events for t in e.tokens]


@pytest.fixture(scope="module")
def prompts(embedded_session):
    texts = shared_prompts(limit_mt=6, limit_code=4)
    assert len(texts) >= 10
    return [embedded_session.prompt_ids([{"role": "user", "content": t}], NEW_TOKENS)[0] for t in texts]


def test_speculative_equals_transformers_generate(embedded_session, prompts):
    model = embedded_session.loaded.target
    stop = sorted(embedded_session.engine.stop_token_ids)
    for n, prompt_ids in enumerate(prompts):
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                 eos_token_id=stop, pad_token_id=stop[0])
        expected = out[0, len(prompt_ids):].tolist()
        baseline = ids_of(embedded_session, prompt_ids, SpecConfig(proposer="none"))
        assert_same_or_near_tie(embedded_session, prompt_ids, expected, baseline, f"prompt {n} none")
        for k in KS:
            got = ids_of(embedded_session, prompt_ids, SpecConfig(proposer="ngram", k=k))
            assert_same_or_near_tie(embedded_session, prompt_ids, expected, got, f"prompt {n} ngram K={k}")


def test_nf4_speculative_equals_nf4_plain():
    from pathlib import Path

    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    pair = load_registry(Path(__file__).resolve().parents[1] / "models.yaml")[0]
    session = ChatSession(load_pair(pair, quant="nf4", device="cpu"))
    assert "bitsandbytes" in type(session.loaded.target.model.layers[0].mlp.up_proj).__module__
    for n, text in enumerate(shared_prompts(limit_mt=6, limit_code=4)):
        prompt_ids = session.prompt_ids([{"role": "user", "content": text}], NEW_TOKENS)[0]
        baseline = ids_of(session, prompt_ids, SpecConfig(proposer="none"))
        for k in KS:
            got = ids_of(session, prompt_ids, SpecConfig(proposer="ngram", k=k))
            assert_same_or_near_tie(session, prompt_ids, baseline, got, f"nf4 prompt {n} ngram K={k}")
