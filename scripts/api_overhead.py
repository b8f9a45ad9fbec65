"""The server's overhead: time to first token and tokens/s through the API (openai client, streaming) against the
engine called directly (ChatSession.stream), same prompts, greedy, one run each, alternating. Not a test.

    python scripts/api_overhead.py [--models models.yaml] [--model NAME] [--max-tokens 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import socket
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
]


def direct(session, prompt, max_tokens):
    from localspec.config import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_tokens)
    started = time.perf_counter()
    first, emitted = None, 0
    for event in session.stream([{"role": "user", "content": prompt}], sampling, session.default_spec()):
        if event.tokens and first is None:
            first = time.perf_counter() - started
        emitted += len(event.tokens)
    return first, emitted / (time.perf_counter() - started)


def through_api(client, name, prompt, max_tokens):
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
    return first, usage.completion_tokens / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=str(REPO / "models.yaml"))
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import openai
    import uvicorn

    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import find_pair, load_registry
    from localspec.server.admission import Admission
    from localspec.server.app import create_app
    from localspec.server.metrics import MetricsRecorder
    from localspec.server.runner import FixedBackend

    pairs = load_registry(args.models)
    pair = find_pair(pairs, args.model)
    session = ChatSession(load_pair(pair, device=args.device))
    admission = Admission()
    app = create_app(FixedBackend(pairs, pair.name, session), admission, MetricsRecorder(admission), None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    direct(session, "Hello", 8)  # warm-up, both paths
    through_api(client, pair.name, "Hello", 8)
    rows = []
    for prompt in PROMPTS:
        d = direct(session, prompt, args.max_tokens)
        a = through_api(client, pair.name, prompt, args.max_tokens)
        rows.append((d, a))
        print(
            f"{prompt[:40]:40s}  TTFT direct {d[0] * 1e3:7.1f} ms  api {a[0] * 1e3:7.1f} ms   "
            f"tok/s direct {d[1]:6.1f}  api {a[1]:6.1f}"
        )
    ttft_d = sum(r[0][0] for r in rows) / len(rows)
    ttft_a = sum(r[1][0] for r in rows) / len(rows)
    tps_d = sum(r[0][1] for r in rows) / len(rows)
    tps_a = sum(r[1][1] for r in rows) / len(rows)
    print(
        f"{pair.name}, {args.device}, proposer {session.default_spec().proposer}, greedy, {args.max_tokens} tokens:"
        f" mean TTFT direct {ttft_d * 1e3:.1f} ms, api {ttft_a * 1e3:.1f} ms (api/direct {ttft_a / ttft_d:.2f}); "
        f"mean tok/s direct {tps_d:.1f}, api {tps_a:.1f} (api/direct {tps_a / tps_d:.2f})"
    )
    server.should_exit = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
