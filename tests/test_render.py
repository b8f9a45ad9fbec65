"""The renderer: spans by kind, escaping of model text, tooltips, stats panel and acceptance chart."""

from __future__ import annotations

import re
from dataclasses import replace
from html.parser import HTMLParser

from localspec.engine.events import StatsSnapshot, TokenEvent
from localspec.engine.metrics import PauseReason
from localspec.ui.render import (
    acceptance_chart_html,
    compare_html,
    escape,
    legend_html,
    stats_html,
    token_record,
    token_span,
    tokens_html,
    transcript_html,
)

HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(2)">',
    '"><b>bold</b>',
    "{{value}}",
    "${value}",
    "`x` @children",
]


class Collector(HTMLParser):
    """Collects the tags and text the browser would build from our HTML."""

    def __init__(self):
        super().__init__()
        self.tags, self.text, self.spans = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "span":
            self.spans.append(dict(attrs))

    def handle_data(self, data):
        self.text.append(data)


def parse(markup: str) -> Collector:
    collector = Collector()
    collector.feed(markup)
    collector.close()
    return collector


def crafted_stream() -> list[TokenEvent]:
    """Events as the engine would yield them, with model text that is HTML and template syntax."""
    return [
        TokenEvent(10, "accepted", 0.9, 0.8, text=HOSTILE[0]),
        TokenEvent(
            11,
            "resampled",
            0.4,
            rejected_token_id=99,
            rejected_target_prob=0.1,
            rejected_draft_prob=0.5,
            text=HOSTILE[1],
        ),
        TokenEvent(12, "bonus", 0.7, text=HOSTILE[2]),
        TokenEvent(13, "target", 0.6, text=HOSTILE[3]),
        TokenEvent(14, "accepted", 0.5, 1.0, text=HOSTILE[4]),
        TokenEvent(15, "target", 0.5, text=HOSTILE[5]),
    ]


def test_model_text_renders_as_text_never_as_markup():
    records = [token_record(t, decode=lambda ids: "<evil>") for t in crafted_stream()]
    markup = tokens_html(records)
    parsed = parse(markup)
    assert set(parsed.tags) == {"span"}, parsed.tags  # no script, img or b element was created
    assert "".join(parsed.text) == "".join(HOSTILE)  # the browser shows exactly the model's characters
    for raw in ("{{", "${", "<script", "<img", "`"):
        assert raw not in markup
    for span in parsed.spans:  # attributes cannot be broken out of
        assert set(span) == {"class", "tabindex", "data-tip"}


def test_span_classes_follow_the_event_kinds():
    markup = tokens_html([token_record(t) for t in crafted_stream()])
    kinds = re.findall(r'class="tok tok-(\w+)"', markup)
    assert kinds == ["accepted", "resampled", "bonus", "target", "accepted", "target"]


def test_colouring_off_keeps_text_and_marks_spans_plain():
    record = token_record(TokenEvent(1, "accepted", 0.9, 0.8, text="hi"))
    assert "tok-plain" in token_span(record, colour=False)
    assert "tok-plain" not in token_span(record, colour=True)
    assert "ls-subtle" in transcript_html([{"role": "assistant", "content": "hi", "tokens": [record]}], colour=False)


def test_tooltip_holds_probabilities_and_the_rejected_draft_token():
    accepted = token_record(TokenEvent(1, "accepted", 0.30, 0.60, text="a"))
    title = parse(token_span(accepted)).spans[0]["data-tip"]
    assert "p_target = 0.300" in title and "p_draft = 0.600" in title
    assert "min(1, p_target/p_draft) = 0.500" in title  # TokenEvent.acceptance_prob, not recomputed here
    assert title.splitlines()[0] == "token 'a' (id 1)"  # the card names its token, whitespace made visible
    newline = token_record(TokenEvent(3, "target", 0.9, text=" x\n"))
    assert parse(token_span(newline)).spans[0]["data-tip"].splitlines()[0] == "token ' x\\n' (id 3)"

    resampled = token_record(
        TokenEvent(
            2, "resampled", 0.4, rejected_token_id=7, rejected_target_prob=0.1, rejected_draft_prob=0.4, text="b"
        ),
        decode=lambda ids: f"<tok{ids[0]}>",
    )
    title = parse(token_span(resampled)).spans[0]["data-tip"]
    assert "'<tok7>'" in title  # decoded, and the attribute parser gives back the raw text: it was escaped
    assert "acceptance min(1, p_target/p_draft) = 0.250" in title


