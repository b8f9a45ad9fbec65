"""Streaming, driven step by step: the app runs in this process with a session whose engine steps wait on a gate,
so the test decides when each step happens and checks that each one reaches the client with its own stats.

Nothing here depends on how fast the machine is: a step is released only after the previous one was seen."""

from __future__ import annotations

import re
import threading
from typing import ClassVar

import pytest

from .apphelpers import free_port, send
from .support import span_kinds, wait_until

pytestmark = pytest.mark.slow
KINDS = {"accepted", "resampled", "bonus", "target"}
STEP_TIMEOUT_S = 60.0


def gated_session_class():
    from localspec.chat import ChatSession

    class GatedSession(ChatSession):
        """A ChatSession whose stream_ids hands out one engine step per gate release; `steps` lists those handed."""

        gate = threading.Semaphore(0)
        steps: ClassVar[list] = []

        def stream_ids(self, ids, sampling, spec, cancel=None, first_source=()):
            for event in super().stream_ids(ids, sampling, spec, cancel, first_source):
                if not self.gate.acquire(timeout=STEP_TIMEOUT_S):
                    raise RuntimeError("the test never released this step")
                self.steps.append(event)
                yield event

    return GatedSession


@pytest.fixture(scope="module")
def gated_app(tiny_pair):
    from gradio_client import Client

    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry
    from localspec.ui import ModelManager, build_app, launch_options

    session_class = gated_session_class()
    pairs = load_registry(tiny_pair["models_yaml"])
    manager = ModelManager(pairs, lambda pair, _progress: session_class(load_pair(pair, device="cpu")))
    manager.load(pairs[0].name)
    demo = build_app(manager, None, None)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        prevent_thread_lock=True,
        inbrowser=False,
        share=False,
        quiet=True,
        **launch_options(),
    )
    try:
        yield Client(f"http://127.0.0.1:{port}/", verbose=False), manager.session
    finally:
        demo.close()


def counts(stats: dict) -> tuple[int, int, int, int]:
    return stats["drafted"], stats["accepted"], stats["emitted"], stats["target_forwards"]


def wait_for_update(job, seen: int, step_counts: tuple[int, int, int, int]):
    """The first update after the `seen` ones already read whose events carry these step counts."""
    found: list = []

    def arrived() -> bool:
        done = job.done()  # read before the outputs: a job done now has every output below
        outputs = job.outputs()
        for index in range(seen, len(outputs)):
            events = outputs[index][3]
            if events and events.get("stats") and counts(events["stats"]) == step_counts:
                found.append((index, outputs[index]))
                return True
        return done

    wait_until(arrived, STEP_TIMEOUT_S, every_s=0.01, fail=False)
    if not found:
        raise AssertionError(f"no update with stats {step_counts} reached the client")
    return found[0]


def test_every_step_reaches_the_client_with_its_own_stats(gated_app):
    client, session = gated_app
    session.steps.clear()
    job = send(client, "Count with me: one two three", max_new=64)
    seen, stats_strings = 0, []
    for step in range(64):
        session.gate.release()
        wait_until(lambda n=step: len(session.steps) > n or job.done(), STEP_TIMEOUT_S, every_s=0.005, fail=False)
        if len(session.steps) <= step:  # the answer ended: no step took this release
            break
        event = session.steps[step]
        index, update = wait_for_update(job, seen, counts(event.stats.to_dict()))
        seen = index + 1
        drafted, accepted = event.stats.drafted, event.stats.accepted
        assert re.search(rf"accepted draft tokens</th><td [^>]*>{accepted}/{drafted} \(", update[1]), update[1]
        assert len(update[3]["tokens"]) == event.stats.emitted
        stats_strings.append(update[1])
        if event.finished:
            break
    transcript, stats, status, events, _box = job.result(timeout=STEP_TIMEOUT_S)
    steps = session.steps
    assert len(steps) >= 3 and steps[-1].finished, "the answer should take several engine steps"
    assert len(stats_strings) == len(steps)  # one update per step, each seen before the next step ran
    assert len(set(stats_strings)) == len(steps), "each step's update carries its own stats"
    assert job.outputs()[0][4] == ""  # the box is emptied as soon as the message is taken
    assert "Done" in status
    kinds = span_kinds(transcript)
    assert len(kinds) >= 10 and set(kinds) <= KINDS
    assert len(set(kinds)) >= 2  # n-gram drafts on the tiny model's loops: some accepted, some not
    assert {t["kind"] for t in events["tokens"]} <= KINDS
    assert [t["kind"] for t in events["tokens"] if t["text"]] == kinds
    final = steps[-1].stats
    assert re.search(rf"accepted draft tokens</th><td [^>]*>{final.accepted}/{final.drafted} \(", stats), stats
    assert steps[-1].stats.drafted > 0 and events["stats"]["accepted"] == steps[-1].stats.accepted
