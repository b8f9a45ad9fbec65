"""End to end: `python app.py` in a subprocess with the tiny pair, driven through gradio_client."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .apphelpers import REPO, AppProcess, send, send_from_two_clients, tiny_models_yaml
from .support import span_kinds

pytestmark = pytest.mark.slow  # every test starts the app in a subprocess

KINDS = {"accepted", "resampled", "bonus", "target"}
# send(message, proposer, K, temperature, top_p, top_k, max_new_tokens, seed, colour)
# → (transcript, stats, status, events, message box)


@pytest.fixture(scope="module")
def app(tiny_pair, tmp_path_factory):
    home = tmp_path_factory.mktemp("app-home")
    process = AppProcess(tiny_models_yaml(tiny_pair, home), home).wait_ready()
    yield process
    process.stop()


@pytest.fixture
def client(app):
    from gradio_client import Client

    return Client(app.url, verbose=False)


# streaming step by step, with each step's stats: test_app_stream.py (gated, so independent of machine speed)


def test_proposer_off_gives_target_tokens(client):
    transcript, _stats, _status, events, _box = send(client, "Say something", proposer="none", max_new=16).result()
    assert set(span_kinds(transcript)) == {"target"}
    assert events["stats"]["drafted"] == 0


def test_draft_model_proposer_runs(client):
    _transcript, _stats, _status, events, _box = send(client, "hello", proposer="draft", max_new=24).result()
    assert events["proposer"] == "draft" and events["stats"]["drafted"] > 0


def test_multi_turn_keeps_both_answers(client):
    send(client, "first message", max_new=8).result()
    transcript = send(client, "second message", max_new=8).result()[0]
    assert transcript.count('class="ls-msg ls-user"') == 2 and transcript.count("ls-msg ls-assistant") == 2
    assert "first message" in transcript and "second message" in transcript


def test_stop_keeps_the_partial_answer(client):
    job = send(client, "go on for a long time", proposer="none", max_new=4000)
    for update in job:
        if len(span_kinds(str(update[0]))) >= 5:
            break
    assert "Stopping" in client.predict(api_name="/stop")
    transcript, _stats, status, events, _box = job.result(timeout=60)
    assert events["finish_reason"] == "cancelled"
    assert 5 <= len(events["tokens"]) < 4000
    assert "partial answer is kept" in status and "stopped" in transcript


def test_compare_with_baseline(client):
    send(client, "Repeat after me: a b c a b c a b c", max_new=32).result()
    panel, status = client.predict(api_name="/compare")
    assert "Baseline done" in status
    assert re.search(r"ls-compare-speedup\">[\d.]+×", panel)
    assert "greedy outputs are bitwise identical" in panel or "greedy outputs differ" in panel


def test_bad_inputs_give_messages_and_the_app_still_answers(client):
    _t, _s, status, _e, box = send(client, "   ").result()
    assert "message is empty" in status and box == "   "
    status = send(client, "hi", max_new=0).result()[2]
    assert "max new tokens" in status
    transcript = send(client, "<script>alert(1)</script>", max_new=8).result()[0]
    assert "<script>" not in transcript and "&lt;script&gt;" in transcript
    assert span_kinds(transcript)


def test_failed_switch_keeps_the_old_model(client):
    status, model, _proposer, _k, _tree = client.predict("missing", api_name="/switch_model")
    assert "Could not switch" in status and "does not exist" in status and "Still using tiny" in status
    assert model == "tiny"
    _t, _s, status, events, _b = send(client, "still there?", max_new=8).result()
    assert events["model"] == "tiny" and "Done" in status


def test_two_clients_at_once_get_separate_complete_answers(app):
    from gradio_client import Client

    prompts = ["alpha alpha alpha", "omega omega omega"]
    results = send_from_two_clients(app.url, prompts)
    assert set(results) == {0, 1}
    alone = [send(Client(app.url, verbose=False), p, max_new=40).result(timeout=120) for p in prompts]
    for i in range(2):
        transcript, _s, _status, events, _b = results[i]
        assert prompts[i] in transcript and prompts[1 - i] not in transcript
        assert events["finish_reason"] in ("stop", "length")
        # nothing interleaved: the same greedy answer as when it ran alone
        assert [t["id"] for t in events["tokens"]] == [t["id"] for t in alone[i][3]["tokens"]]


def test_non_loopback_host_needs_a_password(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "app.py"), "--host", "0.0.0.0", "--no-browser"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "password" in result.stderr and "--no-auth" in result.stderr


def test_broken_models_yaml_is_a_message(tmp_path):
    broken = tmp_path / "models.yaml"
    broken.write_text("- name: x\n  target: [unclosed\n")
    result = subprocess.run(
        [sys.executable, str(REPO / "app.py"), "--models", str(broken), "--no-browser"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 2 and "not valid YAML" in result.stderr and "Traceback" not in result.stderr


def test_switch_during_an_answer_is_refused(client):
    job = send(client, "a long answer", proposer="none", max_new=4000)
    for update in job:
        if len(span_kinds(str(update[0]))) >= 3:
            break
    status, model, _proposer, _k, _tree = client.predict("missing", api_name="/switch_model")
    assert "answer is streaming" in status and "was not switched" in status and model == "tiny"
    client.predict(api_name="/stop")
    assert job.result(timeout=60)[3]["finish_reason"] == "cancelled"


def test_non_loopback_host_asks_for_the_password(tiny_pair, tmp_path):
    from gradio_client import Client

    app = AppProcess(
        tiny_models_yaml(tiny_pair, tmp_path), tmp_path, extra=("--host", "0.0.0.0", "--password", "s3cret")
    ).wait_ready()
    try:
        from gradio_client.exceptions import AuthenticationError

        with pytest.raises(AuthenticationError):
            Client(app.url, verbose=False)
        with pytest.raises(Exception):  # noqa: B017 - a wrong password is refused at login (the client raises no one type)
            Client(app.url, auth=("anyone", "wrong"), verbose=False)
        client = Client(app.url, auth=("anyone", "s3cret"), verbose=False)
        assert span_kinds(send(client, "hi", max_new=4).result()[0])
    finally:
        app.stop()


def test_default_pair_that_fails_to_load_leaves_a_usable_app(tiny_pair, tmp_path):
    from gradio_client import Client

    models = tiny_models_yaml(tiny_pair, tmp_path)
    entries = models.read_text().split("- name: ")
    models.write_text("- name: " + entries[2] + "- name: " + entries[1])  # the missing pair comes first
    app = AppProcess(models, tmp_path).wait_ready()
    try:
        assert "could not load missing" in app.log_text()
        client = Client(app.url, verbose=False)
        _t, _s, status, _e, box = send(client, "hello?", proposer="none").result()
        assert "does not exist" in status and box == "hello?"  # the message stays in the box
        status, model, proposer, _k, _tree = client.predict("tiny", api_name="/switch_model")
        assert "Loaded tiny" in status and model == "tiny"
        assert span_kinds(send(client, "hello?", proposer="ngram", max_new=8).result()[0])
    finally:
        app.stop()


def test_a_taken_port_is_a_message(tiny_pair, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                str(REPO / "app.py"),
                "--models",
                str(tiny_pair["models_yaml"]),
                "--no-browser",
                "--no-save",
                "--port",
                str(port),
                "--device",
                "cpu",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
    assert result.returncode == 2 and f"cannot serve on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
