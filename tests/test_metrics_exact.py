"""/metrics counts what the responses' usage counts, exactly: a token tree drafts its depth (its nodes have a counter
of their own), a stop string's extra step is not counted, a non-streamed answer whose client left before its body
was sent counts no tokens; and a token's logprob equals its own entry in top_logprobs, bit for bit."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from localspec.server.admission import Admission
from localspec.server.metrics import MetricsRecorder

LOCAL = "http://127.0.0.1:8000"
REPEATS = [{"role": "user", "content": "abc abd abc abd abc abd abc abd abc abd abc abd abc"}]


@pytest.fixture()
def client(tiny_session):
    from fastapi.testclient import TestClient

    from localspec.server.app import create_app
    from localspec.server.runner import FixedBackend

    admission = Admission(4)
    metrics = MetricsRecorder(admission)
    backend = FixedBackend([tiny_session.loaded.spec], tiny_session.loaded.spec.name, tiny_session)
    with TestClient(create_app(backend, admission, metrics, None), base_url=LOCAL) as c:
        c.metrics = metrics
        yield c


def counters(metrics: MetricsRecorder) -> dict[str, float]:
    """Each localspec counter's total over its labels."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name.endswith("_total"):
                totals[sample.name] = totals.get(sample.name, 0) + sample.value
    return totals


def test_counters_are_the_sum_of_the_usages_with_trees_and_stop_strings(client):
    tree = {"proposer": "ngram", "k": 4, "tree_nodes": 8, "adaptive": False, "provenance": True}
    chain = {"proposer": "ngram", "k": 3, "tree_nodes": 0, "adaptive": False, "provenance": True}
    usages = []
    for extra in (
        {"localspec": tree, "temperature": 1.0, "seed": 1},  # sampled: the trees branch
        {"localspec": tree, "temperature": 1.0, "seed": 2},
        {"localspec": chain, "temperature": 0},
        {"localspec": tree, "temperature": 0, "stop": ["c"]},  # cut by a stop string: a step past it never counts
    ):
        body = {"model": "tiny", "messages": REPEATS, "max_tokens": 40, **extra}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        usages.append(r.json()["usage"])
    seen = counters(client.metrics)
    drafted = sum(u["drafted_tokens"] for u in usages)
    assert drafted > 0
    assert seen["localspec:spec_decode_num_draft_tokens_total"] == drafted
    assert seen["localspec:spec_decode_num_accepted_tokens_total"] == sum(u["accepted_tokens"] for u in usages)
    assert seen["localspec:spec_decode_num_accepted_tokens_per_pos_total"] == sum(u["accepted_tokens"] for u in usages)
    assert seen["localspec:generation_tokens_total"] == sum(u["completion_tokens"] for u in usages)
    tree_depths = sum(u["drafted_tokens"] for u in usages[:2] + usages[3:])
    assert seen["localspec:spec_decode_num_draft_tree_nodes_total"] > tree_depths  # siblings: nodes past the depth


def test_a_non_streamed_answer_never_sent_counts_no_tokens(tiny_session):
    """The route's collector of an answer whose client left (ClientGone) before the body was built."""
    from localspec.server.responses import Collector
    from localspec.server.schemas import parse_request

    request = parse_request({"model": "tiny", "messages": REPEATS, "max_tokens": 40}, "chat")
    collector = Collector(request, tiny_session.tokenizer)
    events = list(tiny_session.stream(REPEATS, request.sampling, tiny_session.default_spec(proposer="ngram")))
    for event in events[:-1]:
        collector.add(event)
    assert collector.released > 0  # the engine made tokens before the cancel
    gone = collector.outcome(12, "cancelled")
    assert (gone.finish_reason, gone.completion_tokens, gone.stats.drafted) == ("cancelled", 0, 0)
    collector.add(events[-1])
    body = collector.final(12)  # a body built is a body delivered
    sent = collector.outcome(12)
    assert sent.completion_tokens == body["usage"]["completion_tokens"] == collector.released


def test_a_tokens_logprob_equals_its_own_top_logprobs_entry(tiny_session):
    """Through the route's collector: each token found (by id) among its position's top 5 carries exactly that
    entry's value as its own logprob, in the chat shape and the completions shape."""
    from localspec.server.responses import Collector
    from localspec.server.schemas import parse_request

    body = {"model": "tiny", "messages": REPEATS, "max_tokens": 24, "temperature": 0.8, "seed": 3}
    request = parse_request({**body, "logprobs": True, "top_logprobs": 5}, "chat")
    spec = tiny_session.default_spec(proposer="ngram")
    tokens = [tok for event in tiny_session.stream(REPEATS, request.sampling, spec) for tok in event.tokens]
    collector = Collector(request, tiny_session.tokenizer)
    chat = collector.chat_logprobs(tokens)["content"]
    completion = collector.completion_logprobs(tokens, 0)["token_logprobs"]
    found = 0
    for tok, entry, own in zip(tokens, chat, completion):
        ids = [token_id for token_id, _lp in tok.top_logprobs]
        if tok.token_id in ids:
            found += 1
            listed = entry["top_logprobs"][ids.index(tok.token_id)]["logprob"]
            assert entry["logprob"] == listed == own, (tok.token_id, entry["logprob"], listed)
    assert found >= 5  # many sampled tokens are among the 5 most likely
