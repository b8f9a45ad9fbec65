"""The chat window's paths that broke or confused (issue 47), in headless Chromium against a model-free window.

The window runs on echo sessions (localspec/ui/echo.py) with a conversation store, so each path is driven by text
the test chooses: a second pair that takes a while to load and to index its history (the switch race), messages
that stream slowly (Stop during Compare), wait until Stop (stopped before the first token) or read a long prompt
first (held before the first token until the test saw the window say so). The first-start test
runs `python app.py` on a fresh data folder.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from .test_browser import (
    AXE,
    CHROMIUM,
    CHROMIUM_ARGS,
    VIEWPORT,
    assert_the_time_split_adds_up,
    axe_violations,
    send_and_wait,
    shown_stats,
    shown_time_split,
    wait_status,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

LOAD_S = 1.5  # how long the second pair takes to load
INDEX_S = 1.0  # and then to index its saved history (what a real tokenizer over saved conversations takes)
SLOW_STEP_S = 0.1  # a "slow:" message streams two tokens per step
WAIT = "wait for Stop"  # a message that says nothing until Stop
COUNT = "how many messages"  # answered with the number of messages the model was given
LONG = " ".join(f"word{i}" for i in range(300))  # 256 tokens and more
READ = "read:"  # a message whose prompt is 4,000 tokens long, read in chunks of READ_STEP_S
READ_STEP_S = 0.15  # 8 chunks: the reading passes a second, and the window says so
READ_HELD = threading.Event()  # the first token of a READ message waits for it
FORECAST = "forecast:"  # a message whose stats carry the controller's forecast, FORECAST_X
FORECAST_X = 5.21


@pytest.fixture(scope="module")
def chromium():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


def window_session(pair, progress=lambda _m: None):
    """An echo session: `slow:` messages stream slowly, WAIT says nothing until Stop; the second pair loads for
    LOAD_S (saying its stages) and builds its history index for INDEX_S."""
    from localspec.engine.events import StepEvent
    from localspec.ui.echo import EchoSession

    class WindowEcho(EchoSession):
        def __init__(self) -> None:
            self.indexed = pair.name == "echo"
            super().__init__(0.005, pair)

        @property
        def tokenizer(self):
            if not self.indexed:  # the first use is the history index's build
                self.indexed = True
                time.sleep(INDEX_S)
            return self._tokenizer

        @tokenizer.setter
        def tokenizer(self, value) -> None:
            self._tokenizer = value

        def prompt_ids(self, messages, max_new_tokens, cancel=None):
            ids, notice = super().prompt_ids(messages, max_new_tokens, cancel=cancel)
            if self._text == COUNT:  # what the model was given, said back
                self._text = f"I see {len(messages)} messages"
            return ids, notice

        def stream_ids(self, ids, sampling, spec, cancel=None, first_source=()):
            if self._text.startswith(FORECAST):  # the controller's forecast, far above what the answer measures
                for event in self._stream(ids, sampling, spec, cancel, first_source):
                    yield replace(event, stats=replace(event.stats, predicted_speedup=FORECAST_X))
                return
            yield from self._stream(ids, sampling, spec, cancel, first_source)

        def _stream(self, ids, sampling, spec, cancel=None, first_source=()):
            self.step_s = SLOW_STEP_S if self._text.startswith("slow:") else 0.005
            reading = self._text.startswith(READ)
            self.prompt_tokens, self.step_s = (4000, READ_STEP_S) if reading else (0, self.step_s)
            if self._text == WAIT and cancel is not None:
                cancel.wait(60)
            for event in super().stream_ids(ids, sampling, spec, cancel, first_source):
                if reading and isinstance(event, StepEvent):
                    READ_HELD.wait(60)
                yield event

    if pair.name != "echo":
        progress(f"Loading {pair.name}…")
        time.sleep(LOAD_S)
        progress("Ready.")
    return WindowEcho()


def launch(manager, store=None):
    from localspec.ui import build_app, launch_options

    from .apphelpers import free_port

    demo = build_app(manager, store)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(
        server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, share=False, quiet=True, **launch_options()
    )
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture
def window(tmp_path):
    """A fresh window per test: two echo pairs (the second slow to load) and a conversation store."""
    from localspec.store.db import ConversationStore
    from localspec.ui.echo import ECHO_PAIR
    from localspec.ui.manager import ModelManager

    manager = ModelManager([ECHO_PAIR, replace(ECHO_PAIR, name="echo-b")], window_session)
    manager.load("echo")
    store = ConversationStore(tmp_path / "conversations.db")
    demo, url = launch(manager, store)
    yield url
    demo.close()
    store.close()


RECORD_STATUSES = """() => { const seen = window.lsStatuses = [];
    const note = () => { const s = document.querySelector('#ls-status');
        if (s && seen[seen.length - 1] !== s.innerText) seen.push(s.innerText); };
    new MutationObserver(note).observe(document.body, {childList: true, subtree: true, characterData: true}); }"""


def open_window(browser, url, **context_options):
    context = browser.new_context(**({"viewport": VIEWPORT} | context_options))
    page = context.new_page()
    page.goto(url, wait_until="load")
    page.wait_for_selector("#ls-message textarea", timeout=90_000)
    wait_status(page, "ready")
    page.evaluate(RECORD_STATUSES)
    return context, page


def compared(page, text: str) -> None:
    """Send text, then Compare with baseline, and wait for both."""
    send_and_wait(page, text, 0)
    page.click("#ls-compare")
    wait_status(page, "Baseline done")


def box(page, selector: str) -> dict:
    return page.locator(selector).bounding_box()


# ---- the four broken paths -------------------------------------------------------------------------------------


def test_a_long_compare_scrolls_inside_its_panel(chromium, window, tmp_path):
    context, page = open_window(chromium, window)
    compared(page, LONG)
    panel = page.locator("#ls-compare-panel .ls-compare")
    assert panel.evaluate("e => getComputedStyle(e).overflowY") in ("auto", "scroll")
    assert panel.evaluate("e => e.scrollHeight > e.clientHeight")  # its content scrolls inside the box
    panel_bottom = box(page, "#ls-compare-panel")["y"] + box(page, "#ls-compare-panel")["height"]
    assert box(page, "#ls-compare-panel .ls-compare")["height"] <= box(page, "#ls-compare-panel")["height"] + 1
    assert panel_bottom <= box(page, "#ls-status")["y"] + 1  # nothing of it under the status line
    assert panel_bottom <= box(page, "#ls-compose")["y"] + 1  # nor under Send and Stop
    page.click("#ls-send", trial=True)  # Send can be clicked: nothing covers it
    page.screenshot(path=str(tmp_path / "compare-panel.png"))
    context.close()


def test_one_switch_asked_from_two_tabs_loads_once_and_both_say_so(chromium, window):
    contexts, pages = zip(*(open_window(chromium, window) for _ in range(2)))
    for page in pages:  # each asks for the second pair; the second ask lands while the first loads
        page.locator("#ls-model input").click()
        page.get_by_role("option", name="echo-b").click()
        wait_status(page, "echo-b")
    for page in pages:
        wait_status(page, "Loaded echo-b")
        assert page.locator("#ls-model input").input_value() == "echo-b"
        statuses = page.evaluate("window.lsStatuses")
        assert not any("Could not switch" in s for s in statuses), statuses
    for context in contexts:
        context.close()


STOP_COLOUR = "() => getComputedStyle(document.querySelector('#ls-stop')).backgroundColor"


def test_stop_ends_a_compare(chromium, window):
    context, page = open_window(chromium, window)
    text = "slow: " + " ".join(f"w{i}" for i in range(60))
    send_and_wait(page, text, 0)
    page.add_style_tag(content="* { transition: none !important; }")  # colours read as they are, not fading
    page.mouse.move(1, 1)  # no hover colour on the buttons
    idle = page.evaluate(STOP_COLOUR)
    page.click("#ls-compare")
    page.wait_for_function(
        "/so far/.test(document.querySelector('#ls-compare-panel').innerText)", timeout=30_000
    )  # the baseline streams, in the panel
    assert page.evaluate(STOP_COLOUR) != idle  # Stop is live while the baseline streams
    page.click("#ls-stop")
    wait_status(page, "Baseline stopped after")
    page.wait_for_timeout(500)  # nothing left to overwrite it
    status = page.inner_text("#ls-status")
    assert "Baseline stopped after" in status and "Stopping" not in status, status
    panel = page.inner_text("#ls-compare-panel")
    assert "stopped early" in panel and "differ" not in panel, panel
    assert page.locator("#ls-compare-panel .ls-cursor").count() == 0
    page.mouse.move(1, 1)
    page.locator("#ls-message textarea").focus()  # nor a focus colour
    assert page.evaluate(STOP_COLOUR) == idle  # and idle again
    context.close()


def test_the_window_works_from_the_keyboard_and_names_its_controls(chromium, window):
    context, page = open_window(chromium, window)
    send_and_wait(page, "a conversation to reopen", 0)
    page.click("#ls-clear")
    wait_status(page, "Cleared")
    page.reload(wait_until="load")
    wait_status(page, "ready")
    page.locator("#ls-search").get_by_role("textbox").focus()
    page.keyboard.press("Tab")  # into the saved list
    assert page.evaluate("document.activeElement.closest('#ls-conversation') !== null")
    page.keyboard.press("Space")
    wait_status(page, "Opened")
    assert "a conversation to reopen" in page.inner_text("#ls-transcript")

    page.keyboard.press("Tab")
    page.get_by_role("radio", name="n-gram", exact=True).focus()  # after a key: a keyboard focus
    ring = (
        page.locator("#ls-proposer label")
        .filter(has=page.locator("input:focus"))
        .evaluate("e => [getComputedStyle(e).outlineStyle, parseFloat(getComputedStyle(e).outlineWidth)]")
    )
    assert ring[0] != "none" and ring[1] >= 2, ring

    assert page.get_by_role("button", name="Toggle Sidebar").count() == 0
    assert page.get_by_role("button", name="Show or hide the conversations").count() == 1
    assert page.get_by_role("button", name="Show or hide settings and stats").count() == 1
    assert page.get_by_role("textbox", name="Textbox").count() == 0
    assert page.get_by_role("textbox", name="Message").count() == 1
    assert page.get_by_role("textbox", name="Search conversations").count() == 1
    context.close()


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 390])
def test_no_serious_accessibility_violations_with_a_compare(chromium, window, width):
    if not AXE.exists():
        pytest.skip(f"axe-core is not installed at {AXE} (make setup-test installs it with npm)")
    context, page = open_window(chromium, window, viewport={"width": width, "height": 844})
    compared(page, LONG)
    page.add_style_tag(content="* { transition: none !important; }")  # colours as they are, not half faded
    found = axe_violations(page)
    assert found == [], json.dumps(found, indent=1)
    context.close()


# ---- what confused ---------------------------------------------------------------------------------------------


def test_a_new_answer_takes_the_old_compare_away_while_it_streams(chromium, window):
    context, page = open_window(chromium, window)
    compared(page, "compare these words")
    page.fill("#ls-message textarea", "slow: " + " ".join(f"w{i}" for i in range(40)))
    page.click("#ls-send")
    page.wait_for_selector("#ls-transcript .ls-cursor", timeout=30_000)
    assert not page.locator("#ls-compare-panel .ls-compare").is_visible()  # while the new answer streams
    context.close()


def test_the_stats_table_shows_measured_figures_and_the_forecast_only_explained(chromium, window):
    context, page = open_window(chromium, window)
    send_and_wait(page, f"{FORECAST} a few words to stream", 0)
    table = page.inner_text("#ls-stats .ls-stats-table")
    assert "forecast" not in table and f"{FORECAST_X:.2f}" not in table, table  # measured figures only
    assert "tokens/s" in table
    help_list = page.locator("#ls-stats details.ls-help")
    assert not help_list.locator(".ls-forecast").is_visible()  # inside the closed explanations
    help_list.locator("summary").click()
    forecast = help_list.locator(".ls-forecast").inner_text()
    assert f"{FORECAST_X:.2f}×" in forecast and "a forecast, not a measurement" in forecast, forecast
    context.close()


def test_a_long_prompt_says_it_is_being_read_then_answers(chromium, window):
    READ_HELD.clear()
    context, page = open_window(chromium, window)
    page.fill("#ls-message textarea", f"{READ} the pasted document")
    page.click("#ls-send")
    try:
        wait_status(page, "Reading the prompt…", 30_000)  # after a second of reading; the answer is held till then
    finally:
        READ_HELD.set()
    shown = page.inner_text("#ls-status")
    assert re.fullmatch(r"Reading the prompt… \d,\d{3} / 4,000 tokens \(\d+ %\)", shown.strip()), shown
    wait_status(page, "Done")
    assert f"{READ} the pasted document" in page.locator("#ls-transcript .ls-assistant").last.inner_text()
    statuses = page.evaluate("window.lsStatuses")
    assert "Reading the prompt" not in statuses[-1] and "Done" in statuses[-1], statuses
    reading_s = 8 * READ_STEP_S  # 4,000 tokens in chunks of 512, one chunk per READ_STEP_S
    first_token = shown_stats(page)["time to first token"]
    assert float(first_token.split()[0]) / (1000 if first_token.endswith("ms") else 1) >= reading_s, first_token
    assert shown_time_split(page)["prefill"] >= reading_s
    assert_the_time_split_adds_up(page)
    context.close()


NONE_CHOSEN = (  # the list shows, nothing chosen in it
    "document.querySelectorAll('#ls-conversation label').length && "
    "!document.querySelector('#ls-conversation input:checked')"
)


def reopen(page) -> None:
    """A fresh page (nothing open, nothing chosen), then its conversation (the only one saved) opened from the list."""
    page.reload(wait_until="load")
    wait_status(page, "ready")
    page.evaluate(RECORD_STATUSES)
    page.wait_for_function(NONE_CHOSEN, timeout=10_000)  # else a click on it would change nothing
    page.locator("#ls-conversation label").first.click()
    wait_status(page, "Opened")


def test_deleting_the_open_conversation_takes_it_off_the_window(chromium, window):
    context, page = open_window(chromium, window)
    send_and_wait(page, "something to forget", 0)
    reopen(page)
    page.click("#ls-delete")
    wait_status(page, "Undo brings it back")
    assert "something to forget" not in page.inner_text("#ls-transcript")
    assert page.locator("#ls-title").get_by_role("textbox").input_value() == ""
    send_and_wait(page, COUNT, 0)
    assert "I see 1 messages" in page.inner_text("#ls-transcript")  # not the deleted history
    page.locator("#ls-undo").wait_for(state="hidden", timeout=30_000)  # the offer ends with its time
    assert "Undo brings it back" not in page.evaluate("window.lsStatuses").pop()
    context.close()


def test_clear_leaves_no_title(chromium, window):
    context, page = open_window(chromium, window)
    send_and_wait(page, "a titled conversation", 0)
    reopen(page)
    assert page.locator("#ls-title").get_by_role("textbox").input_value() == "a titled conversation"
    page.click("#ls-clear")
    wait_status(page, "Cleared")
    page.wait_for_function("!document.querySelector('#ls-title textarea, #ls-title input').value", timeout=10_000)
    page.wait_for_function(NONE_CHOSEN, timeout=10_000)
    context.close()


def test_stop_before_the_first_token_says_so(chromium, window):
    context, page = open_window(chromium, window)
    page.fill("#ls-message textarea", WAIT)
    page.click("#ls-send")
    page.wait_for_selector("#ls-transcript .ls-cursor", timeout=30_000)
    page.click("#ls-stop")
    wait_status(page, "Stopped")
    status = page.inner_text("#ls-status")
    assert "before the first token" in status and "0 tokens" not in status, status
    context.close()


def test_search_finds_any_message_and_says_when_nothing_matches(chromium, window):
    context, page = open_window(chromium, window)
    send_and_wait(page, "about tokenizers", 0)
    search = page.locator("#ls-search").get_by_role("textbox")
    search.fill("zebra")
    page.wait_for_function(
        "/No conversation holds “zebra”/.test(document.querySelector('#ls-conversation').innerText)",
        timeout=10_000,
    )
    search.fill("token")
    page.wait_for_function("document.querySelectorAll('#ls-conversation label').length === 1", timeout=10_000)
    assert "No conversation" not in page.inner_text("#ls-conversation")
    send_and_wait(page, "and what of giraffes", 1)  # a word that is in a later message, not in the title
    search.fill("giraffes")
    page.wait_for_function("document.querySelectorAll('#ls-conversation label').length === 1", timeout=10_000)
    assert "about tokenizers" in page.inner_text("#ls-conversation")
    context.close()


def test_the_phone_drawer_closes_once_a_conversation_is_chosen(chromium, window):
    context, page = open_window(chromium, window, viewport={"width": 390, "height": 844}, has_touch=True)
    send_and_wait(page, "a chat to pick", 0)
    page.reload(wait_until="load")
    wait_status(page, "ready")
    page.wait_for_function(NONE_CHOSEN, timeout=10_000)
    page.locator("#ls-sidebar .toggle-button").click()
    page.wait_for_selector("#ls-sidebar.open", timeout=5_000)
    page.locator("#ls-conversation label").first.click()
    wait_status(page, "Opened")
    page.wait_for_selector("#ls-sidebar.open", state="detached", timeout=5_000)
    assert "a chat to pick" in page.inner_text("#ls-transcript")
    context.close()


def stop_strings_box(page):
    """The Stop strings box, its closed Sampling accordion opened first."""
    box = page.locator("#ls-stop-strings textarea")
    if not box.is_visible():
        page.locator("#ls-settings").get_by_text("Sampling (", exact=False).first.click()
        box.wait_for(state="visible", timeout=5_000)
    return box


KEPT_SETTINGS = "localStorage.getItem('localspec-settings')"


def change_setting(page, change) -> None:
    """Make a change to a setting, leave its box, and wait until the window has it: the browser keeps the settings
    on each change the app sees, so a send after this one carries the new value."""
    before = page.evaluate(KEPT_SETTINGS)
    change()
    page.keyboard.press("Tab")
    page.wait_for_function(f"{KEPT_SETTINGS} !== {json.dumps(before)}", timeout=10_000)


def test_a_system_prompt_made_default_starts_the_next_new_chat_and_stop_strings_cut_the_answer(chromium, window):
    context, page = open_window(chromium, window)
    page.fill("#ls-system textarea", "Answer in French.")
    send_and_wait(page, COUNT, 0)
    assert "I see 2 messages" in page.inner_text("#ls-transcript")  # the system prompt, then the message
    page.click("#ls-system-default")
    wait_status(page, "new chats start with this system prompt")
    page.click("#ls-new-chat")
    page.wait_for_function("!document.querySelector('#ls-transcript .ls-msg')", timeout=10_000)
    assert page.locator("#ls-system textarea").input_value() == "Answer in French."
    send_and_wait(page, COUNT, 0)
    assert "I see 2 messages" in page.inner_text("#ls-transcript")
    change_setting(page, lambda: stop_strings_box(page).fill("HALT"))
    send_and_wait(page, "kept words HALT dropped words", 1)
    answer = page.locator("#ls-transcript .ls-assistant").last.inner_text()
    assert "kept words" in answer and "HALT" not in answer and "dropped" not in answer, answer
    context.close()


def test_the_settings_survive_a_reload(chromium, window):
    context, page = open_window(chromium, window)
    for change in (
        lambda: page.locator("#ls-max-new input").fill("77"),
        lambda: page.get_by_label("Full token colours").check(),
        lambda: stop_strings_box(page).fill("HALT"),
    ):
        change_setting(page, change)  # kept as each one changes
    page.reload(wait_until="load")
    wait_status(page, "ready")
    stop_strings_box(page)
    page.wait_for_function("document.querySelector('#ls-stop-strings textarea').value === 'HALT'", timeout=10_000)
    assert page.locator("#ls-max-new input").input_value() == "77"
    assert page.get_by_label("Full token colours").is_checked()
    context.close()


PHONE_SIZES_JS = """() => {
    const box = (e) => e.getBoundingClientRect();
    const shown = (e) => box(e).width > 0 && box(e).height > 0;
    const answer = [...document.querySelectorAll('#ls-transcript .ls-assistant')].pop();
    return {
        actions: [...document.querySelectorAll('#ls-actions button')].filter(shown).map(e => box(e).height),
        toggles: [...document.querySelectorAll('.sidebar .toggle-button')].filter(shown)
            .map(e => [box(e).width, box(e).height]),
        answer: answer ? box(answer).width : 0,
        page: window.innerWidth,
    };
}"""


SLOW_WORDS = " ".join(f"w{i}" for i in range(50))  # ~5 s of streaming: a reload lands in the middle of it
TOKENS_SHOWN = "([n]) => document.querySelectorAll('#ls-transcript .ls-assistant .tok').length >= n"


def reload_mid_answer(page, tokens: int) -> None:
    """Send a slow answer, reload the page once `tokens` of it show, and wait for the page to follow it."""
    page.fill("#ls-message textarea", f"slow: {SLOW_WORDS}")
    page.click("#ls-send")
    page.wait_for_function(TOKENS_SHOWN, arg=[tokens], timeout=30_000)
    page.reload(wait_until="load")
    page.wait_for_selector("#ls-message textarea", timeout=30_000)
    wait_status(page, "asked for before this page loaded", 15_000)  # followed, not an empty window


def test_a_reload_mid_answer_shows_the_answer_streaming_on_to_its_end(chromium, window):
    context, page = open_window(chromium, window)
    reload_mid_answer(page, 6)
    assert f"slow: {SLOW_WORDS}" in page.inner_text("#ls-transcript .ls-user")
    assert page.locator("#ls-transcript .ls-cursor").count() == 1  # still streaming, not "[incomplete]"
    shown = page.locator("#ls-transcript .ls-assistant .tok").count()
    page.wait_for_function(TOKENS_SHOWN, arg=[shown + 4], timeout=15_000)  # and it goes on streaming
    assert "[answering]" in page.inner_text("#ls-conversation")
    wait_status(page, "Done", 30_000)
    assert page.locator("#ls-transcript .ls-cursor").count() == 0
    assert "w49" in page.locator("#ls-transcript .ls-assistant").last.inner_text()
    assert page.locator("#ls-transcript .tok-accepted").count() > 0  # the colours came with it
    page.click("#ls-refresh")
    page.wait_for_function("!document.querySelector('#ls-conversation').innerText.includes('[answering]')")
    assert "[incomplete]" not in page.inner_text("#ls-conversation")
    send_and_wait(page, COUNT, 1)  # the next message continues the conversation the answer was saved in
    assert "I see 3 messages" in page.locator("#ls-transcript .ls-assistant").last.inner_text()
    context.close()


def test_stop_after_a_reload_stops_the_answer_that_streams_on(chromium, window):
    context, page = open_window(chromium, window)
    reload_mid_answer(page, 4)
    page.click("#ls-stop")
    wait_status(page, "Stopped after", 15_000)
    told = int(re.search(r"Stopped after (\d+) token", page.inner_text("#ls-status")).group(1))
    assert 4 <= told < 100 and page.locator("#ls-transcript .ls-cursor").count() == 0
    assert page.locator("#ls-transcript .ls-assistant .tok").count() == told  # the partial answer, kept whole
    context.close()


def test_on_a_phone_the_buttons_are_thumb_sized_and_the_answer_takes_the_width(chromium, window):
    context, page = open_window(chromium, window, viewport={"width": 390, "height": 844}, has_touch=True)
    send_and_wait(page, "a phone-sized answer " + " ".join(["with words"] * 40), 0)
    sizes = page.evaluate(PHONE_SIZES_JS)
    assert sizes["actions"] and min(sizes["actions"]) >= 32, sizes  # were 22 px tall
    assert len(sizes["toggles"]) == 2 and all(w >= 40 and h >= 40 for w, h in sizes["toggles"]), sizes  # 28 x 32
    assert sizes["answer"] >= 0.85 * sizes["page"], sizes  # was ~230 of 390 px
    context.close()


# ---- first start -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_first_start_serves_the_window_while_the_model_loads(chromium, tmp_path):
    """`python app.py` on a fresh data folder: the embedded model converts first (minutes), and the window is served
    meanwhile, showing the load's stage; the port answers long before the model is ready."""
    from .apphelpers import REPO, AppProcess

    started = time.monotonic()
    app = AppProcess(REPO / "models.yaml", tmp_path)
    try:
        app.wait_serving(timeout_s=120)  # a guard against a hang; the conversion alone takes minutes here
        served_s = time.monotonic() - started
        with urllib.request.urlopen(app.url, timeout=10) as response:
            assert response.status == 200
        context = chromium.new_context(viewport=VIEWPORT)
        page = context.new_page()
        page.goto(app.url, wait_until="load")
        wait_status(page, "stage")  # the loading bar: "Converting …", stage n of N
        assert page.locator("#ls-status progress.ls-load").count() == 1
        assert "Loaded " not in app.log_text(None)  # served before the model was ready
        page.screenshot(path=str(tmp_path / "loading.png"))
        print(f"first start: the port answered after {served_s:.1f} s")
        context.close()
    finally:
        app.stop()