def test_rejected_token_falls_back_to_its_id_when_it_cannot_be_decoded():
    def broken(_ids):
        raise ValueError("no")

    record = token_record(
        TokenEvent(
            2, "resampled", 0.4, rejected_token_id=42, rejected_target_prob=0.1, rejected_draft_prob=0.4, text="b"
        ),
        decode=broken,
    )
    assert "id 42" in parse(token_span(record)).spans[0]["data-tip"]


def test_unknown_kind_is_rendered_as_target():
    assert 'class="tok tok-target"' in token_span({"kind": "<x>", "text": "t"})


def test_user_text_and_errors_are_escaped_in_the_transcript():
    turns = [
        {"role": "user", "content": HOSTILE[1]},
        {"role": "assistant", "content": "", "tokens": [], "finish_reason": "error", "error": HOSTILE[0]},
    ]
    parsed = parse(transcript_html(turns))
    assert "img" not in parsed.tags and "script" not in parsed.tags
    assert HOSTILE[1] in "".join(parsed.text) and HOSTILE[0] in "".join(parsed.text)


def test_stats_panel_shows_the_snapshot_numbers():
    stats = StatsSnapshot(
        drafted=12,
        accepted=9,
        emitted=15,
        target_forwards=5,
        elapsed_s=0.5,
        propose_s=0.1,
        score_s=0.3,
        sampler_s=0.1,
        per_position_drafted=(5, 4, 3),
        per_position_accepted=(5, 3, 1),
        k=3,
    )
    markup = stats_html(stats, "n-gram", 3)
    text = " ".join(parse(markup).text)
    assert "accepted draft tokens 9/12 (75%)" in text
    assert f"tokens per forward {stats.mean_acceptance_length:.2f}" in text
    assert "time per step 100 ms" in text  # (0.1 + 0.3 + 0.1) s over 5 forwards
    assert f"{stats.tokens_per_s:.1f}" in text
    assert "propose 100 ms" in text and "score 300 ms" in text and "sample 100 ms" in text
    widths = [float(w) for w in re.findall(r'class="ls-bar" style="width:([\d.]+)%"', markup)]
    assert widths == [round(r * 100, 1) for r in stats.per_position_acceptance]
    assert (
        stats_html(StatsSnapshot.from_dict(stats.to_dict()), "n-gram", 3) == markup
    )  # the stored form renders the same
    assert "n-gram · K=3" in text
    tree_text = " ".join(parse(stats_html(stats, "n-gram", 3, tree_nodes=8)).text)
    assert "n-gram · tree 8" in tree_text and "K=3" not in tree_text


def test_chart_without_drafts_is_left_out():
    assert acceptance_chart_html(StatsSnapshot()) == ""
    assert "Stats of the current answer" in stats_html(None)


def test_speculation_off_shows_only_what_applies():
    stats = StatsSnapshot(emitted=6, target_forwards=6, elapsed_s=1.0, score_s=0.6, predicted_speedup=1.4)
    text = " ".join(parse(stats_html(stats, "off", None, "stop")).text)
    assert "speculation off" in text and "finished" in text and "tokens/s 6.0" in text
    for absent in ("accepted", "draft", "tokens per forward", "forecast", "acceptance by"):
        assert absent not in text, absent


