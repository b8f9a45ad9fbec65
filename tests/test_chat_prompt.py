"""ChatSession.prompt_ids: every system message kept in order (or merged, and said so), truncation in one linear
pass, and PromptTooLong when truncation is not allowed."""

from __future__ import annotations

import pytest

from localspec.chat import PromptTooLong

ONE_SYSTEM_FIRST = (
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System role only at the start') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_every_system_message_is_kept_in_its_place(tiny_session):
    one = [{"role": "system", "content": "FIRST-SYS"}, {"role": "user", "content": "hello"}]
    two = one[:1] + [{"role": "system", "content": "SECOND-SYS"}] + one[1:]
    mid = one + [{"role": "assistant", "content": "hi"}, {"role": "system", "content": "MID-SYS"}]
    mid.append({"role": "user", "content": "again"})
    ids_one, _ = tiny_session.prompt_ids(one, 16)
    ids_two, notice = tiny_session.prompt_ids(two, 16)
    assert notice is None and len(ids_two) > len(ids_one)
    text = tiny_session.tokenizer.decode(ids_two)
    assert text.index("FIRST-SYS") < text.index("SECOND-SYS") < text.index("hello")
    text = tiny_session.tokenizer.decode(tiny_session.prompt_ids(mid, 16)[0])
    assert text.index("hi") < text.index("MID-SYS") < text.index("again")  # not moved to the front


def test_a_template_that_takes_one_system_message_gets_them_merged(tiny_session, monkeypatch):
    monkeypatch.setattr(tiny_session.tokenizer, "chat_template", ONE_SYSTEM_FIRST)
    messages = [
        {"role": "system", "content": "FIRST-SYS"},
        {"role": "user", "content": "hello"},
        {"role": "system", "content": "MID-SYS"},
        {"role": "user", "content": "again"},
    ]
    ids, notice = tiny_session.prompt_ids(messages, 16)
    text = tiny_session.tokenizer.decode(ids)
    assert "2 system messages were joined" in notice
    assert text.index("FIRST-SYS") < text.index("MID-SYS") < text.index("hello") < text.index("again")


def test_truncation_is_one_pass(tiny_session, monkeypatch):
    calls = {"template": 0}
    template = tiny_session._template

    def counting(messages, budget=None, tools=None):
        calls["template"] += 1
        return template(messages, budget, tools)

    monkeypatch.setattr(tiny_session, "_template", counting)
    turn = "word " * 60
    for count in (16, 128):
        calls["template"] = 0
        messages = [{"role": "system", "content": "SYSTEM-KEPT"}]
        for i in range(count):
            messages += [{"role": "user", "content": f"Q{i} {turn}"}, {"role": "assistant", "content": f"A{i} {turn}"}]
        messages.append({"role": "user", "content": "LATEST-KEPT"})
        ids, notice = tiny_session.prompt_ids(messages, 16)
        text = tiny_session.tokenizer.decode(ids)
        assert "SYSTEM-KEPT" in text and "LATEST-KEPT" in text and notice.startswith("Older turns")
        assert len(ids) <= tiny_session.engine.max_context - 16
        # the template runs a fixed few times (the whole, the overhead probe, one or two corrections), not per turn
        assert calls["template"] <= 6, (count, calls)


def test_kept_turns_are_the_newest_that_fit(tiny_session):
    """One pass must still keep as much as the step-by-step rule: adding the next older turn would not fit."""
    turn = "word " * 40
    messages = []
    for i in range(30):
        messages += [{"role": "user", "content": f"Q{i} {turn}"}, {"role": "assistant", "content": f"A{i} {turn}"}]
    messages.append({"role": "user", "content": "LATEST"})
    ids, _ = tiny_session.prompt_ids(messages, 16)
    text = tiny_session.tokenizer.decode(ids)
    first = min(j for j, m in enumerate(messages) if m["content"].split()[0] + " " in text)
    assert 0 < first < len(messages) - 1
    assert all(m["content"].split()[0] + " " in text for m in messages[first:-1]) and "LATEST" in text  # a suffix
    budget = tiny_session.engine.max_context - 16
    assert len(tiny_session._template(messages[first - 1 :])) > budget  # one more older message would not fit


def test_without_truncation_a_long_prompt_names_its_token_counts(tiny_session):
    messages = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(PromptTooLong) as info:
        tiny_session.prompt_ids(messages, 16, truncate=False)
    exc = info.value
    assert exc.prompt_tokens > exc.budget == tiny_session.engine.max_context - 16
    assert str(exc.prompt_tokens) in str(exc) and str(exc.budget) in str(exc)
