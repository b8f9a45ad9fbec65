"""Which target, draft and head combinations run: a bf16 target with a head, the Qwen-style padded vocabulary
pair, drafts with another tokenizer or a larger vocabulary dropped, drafts on CUDA keeping the entry's dtype, and a
NaN draft dropping one step's draft."""

from __future__ import annotations

import json

import pytest
import torch

from localspec.config import ModelSpec, PairSpec, SamplingParams, SpecConfig
from localspec.engine.loop import Engine
from localspec.heads.io import save_head
from localspec.proposers.base import Draft, DraftNoise, Proposer
from localspec.proposers.head import load_head_proposer
from localspec.testing import make_family_model, make_tiny_tokenizer
from tests.support import HELLO_PROMPT as PROMPT
from tests.support import make_head


def _greedy(target, proposer, k=3, max_new=24, name="head"):
    engine = Engine(target, {2})
    spec = SpecConfig(proposer="none" if proposer is None else name, k=k, sampler="torch")
    ids, last = [], None
    for event in engine.generate(list(PROMPT), SamplingParams(max_new_tokens=max_new), spec, proposer):
        ids.extend(t.token_id for t in event.tokens)
        last = event
    return ids, last


def test_bf16_target_runs_a_head(tiny_models, tmp_path):
    target, _ = tiny_models
    save_head(make_head(target, "eagle"), tmp_path / "head")
    bf16 = type(target)(target.config).to(torch.bfloat16).eval()
    bf16.load_state_dict(target.state_dict())
    proposer = load_head_proposer(tmp_path / "head", bf16, "cpu")
    _, last = _greedy(bf16, proposer, max_new=12)
    assert last.finish_reason != "error", last.error
    assert last.stats.drafted > 0


class _NanDraft(Proposer):
    name = "draft"

    def begin(self, prompt_ids, prompt_hidden):
        pass

    def propose(self, context_ids, k, sampling, generator):
        probs = torch.full((k, 320), float("nan"))
        return Draft(token_ids=[5] * k, probs=probs)

    def on_verified(self, num_accepted, emitted_ids, target_hidden):
        pass


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_non_finite_draft_drops_that_steps_draft(tiny_models, temperature):
    target, _ = tiny_models
    engine = Engine(target, set())
    sampling = SamplingParams(temperature=temperature, max_new_tokens=6, seed=1)
    plain = [t.token_id for e in engine.generate(list(PROMPT), sampling, SpecConfig(proposer="none")) for t in e.tokens]
    events = list(
        engine.generate(list(PROMPT), sampling, SpecConfig(proposer="draft", k=3, sampler="torch"), _NanDraft())
    )
    assert events[-1].finish_reason == "length", events[-1].error
    assert [t.token_id for e in events for t in e.tokens] == plain
    assert events[-1].stats.dropped_drafts == len(events) - 1 > 0  # the last step has no budget to draft
    assert events[-1].stats.drafted == 0