def test_every_figure_has_its_definition_beside_it():
    stats = StatsSnapshot(drafted=4, accepted=2, emitted=5, target_forwards=2, elapsed_s=1.0, score_s=0.2, k=2)
    markup = stats_html(replace(stats, predicted_speedup=1.7), "n-gram", 2)
    heads = re.findall(r"<th( title=\"[^\"]+\")?>", markup)
    assert len(heads) >= 6 and all(heads), heads  # each row's tooltip
    text = " ".join(parse(markup).text)
    assert "Compare with baseline measures the real speedup" in text  # the help line under the table


def test_the_stats_table_shows_measured_figures_and_the_forecast_only_among_the_explanations():
    stats = StatsSnapshot(
        drafted=40,
        accepted=30,
        emitted=50,
        target_forwards=12,
        elapsed_s=1.0,
        prefill_s=0.1,
        score_s=0.5,
        sampler_s=0.1,
        propose_s=0.1,
        k=3,
        predicted_speedup=5.21,
        first_token_s=0.15,
        plain_step_s=0.02,
        forecast_plain_steps=20.0,  # the answer's forecast: (0.1 + 50 · 0.02) / (0.1 + 20 · 0.02) = 2.20
    )
    markup = stats_html(stats, "n-gram", 3)
    table = " ".join(parse(markup.split('<details class="ls-help">')[0]).text)
    assert "5.21" not in table and "2.20" not in table and "forecast" not in table  # never among the measured
    assert "time to first token 150 ms" in table
    # 50 tokens over 0.7 s of steps against a plain step of 20 ms (50 tok/s): 71.4 / 50
    assert "against plain decoding 1.43× (71.4 tok/s of steps; plain steps on this machine 50.0 tok/s" in table
    explained = " ".join(parse(markup.split('<details class="ls-help">')[1]).text)
    assert "controller's forecast : 5.21× — a forecast, not a measurement" in explained.replace(
        "forecast:", "forecast :"
    )
    assert "forecast for this answer : 2.20× — a forecast, not a measurement" in explained.replace(
        "answer:", "answer :"
    )
    # the split adds up to the time after prefill (0.9 s): prefill + propose + score + sample + other = elapsed
    assert "other 200 ms (22%)" in " ".join(parse(markup).text)


def test_a_tree_is_counted_per_path_with_its_nodes_on_their_own_line():
    stats = StatsSnapshot.start(4)
    # two tree steps of 8 nodes and depth 3: 2 then 3 path positions accepted
    stats = stats.after_step(8, 2, 3, 0.0, 0.0, 0.0, depth=3).after_step(8, 3, 4, 0.0, 0.0, 0.0, depth=3)
    assert (stats.drafted, stats.accepted, stats.tree_nodes_drafted, stats.k) == (6, 5, 16, 3)
    assert stats.per_position_drafted[:3] == (2, 2, 2) and stats.per_position_accepted[:3] == (2, 2, 1)
    text = " ".join(parse(stats_html(stats, "n-gram", 4, tree_nodes=8)).text)
    assert "accepted depth 5/6 (83%)" in text and "tree nodes drafted 16" in text
    assert "acceptance by draft position (depth in the tree)" in text
    chain = StatsSnapshot.start(4).after_step(4, 1, 2, 0.0, 0.0, 0.0)
    assert (chain.drafted, chain.tree_nodes_drafted, chain.k) == (4, 0, 4)


def test_compare_panel_reports_speedup_and_identity():
    spec, base = {"tokens_per_s": 30.0}, {"tokens_per_s": 20.0}
    text = " ".join(parse(compare_html(spec, base, "n-gram", greedy=True, identical=True)).text)
    assert "1.50×" in text and "identical" in text
    text = " ".join(parse(compare_html(spec, base, greedy=True, identical=False, first_difference=4)).text)
    assert "differ from token 5" in text
    text = " ".join(parse(compare_html(spec, base, greedy=False)).text)
    assert "sampled" in text


