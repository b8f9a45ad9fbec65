"""In a real browser: Playwright driving Debian's headless Chromium against `python app.py`.

Skipped when /usr/bin/chromium is absent.
`LOCALSPEC_WRITE_SCREENSHOT=1 pytest -m slow tests/test_browser.py -k screenshot` (or `python -m tests.test_browser`)
rewrites assets/screenshot.png from the embedded default model.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from .apphelpers import REPO, AppProcess, tiny_models_yaml

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 800}
SCREENSHOT_PROMPT = "Write a Python function that reverses a string, in a code block, then a short bullet list of notes"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # starts the app in a subprocess, and Chromium
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture(scope="module")
def tiny_app(tiny_pair, tmp_path_factory):
    home = tmp_path_factory.mktemp("browser-home")
    process = AppProcess(tiny_models_yaml(tiny_pair, home), home).wait_ready()
    yield process
    process.stop()


def open_page(browser, url):
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(url)
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    wait_status(page, "ready")
    return page


def wait_status(page, text: str, timeout_ms: int = 90_000) -> None:
    """Wait until the status line contains text; on a timeout say what it showed instead."""
    try:
        page.wait_for_function(
            "([t]) => document.querySelector('#ls-status') && "
            "document.querySelector('#ls-status').innerText.includes(t)",
            arg=[text],
            timeout=timeout_ms,
        )
    except Exception as exc:
        shown = page.inner_text("#ls-status") if page.locator("#ls-status").count() else "(no status line)"
        raise AssertionError(f"status never showed {text!r}; it shows {shown!r} ({type(exc).__name__})") from None


def send_and_wait(page, text: str, answers_before: int, timeout_ms: int = 120_000) -> None:
    page.fill("#ls-message textarea", text)
    page.click("#ls-send")
    page.wait_for_function(
        "([n]) => document.querySelectorAll('#ls-transcript .ls-assistant').length > n && "
        "!document.querySelector('#ls-transcript .ls-cursor') && "
        "/Done|Stopped/.test(document.querySelector('#ls-status').innerText)",
        arg=[answers_before],
        timeout=timeout_ms,
    )


def kinds_in_last_answer(page) -> dict[str, int]:
    last = page.locator("#ls-transcript .ls-assistant").last
    return {kind: last.locator(f".tok-{kind}").count() for kind in ("accepted", "resampled", "bonus", "target")}


def set_max_tokens(page, value: int) -> None:
    page.fill("#ls-max-new input", str(value))
    page.locator("#ls-max-new input").blur()


SPLIT_PART = re.compile(r"(propose|score|sample|other|prefill) (\d+(?:\.\d+)?) (ms|s)\b")


def shown_stats(page) -> dict[str, str]:
    """The stats panel's rows, name → value as shown."""
    rows = page.eval_on_selector_all(
        "#ls-stats tr", "rows => rows.map(r => [r.querySelector('th').innerText, r.querySelector('td').innerText])"
    )
    return {name.strip(): value.strip() for name, value in rows}


def shown_time_split(page) -> dict[str, float]:
    """The time split under the stats (propose, score, sample, other, prefill), in seconds as shown."""
    text = page.inner_text("#ls-stats .ls-time-text")
    return {name: float(value) / (1000 if unit == "ms" else 1) for name, value, unit in SPLIT_PART.findall(text)}


def assert_the_time_split_adds_up(page) -> None:
    """The parts shown (prefill included) add up to the time tokens/s divides the tokens by, within what the
    figures' rounding leaves: half a millisecond per part, a twentieth of a token per second."""
    rows, split = shown_stats(page), shown_time_split(page)
    tokens, rate = int(rows["tokens"]), float(rows["tokens/s"])
    assert {"propose", "score", "sample", "other"} <= split.keys(), split
    answer_s = tokens / rate
    slack = 0.0005 * len(split) + answer_s * 0.05 / rate + 1e-6
    assert abs(sum(split.values()) - answer_s) <= slack, (split, rows)


