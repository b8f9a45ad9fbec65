"""The window while a long prompt is read (issue 50, issue 47's 49.9 s under "Answering…"): the engine's
PrefillProgress events become a status line once the reading has taken a second, and nothing else. The handlers run
in-process on an echo session that reads a 4,000-token prompt and holds its first step until the test saw that line.
"""

from __future__ import annotations

import threading

import pytest

from localspec.engine.events import PrefillProgress, StepEvent
from localspec.ui.echo import ECHO_PAIR, EchoSession, pieces
from localspec.ui.handlers import Handlers, reading_status
from localspec.ui.manager import ModelManager
from localspec.ui.recorder import Recorder

store_db = pytest.importorskip("localspec.store.db")

SETTINGS = ("ngram", 3, 0.0, 1.0, 0, 64, 0, True, 0, False)  # ... tree nodes, keep speculating
QUESTION = "summarise the pasted document"
GUARD_S = 10.0  # only a broken window waits this long


class HeldReader(EchoSession):
    """Reads a 4,000-token prompt (a PrefillProgress per 512 tokens), then holds the answer until `shown` is set."""

    def __init__(self) -> None:
        super().__init__(prompt_tokens=4000)
        self.shown = threading.Event()
        self.seen: list = []

    def stream_ids(self, ids, sampling, spec, cancel=None, first_source=()):
        for event in super().stream_ids(ids, sampling, spec, cancel, first_source):
            if isinstance(event, StepEvent):
                self.shown.wait(GUARD_S)
            self.seen.append(event)
            yield event


def test_reading_status_says_how_much_of_the_prompt_is_read_once_a_second_has_passed():
    assert reading_status(PrefillProgress(1536, 4000, 0.99)) is None  # under a second: "Answering…" stays
    assert reading_status(PrefillProgress(1536, 4000, 1.0)) == "Reading the prompt… 1,536 / 4,000 tokens (38 %)"
    assert reading_status(PrefillProgress(3999, 4000, 9.0)).endswith("(99 %)")  # 100 % only once all is read
    assert reading_status(PrefillProgress(512, 4000, 0.2), shown_after_s=0.0).startswith("Reading the prompt… 512 /")


@pytest.fixture
def store(tmp_path):
    store = store_db.ConversationStore(tmp_path / "conversations.db")
    yield store
    store.close()


def test_send_shows_the_reading_progress_then_streams_the_answer_as_before(store):
    session = HeldReader()
    manager = ModelManager([ECHO_PAIR], lambda _pair, _progress: session)
    manager.load("echo")
    handlers = Handlers(manager, Recorder(store))
    handlers.reading_shown_after_s = 0.0  # the echo reads in no time: the threshold is reading_status's test
    statuses, outputs = [], []
    try:
        for outputs in handlers.send(QUESTION, [], *SETTINGS):  # transcript, stats, status, events, box, turns
            status = outputs[2]
            statuses.append(status)
            if "Reading the prompt… 4,000 / 4,000 tokens (100 %)" in status:
                session.shown.set()  # the window said it: the answer may come
    finally:
        session.shown.set()  # a failed test leaves no worker waiting
    assert any("Reading the prompt" in s for s in statuses)
    reading = [i for i, s in enumerate(statuses) if "Reading the prompt" in s]
    assert all("Reading the prompt" not in s for s in statuses[reading[-1] + 1 :])  # then the answer, as today
    progress = [e for e in session.seen if isinstance(e, PrefillProgress)]
    assert [p.read for p in progress] == [*range(512, 4000, 512), 4000]
    answer = outputs[-1][-1]
    assert answer["content"] == QUESTION  # the progress added no token
    assert len(answer["tokens"]) == len(pieces(QUESTION)) == answer["stats"]["emitted"]
    (summary,) = store.list_conversations()  # and the saved answer is the same
    assert [m.content for m in store.get_conversation(summary.id).messages] == [QUESTION, QUESTION]