def test_compare_shows_both_texts_with_the_first_difference_marked_and_the_measured_speedup_only():
    spec, base = {"tokens_per_s": 30.0, "predicted_speedup": 2.5}, {"tokens_per_s": 20.0}
    markup = compare_html(
        spec, base, "n-gram", True, False, 2, ["a", " b", " c", " d"], ["a", " b", " x", " d"], answer_index=1
    )
    parsed = parse(markup)
    assert markup.count('<mark class="ls-diff">') == 2 and "> c</mark>" in markup and "> x</mark>" in markup
    text = " ".join(parsed.text)
    assert "measured speedup 1.50×" in text and "forecast" not in text and "2.50" not in text  # measured only
    assert "compare of answer 2" in text


def test_legend_lists_every_kind_and_escape_is_total():
    legend = legend_html()
    for kind in ("accepted", "resampled", "bonus", "target"):
        assert f"ls-swatch-{kind}" in legend
    assert escape("<a href='x'>") == "&lt;a href=&#x27;x&#x27;&gt;"


# -- markdown ------------------------------------------------------------------------------------------------------
MARKDOWN_TOKENS = [
    "Here",
    " is",
    " a",
    " **Eff",
    "iciency**",
    " list",
    ":\n\n",
    "1.",
    " one",
    "\n2",
    ". *two*\n\n",
    "- a",
    "\n- b\n\n",
    "## Head",
    "ing\n\n",
    "```py",
    "thon\n",
    "def f",
    "(x):\n",
    "    return x",
    " * 2\n",
    "```\n\n",
    "| a | b |\n",
    "|---|---|\n",
    "| 1 | `2` |\n",
    "\n> quote",
    " end\n",
]
KINDS = ("accepted", "target", "bonus", "resampled")


def records_of(texts: list[str]) -> list[dict]:
    return [{"id": i, "text": t, "kind": KINDS[i % 4], "p_target": 0.5} for i, t in enumerate(texts)]


class Tree(HTMLParser):
    """For each token span: its text and the stack of elements it sits in."""

    def __init__(self):
        super().__init__()
        self.stack, self.spans, self.tags, self.syntax = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in ("br", "hr", "img"):
            self.stack.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        """Text inside a token span, a syntax-colour span between them or not: (text, kind, the tags around the token
        span); the syntax class of each piece goes to self.syntax."""
        at = next((i for i in range(len(self.stack) - 1, -1, -1) if is_token_span(self.stack[i])), None)
        if at is None:
            return
        self.spans.append((data, self.stack[at][1]["class"].split()[1][4:], [t for t, _ in self.stack[:at]]))
        inner = [a.get("class", "") for _, a in self.stack[at + 1 :]]
        self.syntax.append((data, inner[-1] if inner else None))


def is_token_span(element) -> bool:
    tag, attrs = element
    return tag == "span" and "tok" in attrs.get("class", "").split()


def tree(markup: str) -> Tree:
    parsed = Tree()
    parsed.feed(markup)
    parsed.close()
    return parsed


def fresh(records: list[dict]) -> list[dict]:
    return [dict(r) for r in records]  # equal records, other objects: no cached blocks apply


