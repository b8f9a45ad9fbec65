"""Constrained decoding in the engine: a grammar's mask on the target's distribution (structured/grammar.py through
runtime/logits_processors.py), so speculative constrained output equals plain constrained output, greedy and seeded,
whatever the proposer drafts; the tool-call format read back from text (structured/tools.py)."""

from __future__ import annotations

import json

import pytest
import torch

from localspec.config import SamplingParams
from localspec.proposers.base import Draft, Proposer
from localspec.runtime.logits_processors import chain_paths, tree_paths
from localspec.runtime.tree import TokenTree
from localspec.structured.grammar import json_schema_constraint
from localspec.structured.tools import ToolSpec, ToolStream, parse_tool_calls

SCHEMA = {
    "type": "object",
    "properties": {"name": {"enum": ["ab", "cd"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def valid(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"name", "n"} and value["name"] in ("ab", "cd") and 0 <= value["n"] <= 99


def answer(session, spec, sampling, constraint=None, proposer=None):
    ids, _ = session.prompt_ids([{"role": "user", "content": "Give me the record as JSON."}], sampling.max_new_tokens)
    if proposer is not None:
        events = list(
            session.engine.generate(ids, sampling, spec, proposer, None, (session.grammars.processor(constraint),))
        )
    else:
        events = list(session.stream_ids(ids, sampling, spec, constraint=constraint))
    tokens = [tok.token_id for event in events for tok in event.tokens]
    answer.shapes = {event.plan.shape for event in events if event.plan is not None}
    return tokens, session.tokenizer.decode(tokens, skip_special_tokens=True), events[-1]


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=48)
SEEDED = SamplingParams(temperature=1.0, max_new_tokens=48, seed=7, seeded=True)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("proposer, tree_nodes", [("ngram", 0), ("draft", 0), ("ngram", 6)])
def test_constrained_speculation_equals_plain_constrained_decoding(tiny_session, sampling, proposer, tree_nodes):
    constraint = json_schema_constraint(SCHEMA, "response_format")
    plain, text, last = answer(tiny_session, tiny_session.default_spec(proposer="none"), sampling, constraint)
    assert last.finish_reason == "stop" and valid(text), text  # the random model writes the schema's JSON
    spec = tiny_session.default_spec(proposer=proposer, k=4, tree_nodes=tree_nodes)
    fast, _, last = answer(tiny_session, spec, sampling, constraint)
    assert fast == plain
    assert last.stats.drafted > 0  # speculation ran
    assert ("tree" in answer.shapes) == (tree_nodes > 0)


def test_without_the_constraint_the_random_model_writes_no_json(tiny_session):
    _, text, _ = answer(tiny_session, tiny_session.default_spec(proposer="none"), GREEDY)
    with pytest.raises(ValueError):
        json.loads(text)


class Stubborn(Proposer):
    """Drafts the same tokens whatever the grammar allows: most of them are forbidden."""

    name = "stubborn"

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, context_ids, k, sampling, noise):
        return Draft(self.tokens[:k])


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_drafts_the_grammar_forbids_are_rejected(tiny_session, sampling):
    constraint = json_schema_constraint(SCHEMA, "response_format")
    plain, text, _ = answer(tiny_session, tiny_session.default_spec(proposer="none"), sampling, constraint)
    stubborn = Stubborn(tiny_session.tokenizer.encode('{"name": "zz"}}}', add_special_tokens=False))
    drafted, _, last = answer(
        tiny_session, tiny_session.default_spec(proposer="ngram", k=4), sampling, constraint, stubborn
    )
    assert drafted == plain and valid(text)
    assert 0 < last.stats.accepted < last.stats.drafted  # '{"name": "' kept, the rest refused


@pytest.mark.parametrize("k", [4, 8])
def test_the_tokens_the_grammar_forces_are_drafted_whole_past_k_and_all_kept(tiny_session, k):
    ids, _ = tiny_session.prompt_ids([{"role": "user", "content": "JSON please"}], 48)
    constraint = json_schema_constraint(SCHEMA, "response_format")
    spec = tiny_session.default_spec(proposer="ngram", k=k, adaptive=False)
    first = next(iter(tiny_session.stream_ids(ids, GREEDY, spec, constraint=constraint)))
    assert first.plan.size == first.propose_token_num == first.accept_token_num == 10  # '{"name": "': 10 byte tokens
    assert "".join(tok.text for tok in first.tokens[:10]) == '{"name": "'  # all kept, then the bonus


def test_unseeded_soft_drafts_keep_to_the_grammar(tiny_session):
    constraint = json_schema_constraint(SCHEMA, "response_format")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48, seed=11)
    for _ in range(3):
        _, text, last = answer(tiny_session, tiny_session.default_spec(proposer="draft", k=3), sampling, constraint)
        assert last.finish_reason == "stop" and valid(text), text


def test_masked_rows_follow_their_paths_and_a_row_after_a_forbidden_draft_is_left(tiny_session):
    processor = tiny_session.grammars.processor(json_schema_constraint(SCHEMA, "response_format"))
    encode = lambda s: tiny_session.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    brace, quote, z = encode("{")[0], encode('"')[0], encode("z")[0]
    logits = torch.zeros(4, tiny_session.vocab_size)
    out = processor.process(logits, chain_paths([brace, z, quote]))
    allowed = torch.isfinite(out)
    assert allowed[0].nonzero().flatten().tolist() == [brace]  # the answer starts with '{'
    assert allowed[1].nonzero().flatten().tolist() == [quote]  # then '"' (compact JSON)
    assert bool(allowed[2].all()) and bool(allowed[3].all())  # after the forbidden 'z': never read, left as is
    processor.commit([brace])
    assert torch.isfinite(processor.process(logits[:1], [[]]))[0].nonzero().flatten().tolist() == [quote]


def test_tree_rows_follow_their_root_paths():
    tree = TokenTree([5, 6, 7, 8], [-1, 0, -1, 2])
    assert tree_paths(tree) == [[], [5], [5, 6], [7], [7, 8]]
    assert chain_paths([5, 6]) == [[], [5], [5, 6]]


# ---- tool calls read back -----------------------------------------------------------------------------------------
SPEC = ToolSpec((WEATHER, {"name": "get_time"}))
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_tool_calls_are_parsed_and_other_blocks_stay_text():
    content, calls = parse_tool_calls(f"Let me look.\n{CALL}\n<tool_call>not json</tool_call>", SPEC)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert content == "Let me look.\n\n<tool_call>not json</tool_call>"
    unknown = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse_tool_calls(unknown, SPEC) == (unknown, [])
    one = ToolSpec(SPEC.functions, parallel=False)
    assert len(parse_tool_calls(CALL + "\n" + CALL, one)[1]) == 1
    assert len(parse_tool_calls(CALL + "\n" + CALL, SPEC)[1]) == 2


def test_a_streamed_call_is_held_until_it_closes_and_text_is_not_held_longer_than_needed():
    stream = ToolStream(SPEC)
    text = "Sure <" + CALL[1:] + "\n" + CALL
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    content, calls = "", []
    for i, piece in enumerate(pieces):
        out, new = stream.push(piece, done=i == len(pieces) - 1)
        content += out
        calls += new
        assert "<tool" not in content
    assert content == "Sure " and [c.name for c in calls] == ["get_weather", "get_weather"]
    plain = ToolStream(SPEC)
    assert plain.push("a < b <tool", done=False) == ("a < b ", [])
    assert plain.push("kit", done=True) == ("<toolkit", [])


@pytest.mark.slow
def test_embedded_model_json_schema_answer_validates_and_speculation_equals_plain_bitwise(embedded_session):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
            "population": {"type": "integer", "minimum": 0},
        },
        "required": ["city", "country", "population"],
        "additionalProperties": False,
    }
    constraint = json_schema_constraint(schema, "response_format")
    session = embedded_session
    messages = [{"role": "user", "content": "Describe Paris as JSON with city, country and population."}]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=60)
    ids, _ = session.prompt_ids(messages, sampling.max_new_tokens)
    answers = {}
    for proposer in ("none", session.loaded.default_proposer):
        events = list(session.stream_ids(ids, sampling, session.default_spec(proposer=proposer), constraint=constraint))
        answers[proposer] = [tok.token_id for event in events for tok in event.tokens]
        assert events[-1].finish_reason == "stop"
    plain, fast = answers.values()
    assert fast == plain
    value = json.loads(session.tokenizer.decode(plain, skip_special_tokens=True))
    assert set(value) == {"city", "country", "population"} and isinstance(value["population"], int)


def test_a_constrained_answer_under_the_adaptive_default_drafts_its_free_parts_by_lookup_a_chosen_head_stays(
    embedded_session,
):
    # measured: the head's drafts of a constrained answer's free parts cost more than they add (chat.answer_parts);
    # a user who names the head for a fixed K still gets it
    from localspec.proposers.head import HeadProposer
    from localspec.proposers.ngram import NgramProposer

    session = embedded_session
    constraint = json_schema_constraint({"type": "object"}, "response_format")
    default = session.default_spec()
    assert default.adaptive and "head" in default.proposer
    proposer, processors = session.answer_parts(default, constraint=constraint)
    assert len(processors) == 1 and isinstance(proposer.inner, NgramProposer) and not proposer.wants_hidden
    fixed, _ = session.answer_parts(session.default_spec(proposer="head", adaptive=False, k=2), constraint=constraint)
    assert isinstance(fixed.inner, HeadProposer) and fixed.wants_hidden
    free, none = session.answer_parts(default)  # no constraint: the setting's own proposer
    assert not none and free.wants_hidden
