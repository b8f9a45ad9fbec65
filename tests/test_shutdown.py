"""An ending process stops its answers first: SIGTERM during an answer exits 0, with the answer kept as incomplete."""

from __future__ import annotations

import threading
import time

import pytest

from localspec.server.admission import Admission, Workers


def test_workers_stop_cancels_and_joins_every_answer():
    workers = Workers()
    steps = []

    def answer(cancel):
        while not cancel.is_set():  # an engine loop checks its cancel flag every step
            steps.append(1)
            time.sleep(0.01)

    cancels = [threading.Event() for _ in range(3)]
    threads = [workers.start(lambda c=c: answer(c), c, "test-answer") for c in cancels]
    assert workers.count == 3
    assert workers.stop(timeout_s=10)
    assert all(c.is_set() for c in cancels) and not any(t.is_alive() for t in threads)
    assert workers.count == 0


def test_stop_reports_a_thread_that_does_not_end():
    workers = Workers()
    release = threading.Event()
    workers.start(lambda: release.wait(10), threading.Event(), "stuck")  # ignores its cancel flag
    assert workers.stop(timeout_s=0.2) is False
    release.set()


def test_the_manager_and_the_api_share_one_worker_list(tiny_pair):
    from localspec.config import SamplingParams
    from localspec.models.registry import load_registry
    from localspec.ui.manager import ModelManager, default_session_factory

    admission = Admission(4)
    manager = ModelManager(load_registry(tiny_pair["models_yaml"]), default_session_factory("cpu"), admission)
    manager.load(None)
    out = manager.answer(
        [{"role": "user", "content": "hi"}],
        SamplingParams(max_new_tokens=900),
        lambda s: s.default_spec(),
        threading.Event(),
    )
    while out.get(timeout=30).kind != "event":
        pass
    assert admission.workers.count == 1
    assert manager.stop_answers()
    kinds = []
    while not out.empty():
        kinds.append(out.get().kind)
    assert kinds[-1] == "done" and admission.workers.count == 0


@pytest.mark.slow
def test_sigterm_during_an_answer_exits_0(tiny_pair, tmp_path):
    from gradio_client import Client

    from .apphelpers import AppProcess, send, tiny_models_yaml

    app = AppProcess(tiny_models_yaml(tiny_pair, tmp_path), tmp_path).wait_ready()
    try:
        job = send(Client(app.url, verbose=False), "hello there", max_new=900)
        deadline = time.monotonic() + 120
        while len(job.outputs()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not job.done(), "the answer ended before SIGTERM could arrive during it"
        app.proc.terminate()
        code = app.proc.wait(timeout=60)
    finally:
        app.stop()
    log = app.log_path.read_text(errors="replace")
    assert code == 0, log
    assert "terminate called" not in log and "Traceback" not in log