def test_markdown_renders_structure_and_every_span_keeps_its_token_kind():
    from localspec.ui.markdown import answer_markdown_html

    records = records_of(MARKDOWN_TOKENS)
    parsed = tree(answer_markdown_html(records))
    tags = {t for t, _ in parsed.tags}
    assert {"strong", "em", "ol", "ul", "li", "h2", "pre", "code", "table", "th", "td", "blockquote"} <= tags
    by_text = {}
    for text, kind, parents in parsed.spans:
        by_text.setdefault(text, []).append((kind, parents))
    # " **Eff" (resampled, index 3) colours " " outside and "Eff" inside <strong>; "iciency**" (accepted) only "iciency"
    assert ("resampled", ["p", "strong"]) in by_text["Eff"]
    assert ("accepted", ["p", "strong"]) in by_text["iciency"]
    assert by_text["one"] == [("accepted", ["ol", "li"])]
    assert [(k, p[-2:]) for k, p in by_text["(x):\n"]] == [("bonus", ["pre", "code"])]
    assert ["td", "code"] in [p[-2:] for _, p in by_text["2"]]  # the table's `2` (the code block has a 2 too)
    # every character of text the renderer shows came from a span of the token that produced it
    shown = "".join(text for text, _, _ in parsed.spans)
    for name in ("Eff", "iciency", "Heading", "def f(x):", "return x * 2", "quote end"):
        assert name in shown.replace("Head" + "ing", "Heading")
    code = [text for text, _, parents in parsed.spans if "pre" in parents]
    assert "".join(code) == "def f(x):\n    return x * 2\n"
    assert 'class="ls-code-lang">python<' in answer_markdown_html(records)


def test_code_is_coloured_by_syntax_inside_its_token_spans():
    """A fence's keywords, names, strings, numbers and comments get a syntax class inside the token spans: every
    character keeps its token's kind, a token across a keyword boundary is split by syntax, not by provenance."""
    from localspec.ui.markdown import answer_markdown_html

    texts = ["```py", "thon\nde", "f greet(name", "):\n    return ", '"hi" + ', "name * 2  # twice\n", "```\n"]
    parsed = tree(answer_markdown_html(records_of(texts)))
    pieces = [(text, kind, cls) for (text, kind, _), (_, cls) in zip(parsed.spans, parsed.syntax)]
    code = "".join(text for text, _, _ in pieces)
    assert code == 'def greet(name):\n    return "hi" + name * 2  # twice\n'
    marked = {text: cls for text, _, cls in pieces if cls}
    assert marked == {
        "de": "hl-kw",
        "f": "hl-kw",
        "greet": "hl-def",
        "return": "hl-kw",
        '"hi"': "hl-str",
        "2": "hl-num",
        "# twice": "hl-com",
    }
    assert [kind for text, kind, _ in pieces if text in ("de", "f")] == ["target", "bonus"]  # one keyword, two tokens
    plain = tree(answer_markdown_html(records_of(["```\n", "def f(): return 1\n", "```\n"])))
    assert not any(cls for _, cls in plain.syntax)  # no language named: no colours
    unknown = tree(answer_markdown_html(records_of(["```zzlang\n", "def f(): return 1\n", "```\n"])))
    assert not any(cls for _, cls in unknown.syntax)


def test_the_line_being_written_is_left_uncoloured_until_it_ends():
    from localspec.ui.markdown import answer_markdown_html

    streaming = tree(answer_markdown_html(records_of(["```python\n", "x = 1\n", "return 3"])))
    marked = {text: cls for text, cls in streaming.syntax if cls}
    assert marked == {"1": "hl-num"}  # "return 3" is on the unfinished line


def test_code_html_stays_inert_whatever_the_lexer_sees():
    from localspec.ui.markdown import answer_markdown_html

    html = answer_markdown_html(records_of(["```html\n", "<script>alert(1)</script> {x} $y\n", "```\n"]))
    assert "<script" not in html and "&lt;script&gt;" in html and "{x}" not in html and "$y" not in html


def test_markdown_spans_split_at_token_boundaries_inside_one_word():
    from localspec.ui.markdown import answer_markdown_html

    parsed = tree(answer_markdown_html(records_of(["**Ef", "fic", "iency**"])))
    assert [(t, k) for t, k, _ in parsed.spans] == [("Ef", "accepted"), ("fic", "target"), ("iency", "bonus")]
    assert all(p == ["p", "strong"] for _, _, p in parsed.spans)