def test_chat_in_the_browser(browser, tiny_app):
    page = open_page(browser, tiny_app.url)
    set_max_tokens(page, 64)
    page.get_by_role("radio", name="n-gram", exact=True).check()
    send_and_wait(page, "one two three one two three", 0)
    kinds = kinds_in_last_answer(page)
    assert sum(1 for n in kinds.values() if n) >= 2, kinds
    stats = page.inner_text("#ls-stats")
    match = re.search(r"accepted draft tokens\s+(\d+)/(\d+) \(", stats)
    assert match and int(match.group(1)) > 0, stats
    assert_the_time_split_adds_up(page)
    assert float(shown_stats(page)["time to first token"].split()[0]) > 0  # "12 ms" or "1.2 s"
    card = page.locator("#ls-transcript .tok").first.get_attribute("data-tip")
    assert "p_target" in card

    page.get_by_role("radio", name="off", exact=True).check()
    send_and_wait(page, "<script>window.pwned = 1</script><img src=x onerror='window.pwned=2'>", 1)
    kinds = kinds_in_last_answer(page)
    assert kinds["target"] > 0 and kinds["accepted"] == kinds["resampled"] == kinds["bonus"] == 0
    assert page.evaluate("window.pwned") is None  # the message was shown, not run
    assert "<script>window.pwned = 1</script>" in page.inner_text("#ls-transcript")
    assert page.locator("#ls-transcript script, #ls-transcript img").count() == 0

    assert page.locator("#ls-transcript .ls-subtle").count() == 1  # the default: faint underlines
    background = page.locator("#ls-transcript .tok").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert background in ("rgba(0, 0, 0, 0)", "transparent")
    page.close()


def test_the_repetition_penalty_in_the_window_changes_a_greedy_answer(browser, tiny_app):
    page = open_page(browser, tiny_app.url)
    set_max_tokens(page, 48)
    penalty = page.locator("#ls-repetition-penalty input[type=number]")
    if not penalty.is_visible():
        page.locator("#ls-settings").get_by_text("Sampling (", exact=False).first.click()

    def answer_with(value: str) -> str:  # greedy, in a new chat each time: only the penalty differs
        penalty.fill(value)
        penalty.press("Enter")
        page.click("#ls-new-chat")
        wait_status(page, "Cleared")
        send_and_wait(page, "one two three one two three", 0)
        return page.locator("#ls-transcript .ls-assistant").last.inner_text()

    plain = answer_with("1")
    penalised = answer_with("1.8")
    assert answer_with("1") == plain  # the same settings give the same answer
    assert penalised != plain
    page.close()


def test_the_page_says_ready_only_once_its_controls_show_the_pair(browser, tiny_app):
    """The page-load event sets the proposer, K and tree controls: until its answer lands, a choice would be undone,
    so the status line must not say ready before then (held back here by delaying the event queue)."""
    from localspec.ui.layout import CONNECTING

    page = browser.new_page(viewport=VIEWPORT)
    held, holding = [], [True]
    page.route("**/gradio_api/queue/join*", lambda route: held.append(route) if holding[0] else route.continue_())
    page.goto(tiny_app.url, wait_until="load")
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    for _ in range(600):  # Playwright calls the route handler while it waits, not during time.sleep
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the page-load event never asked the queue"
    status = page.inner_text("#ls-status")
    assert "ready" not in status and CONNECTING in status, status
    holding[0] = False
    for route in held:
        route.continue_()
    wait_status(page, "ready")
    assert page.get_by_role("radio", name="draft model", exact=True).is_checked()  # the tiny entry's default
    page.close()


def test_rescan_of_the_models_on_this_machine_in_the_browser(browser, tiny_app):
    page = open_page(browser, tiny_app.url)
    page.get_by_text("Models on this machine").click()
    page.click("#ls-rescan")
    page.wait_for_function(
        "() => /Rescanned: \\d+ model/.test(document.querySelector('#ls-found-msg').innerText)", timeout=60_000
    )
    assert page.locator("#ls-model input").input_value() == "tiny"  # the loaded pair stays selected
    page.close()


def test_tree_nodes_in_the_browser(browser, tiny_app):
    page = open_page(browser, tiny_app.url)
    box = page.locator("#ls-tree-nodes input[type=number]")
    assert box.input_value() == "0"  # the tiny entry's tree_nodes: chains of K
    set_max_tokens(page, 16)
    page.get_by_role("radio", name="n-gram", exact=True).check()
    box.fill("6")
    box.blur()
    send_and_wait(page, "one two three one two three", 0)
    assert page.locator("#ls-transcript .ls-assistant .ls-meta").last.inner_text().endswith("n-gram · tree 6")
    page.close()