def _write(folder, vocab, family="qwen2", seed=0, tokenizer_swap=False):
    make_family_model(folder, family, vocab, seed=seed)
    make_tiny_tokenizer(folder)
    if tokenizer_swap:  # the same size, two ids mapped the other way round
        path = folder / "tokenizer.json"
        data = json.loads(path.read_text())
        vocab_map = data["model"]["vocab"]
        a, b = "a", "b"
        vocab_map[a], vocab_map[b] = vocab_map[b], vocab_map[a]
        path.write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def qwen_padded(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen")
    return _write(root / "target", 152064), _write(root / "draft", 151936, seed=1)


def _pair(target, draft, **kw):
    return PairSpec(
        name="qwen", target=ModelSpec(str(target)), draft=ModelSpec(str(draft)), default_proposer="draft", **kw
    )


@pytest.fixture(scope="module")
def padded_session(qwen_padded):
    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair

    loaded = load_pair(_pair(*qwen_padded), device="cpu")
    assert loaded.draft is not None and not loaded.notices
    return ChatSession(loaded)


def test_padded_vocabulary_draft_is_accepted_and_exact(padded_session):
    _check_padded(padded_session, "torch", 8)


@pytest.mark.slow
def test_padded_vocabulary_draft_through_the_triton_kernel(padded_session):
    _check_padded(padded_session, "triton", 4)  # interpreted on the CPU: ~10 s per call at V = 152,064


def _check_padded(session, sampler, max_new):
    proposer = session.make_proposer(SpecConfig(proposer="draft", k=3))
    spec = SpecConfig(proposer="draft", k=3, sampler=sampler)
    base = list(session.engine.generate(list(PROMPT), SamplingParams(max_new_tokens=max_new), SpecConfig("none")))
    events = list(session.engine.generate(list(PROMPT), SamplingParams(max_new_tokens=max_new), spec, proposer))
    assert events[-1].finish_reason == "length", events[-1].error
    assert [t.token_id for e in events for t in e.tokens] == [t.token_id for e in base for t in e.tokens]
    assert events[-1].stats.drafted > 0
    sampled = list(
        session.engine.generate(
            list(PROMPT), SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=0), spec, proposer
        )
    )
    assert sampled[-1].finish_reason == "length", sampled[-1].error
    draft = proposer.propose(
        list(PROMPT), 2, SamplingParams(temperature=1.0), DraftNoise(torch.Generator().manual_seed(0))
    )
    assert draft.probs.shape == (2, 152064)
    assert float(draft.probs[:, 151936:].abs().max()) == 0.0


def test_draft_with_other_tokenizer_is_dropped_before_its_weights_load(qwen_padded, tmp_path, monkeypatch):
    from localspec.models import loading

    target, _ = qwen_padded
    other = _write(tmp_path / "other", 151936, seed=2, tokenizer_swap=True)
    order = []
    real_load, real_check = loading.load_causal_lm, loading.check_same_tokenizer

    def spy_load(spec, what, device, role, progress=None):
        order.append(role)
        return real_load(spec, what, device, role, progress)

    def spy_check(*args):
        order.append("tokenizer check")
        return real_check(*args)

    monkeypatch.setattr(loading, "load_causal_lm", spy_load)
    monkeypatch.setattr(loading, "check_same_tokenizer", spy_check)
    loaded = loading.load_pair(_pair(target, other), device="cpu")
    assert order == ["tokenizer check", "target"]  # refused before any weights load; the target still loads
    assert loaded.draft is None and "draft" not in loaded.proposers and "ngram" in loaded.proposers
    assert len(loaded.notices) == 1 and str(other) in loaded.notices[0] and "tokenizer" in loaded.notices[0]


def test_draft_larger_than_target_vocabulary_is_dropped(qwen_padded):
    from localspec.models.loading import load_pair

    target, draft = qwen_padded
    loaded = load_pair(_pair(draft, target), device="cpu")  # the 152,064-row model drafting for the 151,936 one
    assert loaded.draft is None
    assert "152064" in loaded.notices[0] and "151936" in loaded.notices[0]


@pytest.mark.parametrize(
    "dtype,bf16_ok,want",
    [
        ("bfloat16", True, torch.bfloat16),
        ("float32", True, torch.float32),
        ("auto", True, torch.bfloat16),
        ("auto", False, torch.float16),
    ],
)
def test_drafts_on_cuda_keep_the_entry_dtype(monkeypatch, dtype, bf16_ok, want):
    from transformers import AutoModelForCausalLM

    from localspec.models import loading

    seen = {}

    class Fake(torch.nn.Module):
        def to(self, *args, **kwargs):
            return self

    def fake_from_pretrained(folder, **kwargs):
        seen.update(kwargs)
        return Fake()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(loading, "resolve_folder", lambda spec, what, progress=None: "/nowhere")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_ok)
    loading.load_causal_lm(ModelSpec("x/y", dtype=dtype), "draft", torch.device("cuda"), "draft")
    assert seen["dtype"] == want


def test_auto_dtype_by_device(monkeypatch):
    from localspec.models.loading import model_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert model_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert model_dtype("auto", torch.device("cpu")) == torch.float32
    assert model_dtype("float16", torch.device("cpu")) == torch.float16