def test_streaming_renders_every_prefix_as_a_fresh_render_would():
    """The cache of finished blocks changes nothing: each prefix, rendered incrementally, equals its fresh render."""
    from localspec.ui.markdown import answer_markdown_html

    records = records_of(MARKDOWN_TOKENS)
    for n in range(1, len(records) + 1):
        for colour in (True, False):
            assert answer_markdown_html(records[:n], colour) == answer_markdown_html(fresh(records[:n]), colour), n


def test_half_written_answers_render_sensibly():
    from localspec.ui.markdown import answer_markdown_html

    open_fence = tree(answer_markdown_html(records_of(["Code:\n\n", "```python\n", "x = 1\n", "y ="])))
    assert "pre" in {t for t, _ in open_fence.tags}  # an unclosed fence is a code block in progress
    assert [p[-2:] for t, _, p in open_fence.spans if "y =" in t] == [["pre", "code"]]
    half_table = tree(answer_markdown_html(records_of(["| a | b |\n", "|--"])))
    assert "table" not in {t for t, _ in half_table.tags}  # half a table shows as text
    assert "| a | b |" in "".join(t for t, _, _ in half_table.spans)
    table = tree(answer_markdown_html(records_of(["| a | b |\n", "|--|--|\n"])))
    assert "table" in {t for t, _ in table.tags}


def test_colour_off_shows_the_same_markdown_uncoloured():
    from localspec.ui.markdown import answer_markdown_html

    records = records_of(MARKDOWN_TOKENS)
    on, off = answer_markdown_html(records, True), answer_markdown_html(records, False)
    assert off.count("tok-plain") == on.count('class="tok ') > 0
    assert re.sub(r" tok-plain", "", off) == on


MARKDOWN_HOSTILE = [
    "```html\n<script>alert(1)</script>\n```\n",
    '<div onclick="alert(2)">\n<script>alert(3)</script>\n</div>\n\n',
    '![x](https://e.invalid/x.png" onerror="alert(4)) and ![y](x onerror=alert(5))\n\n',
    (
        "[click](javascript:alert(6)) [data](data:text/html;base64,PHNjcmlwdD5hbGVydCg3KTwvc2NyaXB0Pg==) "
        "[img](data:image/png;base64,AAAA) [ok](https://example.com/a?b={c}&d=${e})\n\n"
    ),
    "{{constructor.constructor('alert(8)')()}} ${alert(9)} @children `{{x}}` <img src=x onerror=alert(10)>\n",
]


def test_markdown_injection_stays_inert():
    from localspec.ui.markdown import answer_markdown_html

    markup = answer_markdown_html(records_of(MARKDOWN_HOSTILE))
    parsed = tree(markup)
    tags = {t for t, _ in parsed.tags}
    assert not tags & {"script", "img", "iframe", "object", "embed", "svg", "style"}, tags
    divs = [a for t, a in parsed.tags if t == "div"]
    assert all(a.get("class", "").startswith("ls-code") for a in divs), divs  # only our code-block frame
    links = [a for t, a in parsed.tags if t == "a"]
    assert [a["href"] for a in links] == ["https://example.com/a?b=%7Bc%7D&d=$%7Be%7D"]
    assert all(a["target"] == "_blank" and a["rel"] == "noopener noreferrer" for a in links)
    for t, attrs in parsed.tags:  # no event handler, style or script URL in any attribute
        assert not any(name.startswith("on") or name == "style" for name in attrs), (t, attrs)
        urls = [v for name, v in attrs.items() if name != "data-tip"]  # data-tip: the card's text (textContent)
        assert not any(v and ("javascript:" in v or "data:" in v) for v in urls), (t, attrs)
    for raw in ("{{", "${", "<script", "<img", "`"):
        assert raw not in markup.replace("&lt;script", "").replace("&lt;img", ""), raw
    shown = "".join(t for t, _, _ in parsed.spans)
    assert "<script>alert(1)</script>" in shown and "<script>alert(3)</script>" in shown  # shown as text
    assert "[click](javascript:alert(6))" in shown


