"""Chat layer: templates, truncation policy, detokenization, proposer choice."""

import pytest

from localspec.chat import IncrementalDetokenizer
from localspec.config import ConfigError, SamplingParams, SpecConfig
from localspec.engine.events import steps


def test_stream_fills_text_and_kinds(tiny_session):
    events = list(
        tiny_session.stream(
            [{"role": "user", "content": "hello there"}], SamplingParams(max_new_tokens=30), tiny_session.default_spec()
        )
    )
    tokens = [t for e in events for t in e.tokens]
    text = "".join(t.text for t in tokens)
    assert text == tiny_session.tokenizer.decode([t.token_id for t in tokens], skip_special_tokens=True)
    assert tiny_session.default_spec().proposer == "draft"


def test_empty_message_is_refused(tiny_session):
    for messages in ([], [{"role": "user", "content": "   "}]):
        with pytest.raises(ConfigError, match="empty"):
            tiny_session.prompt_ids(messages, 10)


def test_old_turns_dropped_then_long_message_cut(tiny_session):
    max_context = tiny_session.engine.max_context
    history = []
    for i in range(20):
        history += [
            {"role": "user", "content": f"question {i} " + "x" * 60},
            {"role": "assistant", "content": "answer " + "y" * 60},
        ]
    history.append({"role": "user", "content": "the latest question"})
    ids, notice = tiny_session.prompt_ids(history, 100)
    assert len(ids) <= max_context - 100 and "Older turns" in notice
    assert tiny_session.tokenizer.decode(ids).rstrip().endswith("the latest question<|im_end|>\n<|im_start|>assistant")
    huge = [{"role": "user", "content": "start " + "z" * 5000 + " the end"}]
    ids, notice = tiny_session.prompt_ids(huge, 100)
    assert len(ids) <= max_context - 100 and "only its end was kept" in notice
    assert "the end" in tiny_session.tokenizer.decode(ids)
    events = list(steps(tiny_session.stream(huge, SamplingParams(max_new_tokens=5), SpecConfig(proposer="none"))))
    assert sum(len(e.tokens) for e in events) == 5


def test_detokenizer_holds_back_partial_utf8(tiny_session):
    tok = tiny_session.tokenizer
    ids = tok.encode("é ok 😀!", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == "é ok 😀!" and "\ufffd" not in "".join(pieces)


def test_proposer_not_in_pair_is_refused(tiny_session):
    with pytest.raises(ConfigError, match="has no 'head' proposer"):
        tiny_session.make_proposer(SpecConfig(proposer="head"))


def test_the_verify_prior_is_timed_in_the_forward_setup_the_engine_runs(monkeypatch):
    """The adaptive controller's prior verify slope: the dtype decision's load-time timings are of the fast setup, so
    an engine on the exact setup (another attention path, the layer kernel) times its own forwards instead."""
    from types import SimpleNamespace

    import torch

    from localspec import chat
    from localspec.models import dtype_choice
    from localspec.models.dtype_choice import DtypeDecision, Timing
    from localspec.runtime.model_runner import FAST, exact_setup

    calls = []

    def timer(models, sizes, setups=None):
        calls.append((sizes, setups))
        return {"target": {1: 0.010, 4: 0.016}}

    monkeypatch.setattr(dtype_choice, "time_forwards", timer)
    decision = DtypeDecision("bfloat16", "measured", k=3, timings=(Timing("bfloat16", 0.020, 0.021, 0.0),))
    loaded = SimpleNamespace(dtype=decision, target=object(), spec=SimpleNamespace(k=3))
    exact = exact_setup(torch.bfloat16)
    plan = lambda setup, name: SimpleNamespace(setup=setup, setup_id=name)  # noqa: E731  (the plan's two fields read)
    assert chat._verify_prior(loaded, plan(exact, "exact")) == (0.010, 0.016, 4)
    assert calls == [((1, 4), {"target": exact})]
    assert chat._verify_prior(loaded, plan(FAST, "fast")) == (0.020, 0.021, 4) and len(calls) == 1  # load-time ones