def test_failed_switch_in_the_browser(browser, tiny_app):
    page = open_page(browser, tiny_app.url)
    page.locator("#ls-model input").click()
    page.get_by_role("option", name="missing").click()
    wait_status(page, "Could not switch")
    assert page.locator("#ls-model input").input_value() == "tiny"
    set_max_tokens(page, 8)
    send_and_wait(page, "are you still there", 0)
    assert sum(kinds_in_last_answer(page).values()) > 0
    page.close()


def test_enter_sends_and_a_saved_conversation_reopens(browser, tiny_app):
    page = open_page(browser, tiny_app.url)
    set_max_tokens(page, 24)
    box = page.locator("#ls-message textarea")
    box.fill("remember this")
    box.press("Shift+Enter")  # a new line, not a send
    box.type("conversation")
    assert box.input_value() == "remember this\nconversation"
    box.fill("remember this conversation")
    box.press("Enter")
    page.wait_for_function(
        "document.querySelectorAll('#ls-transcript .ls-assistant').length > 0 && "
        "!document.querySelector('#ls-transcript .ls-cursor')",
        timeout=120_000,
    )
    wait_status(page, "Done")
    kinds = kinds_in_last_answer(page)

    page.reload()  # a new session: the window starts empty, the conversation is in the saved list
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    assert page.locator("#ls-transcript .tok").count() == 0
    page.locator("#ls-conversation label").filter(has_text="remember this conversation").first.click()
    wait_status(page, "Opened")
    assert "remember this conversation" in page.inner_text("#ls-transcript")
    assert kinds_in_last_answer(page) == kinds  # the highlighting came back from the database
    page.close()


@pytest.fixture(scope="module")
def echo_app():
    """The window on a model-free session that answers with the user's message (localspec/ui/echo.py)."""
    from localspec.ui import build_app, launch_options
    from localspec.ui.echo import echo_manager

    from .apphelpers import free_port

    demo = build_app(echo_manager(0.01))
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(
        server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, share=False, quiet=True, **launch_options()
    )
    yield f"http://127.0.0.1:{port}/"
    demo.close()


MARKDOWN_PROMPT = """## Why speculate

Speculative decoding has **three** *benefits*:

1. **Efficiency**: fewer target forwards
2. Same output
- a bullet with `inline code`

> a quote

| K | speedup |
|---|---------|
| 4 | 1.6 |

```python
def squares(xs):
    return [x * x for x in xs]
```
"""
MARKDOWN_CODE = "def squares(xs):\n    return [x * x for x in xs]\n"


@pytest.fixture(scope="module")
def echo_store_app(tmp_path_factory):
    """The echo window with a ConversationStore: the saved-conversations sidebar shows."""
    from localspec.store.db import ConversationStore
    from localspec.ui import build_app, launch_options
    from localspec.ui.echo import echo_manager

    from .apphelpers import free_port

    store = ConversationStore(tmp_path_factory.mktemp("echo-store") / "conversations.db")
    demo = build_app(echo_manager(0.005), store)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(
        server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, share=False, quiet=True, **launch_options()
    )
    yield f"http://127.0.0.1:{port}/"
    demo.close()
    store.close()


def coloured(page, selector: str) -> int:
    """How many token spans under selector have a kind colour (a non-transparent background)."""
    return page.evaluate(
        """([sel]) => [...document.querySelectorAll(sel)].filter(e =>
        !['rgba(0, 0, 0, 0)', 'transparent'].includes(getComputedStyle(e).backgroundColor)).length""",
        [selector],
    )