def test_stats_panel_says_why_speculation_is_paused_and_what_runs():
    paused = PauseReason("chain", 4, 1.6, 1.3, 1.3 / 1.6, 30)
    stats = StatsSnapshot(emitted=10, target_forwards=9, k=0, paused=paused)
    runtime = {"device": "cuda:0", "dtype": "bfloat16", "quant": "int8", "sampler": "triton"}
    text = " ".join(parse(stats_html(stats, "n-gram", 4, runtime=runtime)).text)
    assert (
        "Speculation paused: a step with 4 draft tokens took 1.60× as long as a plain step and gave 1.30 tokens on "
        "average, so it would run at 0.81× the plain speed."
    ) in text
    assert "retries every 30 steps" in text
    assert "keep speculating anyway" in text  # the way out, beside the reason
    asked = " ".join(parse(stats_html(replace(stats, paused=replace(paused, k=1)), "n-gram", 4)).text)
    assert "You asked for K = 4; the controller tried 1 draft token (its best K)" in asked
    assert "cuda:0 · bfloat16 · int8 · sampler triton" in text
    assert "paused" not in " ".join(parse(stats_html(StatsSnapshot(emitted=3), "n-gram", 4)).text)
    assert stats_html(StatsSnapshot.from_dict(stats.to_dict()), "n-gram", 4) == stats_html(stats, "n-gram", 4)


def test_a_tool_call_renders_as_a_card_with_its_name_and_its_tokens_coloured():
    from localspec.ui.markdown import answer_markdown_html

    texts = [
        "Let me check.\n",
        "<tool_call>",
        '{"name": "get_',
        'weather", "arguments": ',
        '{"city": "Paris"}}',
        "</tool_call>",
    ]
    html = answer_markdown_html(records_of(texts))
    parsed = tree(html)
    card = [attrs for tag, attrs in parsed.tags if attrs.get("class") == "ls-tool-call"]
    assert card == [{"class": "ls-tool-call", "role": "group", "aria-label": "tool call get_weather"}]
    assert "<b>get_weather</b>" in html and "tool_call&gt;" not in html  # the markup is the card, not text
    inside = [(text, kind) for text, kind, parents in parsed.spans if "pre" in parents]
    assert "".join(text for text, _ in inside) == '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    by_kind: dict[str, str] = {}
    for text, kind in inside:  # records_of's kinds by index: accepted, target, bonus, resampled, accepted, …
        by_kind[kind] = by_kind.get(kind, "") + text
    assert by_kind == {
        "bonus": '{"name": "get_',
        "resampled": 'weather", "arguments": ',
        "accepted": '{"city": "Paris"}}',
    }
    before = [text for text, _, parents in parsed.spans if "p" in parents]
    assert "".join(before).strip() == "Let me check."


def test_a_tool_call_being_written_is_a_card_already_and_a_hostile_name_stays_text():
    from localspec.ui.markdown import answer_markdown_html

    streaming = answer_markdown_html(records_of(["<tool_call>", '{"name": "look', "up", '", "argu']))
    assert 'aria-label="tool call lookup"' in streaming
    hostile = answer_markdown_html(
        records_of(['<tool_call>{"name": "<script>x</script>{a}", "arguments": {}}</tool_call>'])
    )
    assert "<script" not in hostile and "{a}" not in hostile and "&lt;script&gt;" in hostile
    inline = answer_markdown_html(records_of(["say <tool_call> in a sentence"]))
    assert "ls-tool-call" not in inline  # only a line that begins with the tag opens a call
    trailing = answer_markdown_html(records_of(['<tool_call>{"name": "f", "arguments": {}}</tool_call> and more']))
    assert "ls-tool-call" not in trailing and "and more" in trailing  # text after it on its line: all of it shown
