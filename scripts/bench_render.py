"""Render time of the chat window while an answer streams (a benchmark, not a test).

Server side: the time to render the transcript once more after each update of 2 tokens, at answer lengths of
100, 1,000 and 4,000 tokens (finished blocks cached, as in the app), next to one render of the same answer from
scratch. Browser side (--browser): frame times in headless Chromium while a 1,000-token answer streams from the
model-free echo session (localspec/ui/echo.py), measured with requestAnimationFrame and the Long Tasks API.

    python scripts/bench_render.py [--browser]
"""

from __future__ import annotations

import argparse
import statistics
import time

from localspec.ui.echo import CYCLE, pieces
from localspec.ui.render import transcript_html

SECTION = """### Step {i}

The **proposer** drafts *K* tokens and the target checks them in `one forward`; accepted drafts cost almost nothing.

1. Draft with the n-gram table
2. Verify with **one** forward
3. Keep the longest accepted prefix

```python
def step_{i}(context, k={i}):
    draft = propose(context, k)
    return verify(context, draft)
```

| K | speedup |
|---|---------|
| {i} | 1.{i} |

"""


def answer_text(tokens: int) -> list[str]:
    out, i = [], 0
    while len(out) < tokens:
        out.extend(pieces(SECTION.format(i=i % 10)))
        i += 1
    return out[:tokens]


def records(texts: list[str]) -> list[dict]:
    return [
        {"id": i, "text": t, "kind": CYCLE[i % len(CYCLE)], "p_target": 0.8, "p_draft": 0.9, "acceptance_prob": 0.9}
        for i, t in enumerate(texts)
    ]


def server(points=(100, 1000, 4000), repeats: int = 20) -> None:
    all_records = records(answer_text(max(points)))
    turns = [
        {"role": "user", "content": "explain speculative decoding with code"},
        {"role": "assistant", "content": "", "tokens": [], "pending": True},
    ]
    answer = turns[1]
    per_update: dict[int, list[float]] = {}
    for end in range(2, max(points) + repeats * 2 + 1, 2):  # stream 2 tokens per update, like one step
        answer["tokens"].extend(all_records[end - 2 : end])
        started = time.perf_counter()
        transcript_html(turns)
        elapsed = time.perf_counter() - started
        for point in points:
            if point <= end < point + repeats * 2:
                per_update.setdefault(point, []).append(elapsed)
    print("| answer length | render per update (median) | slowest of 20 | one render from scratch |")
    print("|---:|---:|---:|---:|")
    for point in points:
        fresh = [{**r} for r in all_records[:point]]
        started = time.perf_counter()
        transcript_html([turns[0], {"role": "assistant", "content": "", "tokens": fresh}])
        scratch = time.perf_counter() - started
        times = per_update[point]
        print(
            f"| {point:,} tokens | {statistics.median(times) * 1000:.2f} ms | {max(times) * 1000:.2f} ms | "
            f"{scratch * 1000:.1f} ms |"
        )


def browser(tokens: int = 1000, step_ms: float = 20.0) -> None:
    from playwright.sync_api import sync_playwright

    from localspec.ui import build_app, launch_options
    from localspec.ui.echo import echo_manager
    from tests.apphelpers import free_port

    prompt = "".join(answer_text(tokens))
    demo = build_app(echo_manager(step_ms / 1000))
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_options())
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            page = chromium.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"http://127.0.0.1:{port}/", wait_until="load")
            page.wait_for_selector("#ls-message textarea", timeout=90_000)
            page.fill("#ls-max-new input", str(tokens))
            page.locator("#ls-max-new input").blur()
            page.evaluate("""() => {
                window.lsFrames = []; window.lsLong = []; let last = performance.now();
                const tick = (now) => { window.lsFrames.push(now - last); last = now; requestAnimationFrame(tick); };
                requestAnimationFrame(tick);
                new PerformanceObserver(l => l.getEntries().forEach(e => window.lsLong.push(e.duration)))
                    .observe({type: 'longtask', buffered: false});
            }""")
            page.fill("#ls-message textarea", prompt)
            page.evaluate("window.lsFrames = []; window.lsLong = []")
            started = time.perf_counter()
            page.click("#ls-send")
            page.wait_for_function("/Done/.test(document.querySelector('#ls-status').innerText)", timeout=600_000)
            seconds = time.perf_counter() - started
            frames = page.evaluate("window.lsFrames")
            long_tasks = page.evaluate("window.lsLong")
            spans = page.locator("#ls-transcript .tok").count()
            chromium.close()
    finally:
        demo.close()
    frames.sort()
    print("| streamed | frames | median frame | 95th percentile | slowest | long tasks (> 50 ms) | token spans |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {tokens:,} tokens in {seconds:.1f} s | {len(frames)} | {statistics.median(frames):.1f} ms | "
        f"{frames[int(len(frames) * 0.95)]:.1f} ms | {frames[-1]:.0f} ms | {len(long_tasks)} "
        f"(longest {max(long_tasks, default=0):.0f} ms) | {spans:,} |"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--browser", action="store_true", help="also measure frame times in headless Chromium")
    args = parser.parse_args()
    server()
    if args.browser:
        browser()