# ---- versions of messages ----------------------------------------------------------------------------------------


def test_editing_an_earlier_message_keeps_the_old_branch_behind_its_version_switch(chromium, window):
    context, page = open_window(chromium, window)
    send_and_wait(page, "first words", 0)
    send_and_wait(page, "second words", 1)
    page.locator("#ls-transcript .ls-user").first.locator(".ls-edit-msg").click()
    wait_status(page, "Editing")
    assert page.locator("#ls-message textarea").input_value() == "first words"
    page.fill("#ls-message textarea", COUNT)
    page.click("#ls-send")
    wait_status(page, "Done")
    transcript = page.inner_text("#ls-transcript")
    assert "I see 1 messages" in transcript and "second words" not in transcript  # only the new branch was given
    first = page.locator("#ls-transcript .ls-user").first
    assert first.locator(".ls-version-count").inner_text() == "2/2"
    first.locator(".ls-version-prev").click()
    wait_status(page, "another version")
    page.wait_for_function("document.querySelectorAll('#ls-transcript .ls-assistant').length == 2", timeout=10_000)
    transcript = page.inner_text("#ls-transcript")
    assert "first words" in transcript and "second words" in transcript and "I see" not in transcript
    reopen(page)  # the switch was saved: the conversation opens on the old branch, its new version one click away
    first = page.locator("#ls-transcript .ls-user").first
    assert first.locator(".ls-version-count").inner_text() == "1/2" and "second words" in page.inner_text(
        "#ls-transcript"
    )
    first.locator(".ls-version-next").click()
    wait_status(page, "another version")
    assert "I see 1 messages" in page.inner_text("#ls-transcript")
    page.locator("#ls-transcript .ls-assistant").first.locator(".ls-regen-msg").click()  # a new version of it
    page.wait_for_function(
        "document.querySelector('#ls-transcript .ls-assistant .ls-version-count')?.innerText == '2/2'", timeout=30_000
    )
    wait_status(page, "Done")
    if AXE.exists():  # the version switches, Edit and Regenerate buttons are named and legible
        page.add_style_tag(content="* { transition: none !important; }")
        found = axe_violations(page)
        assert found == [], json.dumps(found, indent=1)
    context.close()
