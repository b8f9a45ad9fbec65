"""`suffix` on /v1/completions: fill in the middle with the model's own FIM tokens (each family's style), a 400
naming `suffix` for a model that has none, and suffix refused where it means nothing (chat)."""

from __future__ import annotations

import copy

import pytest

from localspec.config import ConfigError
from localspec.models.fim import FIM_STYLES, fim_prompt_ids, fim_style

from .test_tools_api import api  # noqa: F401  (the fixture)

PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"


def with_tokens(tokenizer, tokens: list[str]):
    """A copy of the tiny byte-level tokenizer with these special tokens added (its model has spare rows)."""
    copied = copy.deepcopy(tokenizer)
    copied.add_special_tokens({"additional_special_tokens": tokens})
    return copied


@pytest.mark.parametrize("style", FIM_STYLES, ids=[s.family for s in FIM_STYLES])
def test_each_family_gets_prefix_suffix_middle_with_its_own_tokens(tiny_session, style):
    tokenizer = with_tokens(tiny_session.tokenizer, [style.prefix, style.suffix, style.middle])
    assert fim_style(tokenizer) == style
    ids = fim_prompt_ids(tokenizer, PREFIX, SUFFIX)
    token = tokenizer.convert_tokens_to_ids
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert ids == [token(style.prefix), *encode(PREFIX), token(style.suffix), *encode(SUFFIX), token(style.middle)]


def test_a_tokenizer_with_part_of_a_style_or_none_has_no_fim(tiny_session):
    assert fim_style(tiny_session.tokenizer) is None
    half = with_tokens(tiny_session.tokenizer, ["<fim_prefix>", "<fim_suffix>"])  # no <fim_middle>
    with pytest.raises(ConfigError, match="suffix .*has FIM tokens, and this model has none"):
        fim_prompt_ids(half, PREFIX, SUFFIX)


def test_completions_with_suffix_fill_in_the_middle(api, tiny_session, monkeypatch):  # noqa: F811
    style = FIM_STYLES[0]
    monkeypatch.setattr(
        tiny_session, "tokenizer", with_tokens(tiny_session.tokenizer, [style.prefix, style.suffix, style.middle])
    )
    seen = []
    stream_ids = tiny_session.stream_ids

    def spy(ids, *args, **kwargs):
        seen.append(list(ids))
        return stream_ids(ids, *args, **kwargs)

    monkeypatch.setattr(tiny_session, "stream_ids", spy)
    body = {"model": "tiny", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 6, "temperature": 0}
    r = api.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert seen[-1] == fim_prompt_ids(tiny_session.tokenizer, PREFIX, SUFFIX)
    assert r.json()["usage"]["prompt_tokens"] == len(seen[-1])
    assert api.post("/v1/completions", json={**body, "suffix": ""}).status_code == 200
    assert seen[-1] == tiny_session.tokenizer.encode(PREFIX)  # an empty suffix: a plain continuation


def test_suffix_without_fim_tokens_or_on_chat_or_not_text_is_a_400_naming_it(api):  # noqa: F811
    body = {"model": "tiny", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4}
    r = api.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix", r.text
    assert "has none" in r.json()["error"]["message"]
    r = api.post("/v1/completions", json={**body, "suffix": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "suffix": SUFFIX}
    r = api.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "/v1/completions" in r.json()["error"]["message"]
