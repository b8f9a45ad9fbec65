"""The renderer: spans by kind, escaping of model text, tooltips, stats panel and acceptance chart."""
from __future__ import annotations

import re
from html.parser import HTMLParser

from localspec.engine.events import StatsSnapshot, TokenEvent
from localspec.ui.render import (acceptance_chart_html, compare_html, escape, legend_html, stats_html, token_record,
                              token_span, tokens_html, transcript_html)

HOSTILE = ['<script>alert(1)</script>', '<img src=x onerror="alert(2)">', '"><b>bold</b>', "{{value}}", "${value}",
           "`x` @children"]


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
        TokenEvent(11, "resampled", 0.4, rejected_token_id=99, rejected_target_prob=0.1, rejected_draft_prob=0.5,
                   text=HOSTILE[1]),
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
        assert set(span) == {"class", "title"}


def test_span_classes_follow_the_event_kinds():
    markup = tokens_html([token_record(t) for t in crafted_stream()])
    kinds = re.findall(r'class="tok tok-(\w+)"', markup)
    assert kinds == ["accepted", "resampled", "bonus", "target", "accepted", "target"]


def test_colouring_off_keeps_text_and_marks_spans_plain():
    record = token_record(TokenEvent(1, "accepted", 0.9, 0.8, text="hi"))
    assert "tok-plain" in token_span(record, colour=False)
    assert "tok-plain" not in token_span(record, colour=True)
    assert "ls-nocolour" in transcript_html([{"role": "assistant", "content": "hi", "tokens": [record]}], colour=False)


def test_tooltip_holds_probabilities_and_the_rejected_draft_token():
    accepted = token_record(TokenEvent(1, "accepted", 0.30, 0.60, text="a"))
    title = parse(token_span(accepted)).spans[0]["title"]
    assert "p_target = 0.300" in title and "p_draft = 0.600" in title
    assert "min(1, p_target/p_draft) = 0.500" in title  # TokenEvent.acceptance_prob, not recomputed here

    resampled = token_record(TokenEvent(2, "resampled", 0.4, rejected_token_id=7, rejected_target_prob=0.1,
                                        rejected_draft_prob=0.4, text="b"), decode=lambda ids: f"<tok{ids[0]}>")
    title = parse(token_span(resampled)).spans[0]["title"]
    assert "'<tok7>'" in title  # decoded, and the attribute parser gives back the raw text: it was escaped
    assert "acceptance min(1, p_target/p_draft) = 0.250" in title


def test_rejected_token_falls_back_to_its_id_when_it_cannot_be_decoded():
    def broken(_ids):
        raise ValueError("no")

    record = token_record(TokenEvent(2, "resampled", 0.4, rejected_token_id=42, rejected_target_prob=0.1,
                                     rejected_draft_prob=0.4, text="b"), decode=broken)
    assert "id 42" in parse(token_span(record)).spans[0]["title"]


def test_unknown_kind_is_rendered_as_target():
    assert 'class="tok tok-target"' in token_span({"kind": "<x>", "text": "t"})


def test_user_text_and_errors_are_escaped_in_the_transcript():
    turns = [{"role": "user", "content": HOSTILE[1]},
             {"role": "assistant", "content": "", "tokens": [], "finish_reason": "error", "error": HOSTILE[0]}]
    parsed = parse(transcript_html(turns))
    assert "img" not in parsed.tags and "script" not in parsed.tags
    assert HOSTILE[1] in "".join(parsed.text) and HOSTILE[0] in "".join(parsed.text)


def test_stats_panel_shows_the_snapshot_numbers():
    stats = StatsSnapshot(drafted=12, accepted=9, emitted=15, target_forwards=5, elapsed_s=0.5, propose_s=0.1,
                          score_s=0.3, sampler_s=0.1, per_position_drafted=(5, 4, 3), per_position_accepted=(5, 3, 1),
                          k=3)
    markup = stats_html(stats, "n-gram", 3)
    text = " ".join(parse(markup).text)
    assert "Accepted 9/12 draft tokens (75%)" in text
    assert f"{stats.mean_acceptance_length:.2f} tokens / target forward" in text
    assert f"{stats.tokens_per_s:.1f}" in text
    assert "propose 100 ms" in text and "score 300 ms" in text and "sample 100 ms" in text
    widths = [float(w) for w in re.findall(r'class="ls-bar" style="width:([\d.]+)%"', markup)]
    assert widths == [round(r * 100, 1) for r in stats.per_position_acceptance]
    assert stats_html(stats.to_dict(), "n-gram", 3) == markup  # the stored dict form renders the same


def test_chart_without_drafts_says_so():
    assert "no drafts yet" in acceptance_chart_html(StatsSnapshot())
    assert "Stats of the current answer" in stats_html(None)


def test_compare_panel_reports_speedup_and_identity():
    spec, base = {"tokens_per_s": 30.0}, {"tokens_per_s": 20.0}
    text = " ".join(parse(compare_html(spec, base, "n-gram", greedy=True, identical=True)).text)
    assert "1.50×" in text and "identical" in text
    text = " ".join(parse(compare_html(spec, base, greedy=True, identical=False, first_difference=4)).text)
    assert "differ from token 5" in text
    text = " ".join(parse(compare_html(spec, base, greedy=False)).text)
    assert "sampled" in text


def test_legend_lists_every_kind_and_escape_is_total():
    legend = legend_html()
    for kind in ("accepted", "resampled", "bonus", "target"):
        assert f"tok-{kind}" in legend
    assert escape("<a href='x'>") == "&lt;a href=&#x27;x&#x27;&gt;"