def test_markdown_answer_keeps_coloured_tokens_in_the_browser(browser, echo_app):
    context = browser.new_context(viewport=VIEWPORT, permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    page.goto(echo_app)
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    wait_status(page, "ready")
    page.get_by_label("Full token colours").check()
    send_and_wait(page, MARKDOWN_PROMPT, 0)
    answer = "#ls-transcript .ls-assistant"
    for selector in (
        "li .tok",
        "strong .tok",
        "em .tok",
        "pre code .tok",
        "h2 .tok",
        "blockquote .tok",
        "td .tok",
        ":not(pre) > code .tok",
    ):
        assert coloured(page, f"{answer} {selector}") > 0, selector
    kinds = page.evaluate(f"[...document.querySelectorAll('{answer} pre code .tok')].map(e => e.classList[1])")
    assert {"tok-accepted", "tok-resampled", "tok-bonus", "tok-target"} <= set(kinds), kinds
    assert page.inner_text(f"{answer} .ls-code-lang") == "python"
    syntax = page.evaluate(
        f"[...document.querySelectorAll('{answer} pre code .tok [class^=hl-]')]"
        ".map(e => [e.className, e.textContent, e.closest('.tok').classList[1]])"
    )
    joined = {cls: "".join(text for c, text, _ in syntax if c == cls) for cls, _, _ in syntax}
    assert joined == {"hl-kw": "defreturnfor", "hl-def": "squares"}, syntax  # inside the token spans ("retu", "rn")
    assert {kind for _, _, kind in syntax} >= {"tok-accepted", "tok-target"}, syntax
    assert "Efficiency" in page.inner_text(f"{answer} li strong")
    assert "**" not in page.inner_text(answer) and "```" not in page.inner_text(answer)

    page.click(f"{answer} .ls-copy")
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN_CODE  # the plain code, no markup
    page.click(f"{answer} .ls-copy-md")
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN_PROMPT  # the answer's markdown source

    page.get_by_label("Full token colours").uncheck()
    page.wait_for_selector("#ls-transcript .ls-subtle", timeout=30_000)
    assert page.locator(f"{answer} li .tok").count() > 0 and coloured(page, f"{answer} .tok") == 0
    assert page.locator(f"{answer} pre code").count() == 1  # the same markdown, uncoloured
    context.close()


MARKDOWN_INJECTION = """Code: ```<script>alert('fence-inline')</script>```

```html
<script>alert('fence')</script>
```

<div onmouseover="alert('html-block')"><script>alert('block')</script></div>

![pic](https://e.invalid/x.png" onerror="alert('img')) ![y](x onerror=alert('img2'))
<img src=x onerror="alert('raw-img')">

[click me](javascript:alert('js-link')) [data](data:text/html,<script>alert('data')</script>) [ok](https://example.com/)

{{constructor.constructor('alert("braces")')()}} ${alert('dollar')} @children
"""


def test_a_tool_call_in_an_answer_shows_as_a_card_with_coloured_tokens(browser, echo_app):
    context, page = open_echo(browser, echo_app)
    page.get_by_label("Full token colours").check()
    send_and_wait(page, "Checking the weather." + TOOL_CALL, 0)
    card = page.locator("#ls-transcript .ls-assistant .ls-tool-call")
    card.wait_for(state="visible", timeout=5_000)
    assert card.get_attribute("aria-label") == "tool call get_weather"
    assert card.locator(".ls-tool-head").inner_text().strip() == "tool call get_weather"
    assert card.locator("pre code").inner_text() == '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
    assert card.locator(".tok").count() >= 3  # the call's tokens keep their spans and cards
    assert "tool_call>" not in page.locator("#ls-transcript .ls-assistant").inner_text()
    context.close()


def test_a_link_is_marked_as_a_link_not_as_a_token_underline(browser, echo_app):
    context, page = open_echo(browser, echo_app)
    send_and_wait(page, "Read [the guide](https://example.com/guide) before you start.", 0)
    link = page.locator("#ls-transcript .ls-assistant a")
    assert link.count() == 1 and link.locator(".tok").count() > 0  # the link's tokens keep their spans
    style = link.evaluate(
        """a => { const s = getComputedStyle(a), after = getComputedStyle(a, '::after');
        return [s.textDecorationLine, s.borderBottomStyle, after.content]; }"""
    )
    assert style == ["none", "dashed", '"↗"'], style  # subtle mode underlines tokens: a link is dashed, with ↗
    context.close()


def test_markdown_injection_stays_inert_in_the_browser(browser, echo_app):
    page = browser.new_page(viewport=VIEWPORT)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(echo_app)
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    wait_status(page, "ready")
    send_and_wait(page, MARKDOWN_INJECTION, 0)
    transcript = page.locator("#ls-transcript")
    for link in transcript.locator("a").all():
        assert link.get_attribute("href") == "https://example.com/"
        assert link.get_attribute("target") == "_blank" and link.get_attribute("rel") == "noopener noreferrer"
    # every event an injected handler could hang on, fired at every element of the transcript
    page.evaluate(
        "document.querySelectorAll('#ls-transcript .ls-assistant *').forEach(e => ['mouseover', "
        "'mouseenter', 'focus', 'error', 'load'].forEach(t => e.dispatchEvent(new Event(t))))"
    )
    transcript.locator(".ls-assistant .tok").filter(has_text=re.compile(r"\w")).first.hover()
    page.wait_for_timeout(500)
    assert dialogs == []
    assert transcript.locator("script, img, iframe, object, embed, svg").count() == 0
    handlers = page.evaluate(
        "[...document.querySelectorAll('#ls-transcript *')].flatMap(e => "
        "[...e.attributes].map(a => a.name)).filter(n => n.startsWith('on'))"
    )
    assert handlers == []
    shown = page.inner_text("#ls-transcript .ls-assistant")
    assert "<script>alert('fence')</script>" in shown and "[click me](javascript:alert('js-link'))" in shown
    assert "{{constructor" in shown and "${alert('dollar')}" in shown  # template braces shown, never evaluated
    page.close()


CODE = '\n\n```python\ndef twice(n=2):\n    return "x" * n  # every syntax colour, on each kind\n```\n'
TOOL_CALL = '\n\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>\n'
CONTRAST_JS = """() => {
    const rgb = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
    const lum = (c) => { const [r, g, b] = rgb(c).map(v => { v /= 255;
        return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
        return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
    const out = {};
    const ratio = (fg, bg) => {
        const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
        return (a + 0.05) / (b + 0.05);
    };
    for (const kind of ['accepted', 'resampled', 'bonus', 'target']) {
        const e = document.querySelector('#ls-transcript .ls-assistant .tok-' + kind);
        const s = getComputedStyle(e);
        out[kind] = ratio(s.color, s.backgroundColor);
    }
    for (const e of document.querySelectorAll('#ls-transcript .ls-assistant .tok [class^=hl-]')) {
        const tok = e.closest('.tok');
        const key = e.className + ' in ' + tok.classList[1];
        out[key] = Math.min(out[key] || 99, ratio(getComputedStyle(e).color, getComputedStyle(tok).backgroundColor));
    }
    return out;
}"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_token_colours_stay_legible_in_both_themes(browser, echo_app, theme):
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(f"{echo_app}?__theme={theme}")
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    wait_status(page, "ready")
    assert page.evaluate("document.body.classList.contains('dark')") == (theme == "dark")
    page.get_by_label("Full token colours").check()
    send_and_wait(
        page, "Some **bold** text and `code`, then more words to cycle every kind of token." + CODE + TOOL_CALL, 0
    )
    ratios = page.evaluate(CONTRAST_JS)
    assert len([k for k in ratios if k.startswith("hl-")]) >= 8, ratios  # the syntax colours on the token kinds
    assert all(ratio >= 4.5 for ratio in ratios.values()), ratios  # WCAG AA for body text
    page.close()


SCROLLER = "#ls-transcript .html-container"
AT_BOTTOM_JS = f"""() => {{ const s = document.querySelector('{SCROLLER}');
    return s.scrollHeight - s.scrollTop - s.clientHeight < 48; }}"""
LONG_MESSAGE = " ".join(f"word{i}" for i in range(700))


def open_echo(browser, url, **context_options):
    context = browser.new_context(**({"viewport": VIEWPORT} | context_options))
    page = context.new_page()
    page.goto(url, wait_until="load")
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    wait_status(page, "ready")
    return context, page


def test_the_conversation_follows_the_stream_unless_scrolled_up(browser, echo_app):
    context, page = open_echo(browser, echo_app)
    send_and_wait(page, LONG_MESSAGE, 0)
    assert page.evaluate(AT_BOTTOM_JS)  # followed the answer to its end
    page.fill("#ls-message textarea", LONG_MESSAGE)
    page.click("#ls-send")
    page.wait_for_selector("#ls-transcript .ls-cursor", timeout=30_000)
    page.locator("#ls-transcript").hover()
    page.mouse.wheel(0, -100_000)  # the reader scrolls up mid-answer
    page.wait_for_selector(".ls-jump:not([hidden])", timeout=10_000)

    page.fill("#ls-message textarea", "sent mid-answer")
    page.locator("#ls-message textarea").press("Enter")  # Enter while busy says so; the message stays
    page.wait_for_selector(".ls-busy:not([hidden])", timeout=10_000)
    assert "still streaming" in page.inner_text(".ls-busy")
    wait_status(page, "Done")
    assert page.input_value("#ls-message textarea") == "sent mid-answer"
    assert not page.evaluate(AT_BOTTOM_JS)  # the stream did not pull the reader down
    assert page.evaluate(f"document.querySelector('{SCROLLER}').scrollTop") < 200
    page.click(".ls-jump")
    assert page.evaluate(AT_BOTTOM_JS) and page.locator(".ls-jump[hidden]").count() == 1
    assert page.locator(".ls-busy[hidden]").count() == 1  # gone once the answer ended

    page.evaluate(f"document.querySelector('{SCROLLER}').scrollTop = 0")
    send_and_wait(page, "short one", 2)  # Send jumps to the bottom again
    assert page.evaluate(AT_BOTTOM_JS)
    context.close()


def test_provenance_popover_on_tap_at_phone_width(browser, echo_app):
    context, page = open_echo(browser, echo_app, viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    assert page.locator(".sidebar.open").count() == 0  # the conversation first: settings and list are drawers
    send_and_wait(page, "Some words here to cycle every kind of token, then a few more words.", 0)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no horizontal overflow
    resampled = page.locator("#ls-transcript .ls-assistant .tok-resampled").first
    resampled.tap()
    pop = page.locator("#ls-pop")
    pop.wait_for(state="visible", timeout=5_000)
    text = pop.inner_text()
    assert "resampled by the target" in text and "p_target = 0.400" in text
    assert text.startswith(f"token {resampled.inner_text()!r}")  # the card names the token it describes
    assert "rejected draft token" in text and "rejected: the target's top token differs" in text  # greedy words
    assert "min(1, p_target/p_draft)" not in text
    box = pop.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    page.locator("#ls-transcript .ls-user").first.tap()  # a tap elsewhere closes it
    pop.wait_for(state="hidden", timeout=5_000)

    page.locator("#ls-transcript .ls-assistant .ls-body").first.focus()  # keyboard: the answer, then its tokens
    page.keyboard.press("ArrowRight")
    pop.wait_for(state="visible", timeout=5_000)
    assert page.evaluate("document.activeElement.classList.contains('tok')")
    assert page.evaluate("document.activeElement.getAttribute('aria-describedby')") == "ls-pop"
    page.keyboard.press("Escape")
    pop.wait_for(state="hidden", timeout=5_000)
    page.locator(".sidebar .toggle-button").last.click()  # the settings drawer opens over the conversation
    page.wait_for_selector(".sidebar.open", timeout=5_000)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    context.close()


def test_the_compare_panel_belongs_to_its_answer(browser, echo_app):
    context, page = open_echo(browser, echo_app)
    send_and_wait(page, "compare these few words", 0)
    page.click("#ls-compare")
    wait_status(page, "Baseline done")
    panel = page.locator("#ls-compare-panel .ls-compare")
    assert panel.is_visible() and "compare of answer 1" in panel.inner_text()
    texts = page.locator("#ls-compare-panel .ls-compare-text")
    assert texts.count() == 2 and all("compare these few words" in t for t in texts.all_inner_texts())
    assert "measured speedup" in panel.inner_text()
    send_and_wait(page, "a new answer", 1)
    gone = "#ls-compare-panel .ls-compare"
    page.wait_for_selector(gone, state="detached", timeout=10_000)  # gone with the answer it compared
    page.click("#ls-compare")
    wait_status(page, "Baseline done")
    assert "compare of answer 2" in page.inner_text("#ls-compare-panel")
    page.click("#ls-regenerate")
    wait_status(page, "Done")
    page.wait_for_selector(gone, state="detached", timeout=10_000)
    context.close()


PALINDROME = "Write a palindrome checker in Python that ignores case, spaces and punctuation, with tests"


def test_saved_conversations_sidebar(browser, echo_store_app):
    context, page = open_echo(browser, echo_store_app)
    send_and_wait(page, PALINDROME, 0)
    page.click("#ls-clear")
    wait_status(page, "Cleared")
    send_and_wait(page, "A second conversation about tokenizers", 0)
    items = page.locator("#ls-conversation label")
    page.wait_for_function("document.querySelectorAll('#ls-conversation label').length === 2", timeout=10_000)
    assert PALINDROME in items.all_inner_texts()[1]  # the full title is in the list; CSS shortens it on screen
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280

    page.locator("#ls-search").get_by_role("textbox").fill("palindrome")
    page.wait_for_function("document.querySelectorAll('#ls-conversation label').length === 1", timeout=10_000)
    items.first.click()
    wait_status(page, "Opened")
    assert PALINDROME in page.inner_text("#ls-transcript .ls-user")
    assert page.locator("#ls-title").get_by_role("textbox").input_value() == PALINDROME

    page.locator("#ls-title").get_by_role("textbox").fill("Palindromes, renamed")
    page.locator("#ls-title").get_by_role("textbox").press("Enter")  # rename in place
    wait_status(page, "Renamed")
    page.locator("#ls-search").get_by_role("textbox").fill("")
    page.wait_for_function(
        "[...document.querySelectorAll('#ls-conversation label')].some(l => l.innerText.includes('renamed'))",
        timeout=10_000,
    )

    page.click("#ls-delete")  # delete with undo
    wait_status(page, "Undo brings it back")
    page.wait_for_function("document.querySelectorAll('#ls-conversation label').length === 1", timeout=10_000)
    page.click("#ls-undo")
    wait_status(page, "Brought back")
    page.wait_for_function("document.querySelectorAll('#ls-conversation label').length === 2", timeout=10_000)
    context.close()


AXE = REPO / ".test-js" / "node_modules" / "axe-core" / "axe.min.js"  # make setup-test installs it


def axe_violations(page) -> list[dict]:
    """axe-core's serious and critical violations of the page as it is: rule, impact, the first elements."""
    page.add_script_tag(path=str(AXE))
    return page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
            .filter(v => ['serious', 'critical'].includes(v.impact))
            .map(v => ({id: v.id, impact: v.impact, help: v.help,
                        nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))"""
    )


@pytest.mark.parametrize("width", [1280, 390])
def test_no_serious_accessibility_violations(browser, echo_store_app, width):
    if not AXE.exists():
        pytest.skip(f"axe-core is not installed at {AXE} (make setup-test installs it with npm)")
    context, page = open_echo(browser, echo_store_app, viewport={"width": width, "height": 844})
    send_and_wait(page, "Some **bold** words and `code` to check, then a few more words." + CODE + TOOL_CALL, 0)
    page.locator("#ls-transcript .ls-assistant .ls-tool-call").wait_for(state="visible", timeout=5_000)
    page.locator("#ls-transcript .ls-assistant .tok").first.hover()
    page.locator("#ls-pop").wait_for(state="visible", timeout=5_000)
    found = axe_violations(page)
    assert found == [], json.dumps(found, indent=1)
    context.close()


@pytest.mark.slow
def test_regenerate_and_edit_the_last_message_in_the_browser(browser, echo_app):
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(echo_app)
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    wait_status(page, "ready")
    send_and_wait(page, "first words here", 0)
    set_max_tokens(page, 2)
    page.click("#ls-regenerate")
    wait_status(page, "Done: 2 tokens")
    answers = page.locator("#ls-transcript .ls-assistant")
    assert answers.count() == 1 and "here" not in answers.first.inner_text()
    page.click("#ls-edit")
    wait_status(page, "Editing")
    assert page.input_value("#ls-message textarea") == "first words here"
    assert page.locator("#ls-transcript .ls-editing").count() == 2  # the exchange stays in view, marked
    assert "press Send to replace it" in page.inner_text("#ls-transcript .ls-edit-note")
    assert page.locator("#ls-cancel-edit").is_visible()
    page.fill("#ls-message textarea", "edited words")
    page.click("#ls-send")
    wait_status(page, "Done: 2 tokens")
    transcript = page.inner_text("#ls-transcript")
    assert answers.count() == 1 and "edited words" in transcript and "first words" not in transcript
    page.wait_for_function(
        "() => !document.querySelector('#ls-cancel-edit') || !document.querySelector('#ls-cancel-edit').offsetParent",
        timeout=10_000,
    )
    page.close()


def take_screenshot(browser, out: Path) -> Path:
    """A finished chat on the embedded default with its default proposer (n-gram lookup, else the EAGLE head) and
    "Keep speculating anyway" ticked, at 1280×800: the answer's code block renders with every token coloured. None
    when it has no code block with coloured tokens or no accepted token. (Adaptive K decides from this machine's
    measured costs, and where verify rows cost much, as on the AVX2-only Zen 3 EPYC, it can run a whole answer plain:
    a picture of accepted tokens then needs speculation kept on.)"""
    # a fresh data folder (no saved conversations, no logs left behind) sharing the converted-model cache
    from localspec.config import Environment

    cache = Path(Environment.read().home or REPO / ".localspec-home") / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="localspec-screenshot-"))
    (home / "cache").symlink_to(cache.resolve(), target_is_directory=True)
    app = AppProcess(REPO / "models.yaml", home).wait_ready(timeout_s=600)
    try:
        page = open_page(browser, app.url)
        set_max_tokens(page, 200)
        page.get_by_label("Keep speculating anyway").check()
        send_and_wait(page, SCREENSHOT_PROMPT, 0, timeout_ms=300_000)
        coloured_code = page.locator("#ls-transcript .ls-assistant pre .tok").count()
        # hover a token with something to see: a whitespace-only span (a newline) has no box to hover
        visible = page.locator("#ls-transcript .tok-accepted").filter(has_text=re.compile(r"\w"))
        if visible.count():
            visible.first.hover()
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        kinds = kinds_in_last_answer(page)
        page.close()
        return out if kinds["accepted"] and coloured_code else None
    finally:
        app.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.slow
def test_screenshot_of_the_embedded_default(browser, tmp_path):
    from localspec.config import Environment

    write = Environment.read().write_screenshot
    out = REPO / "assets" / "screenshot.png" if write else tmp_path / "screenshot.png"
    assert take_screenshot(browser, out) is not None, "the answer had no coloured code block or no accepted token"
    assert out.stat().st_size > 10_000


ECHO_SCREENSHOT_PROMPT = """Here is a function that reverses a string:

```python
def reverse(text: str) -> str:
    return text[::-1]
```

- slicing with a step of -1 walks the string backwards
- it works for any sequence, lists included
"""


def take_echo_screenshots(browser, folder: Path) -> list[Path]:
    """The window on the model-free echo session (with saved conversations) at 1400×900, light and dark, with a
    token's provenance card open: screenshot.png and screenshot-dark.png in folder."""
    import tempfile as _tempfile

    from localspec.store.db import ConversationStore
    from localspec.ui import build_app, launch_options
    from localspec.ui.echo import echo_manager

    from .apphelpers import free_port

    store = ConversationStore(Path(_tempfile.mkdtemp(prefix="localspec-shot-")) / "conversations.db")
    demo = build_app(echo_manager(0.005), store)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_options())
    out = []
    try:
        for theme, name in (("light", "screenshot.png"), ("dark", "screenshot-dark.png")):
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/?__theme={theme}", wait_until="load")
            page.wait_for_selector("#ls-message textarea", timeout=90_000)
            wait_status(page, "ready")
            if theme == "light":  # a second saved conversation for the list
                send_and_wait(page, "What does speculative decoding change about the output?", 0)
                page.click("#ls-clear")
                wait_status(page, "Cleared")
            send_and_wait(page, ECHO_SCREENSHOT_PROMPT, 0)
            page.locator("#ls-transcript .ls-assistant pre .tok-resampled").filter(
                has_text=re.compile(r"\w")
            ).first.hover()
            page.locator("#ls-pop").wait_for(state="visible", timeout=5_000)
            path = folder / name
            page.screenshot(path=str(path))
            out.append(path)
            page.close()
    finally:
        demo.close()
        store.close()
    return out


if __name__ == "__main__":
    import sys

    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        if "--echo" in sys.argv:  # the window on the echo session: no model needed
            print(take_echo_screenshots(chromium, REPO / "assets"))
        else:
            print(take_screenshot(chromium, REPO / "assets" / "screenshot.png"))
        chromium.close()
