"""The server's overhead: time to first token and tokens/s through the API (openai client, streaming) against the
engine called directly (ChatSession.stream), same prompts, greedy. Not a test.

Both paths run the engine the same way: in a worker thread, with the same torch thread count, the main thread
timing what reaches it. They alternate prompt by prompt (direct, API, direct, API, ...) after a warm-up of each, so a
load that comes and goes on a shared machine falls on both; the medians and the API/direct ratios are printed.

    python scripts/api_overhead.py [--models models.yaml] [--model NAME] [--prompts 4] [--max-tokens 64]
                                   [--threads 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three tips for writing clear emails.",
    "What is the capital of France, and what is it known for?",
    "Describe how a hash map works.",
    "Give me a short recipe for pancakes.",
]
END = object()


def direct(session, prompt: str, max_tokens: int) -> tuple[float, int, float]:
    """(time to first token, tokens, tokens/s): the engine in a worker thread, its events read here."""
    from localspec.config import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_tokens)
    events: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            for event in session.stream([{"role": "user", "content": prompt}], sampling, session.default_spec()):
                events.put(event)
        finally:
            events.put(END)

    started = time.perf_counter()
    threading.Thread(target=work, daemon=True, name="localspec-direct-answer").start()
    first, emitted = None, 0
    while (event := events.get()) is not END:
        if event.tokens and first is None:
            first = time.perf_counter() - started
        emitted += len(event.tokens)
    return first, emitted, emitted / (time.perf_counter() - started)


def through_api(client, name: str, prompt: str, max_tokens: int) -> tuple[float, int, float]:
    """The same through the server (whose runner runs the engine in a worker thread)."""
    started = time.perf_counter()
    first, usage = None, None
    stream = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            usage = chunk.usage
    return first, usage.completion_tokens, usage.completion_tokens / (time.perf_counter() - started)


def start_server(pairs, pair, session):
    import uvicorn

    from localspec.server.admission import Admission
    from localspec.server.app import create_app
    from localspec.server.metrics import MetricsRecorder
    from localspec.server.runner import FixedBackend

    admission = Admission()
    app = create_app(FixedBackend(pairs, pair.name, session), admission, MetricsRecorder(admission), None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, port


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=str(REPO / "models.yaml"))
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompts", type=int, default=4, help=f"prompts to run (cycles the {len(PROMPTS)} built in)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads, for both paths")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import openai
    import torch

    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import find_pair, load_registry

    torch.set_num_threads(args.threads)  # process-wide: the direct worker and the server's worker share it
    pairs = load_registry(args.models)
    pair = find_pair(pairs, args.model)
    session = ChatSession(load_pair(pair, device=args.device))
    server, port = start_server(pairs, pair, session)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    for _ in range(2):  # warm-up, both paths
        direct(session, "Hello", 8)
        through_api(client, pair.name, "Hello", 8)
    rows = []
    for i in range(args.prompts):
        prompt = PROMPTS[i % len(PROMPTS)]
        d = direct(session, prompt, args.max_tokens)
        a = through_api(client, pair.name, prompt, args.max_tokens)
        rows.append((d, a))
        print(
            f"{prompt[:40]:40s}  TTFT direct {d[0] * 1e3:7.1f} ms  api {a[0] * 1e3:7.1f} ms   "
            f"tok/s direct {d[2]:6.1f}  api {a[2]:6.1f}   tokens {d[1]}/{a[1]}"
        )
    server.should_exit = True

    def median(path: int, field: int) -> float:
        return statistics.median(row[path][field] for row in rows)

    ttft_d, ttft_a, tps_d, tps_a = median(0, 0), median(1, 0), median(0, 2), median(1, 2)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"\n{pair.name}, {args.device}, proposer {session.default_spec().proposer}, greedy, {args.max_tokens} tokens,"
        f" {args.prompts} prompts, torch threads {torch.get_num_threads()}, load average {load}"
    )
    print(f"{'':14s}{'direct':>10s}{'api':>10s}{'api/direct':>12s}")
    print(f"{'TTFT ms':14s}{ttft_d * 1e3:10.1f}{ttft_a * 1e3:10.1f}{ttft_a / ttft_d:12.2f}")
    print(f"{'tokens/s':14s}{tps_d:10.1f}{tps_a:10.1f}{tps_a / tps_d:12.2f}")
    if any(d[1] != a[1] for d, a in rows):
        print("note: the two paths emitted different token counts on some prompt (see the rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
