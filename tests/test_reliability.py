"""Reliability: the app keeps working and says what happened when a tab, an API caller or a file misbehaves.

An in-process app (Blocks launched on a free 127.0.0.1 port) over two pairs that share the tiny models: 'tiny'
(n-gram and draft) and 'tiny-ngram' (n-gram only), driven through gradio_client.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from .apphelpers import free_port, send


def two_pair_manager(tiny_session):
    from localspec.chat import ChatSession
    from localspec.ui.manager import ModelManager

    pair = tiny_session.loaded.spec
    pairs = [pair, replace(pair, name="tiny-ngram", draft=None, default_proposer="ngram")]

    def factory(spec, progress):
        progress(f"loading {spec.name}")
        return ChatSession(replace(tiny_session.loaded, spec=spec))

    manager = ModelManager(pairs, factory)
    manager.load(pair.name)
    return manager


@pytest.fixture(scope="module")
def inproc_app(tiny_session):
    from localspec.ui import build_app

    manager = two_pair_manager(tiny_session)
    demo = build_app(manager)
    demo.queue(default_concurrency_limit=None)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, share=False)
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}/", manager=manager, demo=demo)
    demo.close()


@pytest.fixture
def api(inproc_app):
    from gradio_client import Client

    inproc_app.manager.load("tiny")
    return Client(inproc_app.url, verbose=False)


# -- 5: API callers see the app's own validation messages -------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"message": "   "}, "the message is empty"),
        ({"k": 2.5}, "K must be a whole number"),
        ({"seed": -1}, "seed must be between 0 and"),
        ({"max_new": 0}, "max new tokens must be a whole number ≥ 1"),
        # a proposer the pair does not have (an API client still using an earlier pair's): the app's words, not
        # Gradio's "not in the list of choices"
        ({"proposer": "head"}, "is not available for this model pair; choose one of: off (none)"),
    ],
)
def test_rejected_send_gives_api_callers_the_message(api, kwargs, words):
    message = kwargs.pop("message", "hello")
    transcript, stats, status, events, box = send(api, message, **kwargs).result(timeout=60)
    assert words in status
    assert isinstance(transcript, str) and isinstance(stats, str) and box == message
    assert events is None or isinstance(events, dict) and "props" not in events


# -- 10: switch_model(None) is refused ---------------------------------------------------------------------------------


def test_switch_to_nothing_is_refused(api, inproc_app):
    status, model, _proposer, _k, _tree = api.predict(None, api_name="/switch_model")
    assert "Loaded" not in status and "Could not switch" in status
    assert model == "tiny" and inproc_app.manager.name == "tiny"


def test_switch_handler_refuses_none(tiny_session):
    from localspec.ui.handlers import Handlers

    handlers = Handlers(two_pair_manager(tiny_session))
    status, model, *_ = list(handlers.switch(None))[-1]
    assert "choose a model pair" in status and model == "tiny"


# -- 7: the window's limits are the documented ones, and every value goes through the app's own validation ----------


def test_temperature_slider_reaches_the_documented_maximum(tiny_session):
    from localspec.config import TEMPERATURE_MAX
    from localspec.ui import build_app

    demo = build_app(two_pair_manager(tiny_session))
    slider = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "ls-temperature")
    assert slider.maximum == TEMPERATURE_MAX == 5.0


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_new": 2.5}, "max new tokens must be a whole number"),
        ({"top_k": 1.5}, "top-k must be a whole number"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"temperature": 7}, "temperature must be between 0 and 5"),
        ({"k": 17}, r"K (draft tokens per step) must be between 1 and 16"),
        ({"tree_nodes": 40}, "tree nodes (draft tokens per tree step) must be a whole number between 0 and 32"),
        ({"tree_nodes": 2.5}, "tree nodes (draft tokens per tree step) must be a whole number between 0 and 32"),
        ({"seed": float("nan")}, "seed must be a finite number"),
        ({"repetition": 0}, "repetition penalty must be a number &gt; 0"),
        ({"stops": "a," * 17}, "the stop strings box takes at most 16 strings"),
    ],
)
def test_api_values_get_the_documented_messages(inproc_app, kwargs, words):
    args = {
        "proposer": "ngram",
        "k": 3,
        "temperature": 0.0,
        "top_k": 0,
        "max_new": 8,
        "seed": 0,
        "tree_nodes": 0,
        "repetition": 1.0,
        "stops": "",
        **kwargs,
    }
    status = raw_send(
        inproc_app.url,
        [
            "hello",
            args["proposer"],
            args["k"],
            args["temperature"],
            1.0,
            args["top_k"],
            args["max_new"],
            args["seed"],
            True,
            args["tree_nodes"],
            False,  # keep speculating: a raw HTTP call sends every input
            "",  # no system prompt
            args["repetition"],
            args["stops"],
        ],
    )[2]
    assert words in status and "Could not preprocess" not in status


def raw_send(url: str, data: list) -> list:
    """POST /send over Gradio's plain HTTP API (JSON as Python writes it, NaN and Infinity included); the last
    outputs, or the error text as the only item."""
    import json
    import urllib.request

    request = urllib.request.Request(
        url + "gradio_api/call/send",
        data=json.dumps({"data": data}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        event_id = json.loads(response.read())["event_id"]
    with urllib.request.urlopen(f"{url}gradio_api/call/send/{event_id}", timeout=60) as response:
        lines = response.read().decode().splitlines()
    event, last = None, None
    for line in lines:
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event in ("complete", "error", "generating"):
            payload = line.split(":", 1)[1].strip()
            last = json.loads(payload) if event != "error" else [None, None, str(payload)]
    return last


# -- 4: one bad models.yaml entry never blocks the others -------------------------------------------------------------

TYPO_YAML = (
    "- name: good\n  target: {source: owner/model}\n"
    "- name: typo\n  target: {source: owner/other, qaunt: nf4}\n"
    "- name: good\n  target: {source: owner/again}\n"
)


def test_valid_entries_load_and_broken_ones_keep_their_error():
    from pathlib import Path

    from localspec.models.registry import parse_registry, parse_registry_lenient

    pairs, broken = parse_registry_lenient(TYPO_YAML, Path("/tmp"))
    assert [p.name for p in pairs] == ["good"]
    assert [(b.index, b.name) for b in broken] == [(1, "typo"), (2, "good")]
    assert "unknown key(s) 'qaunt'" in broken[0].error and "two entries are named 'good'" in broken[1].error
    with pytest.raises(Exception, match="qaunt"):  # the strict reader (the CLI) still refuses the file
        parse_registry(TYPO_YAML, Path("/tmp"))


def test_broken_entries_are_offered_as_unavailable_and_refused_with_their_error(tiny_session):
    from pathlib import Path

    from localspec.models.registry import parse_registry_lenient
    from localspec.ui.handlers import Handlers
    from localspec.ui.manager import ModelManager

    _pairs, broken = parse_registry_lenient(TYPO_YAML, Path("/tmp"))
    manager = two_pair_manager(tiny_session)
    manager = ModelManager(manager.pairs, manager.factory, broken=broken)
    manager.load("tiny")
    labels = {value: label for label, value in manager.choices()}
    assert "unknown key(s) 'qaunt'" in labels[broken[0].value] and "unavailable" in labels[broken[0].value]
    status, model, *_ = list(Handlers(manager).switch(broken[0].value))[-1]
    assert "Could not switch" in status and "qaunt" in status and "Still using tiny" in status
    assert model == "tiny" and manager.name == "tiny"


@pytest.mark.slow
def test_app_opens_with_a_broken_entry(tiny_pair, tmp_path):
    from gradio_client import Client

    from .apphelpers import AppProcess, tiny_models_yaml

    models = tiny_models_yaml(tiny_pair, tmp_path)
    models.write_text(models.read_text() + "- name: typo\n  target: {source: owner/other, qaunt: nf4}\n")
    app = AppProcess(models, tmp_path).wait_ready()
    try:
        status, model, *_ = Client(app.url, verbose=False).predict("unavailable:3", api_name="/switch_model")
        assert "qaunt" in status and model == "tiny"
        assert "skipped models.yaml entry 3 ('typo')" in app.log_text()
    finally:
        app.stop()


# -- 9: the CLI checks its arguments before it loads a model ----------------------------------------------------------


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--prompt", ""], "the message is empty"),
        (["--prompt", "  \n"], "the message is empty"),
        (["--prompt", "hi", "--k", "0"], r"K (draft tokens per step) must be between 1 and 16 (got 0)"),
        (["--prompt", "hi", "--proposer", "head"], "model pair 'tiny' has no 'head' proposer"),
        (["--prompt", "hi", "--model", "nope"], "no model pair named 'nope'"),
        (["--prompt", "hi", "--temperature", "9"], "temperature must be between 0 and 5"),
    ],
)
def test_generate_refuses_bad_arguments_before_loading(tiny_pair, monkeypatch, capsys, extra, words):
    from localspec.cli.main import main
    from localspec.models import loading

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(loading, "load_pair", no_load)
    assert main(["generate", "--models", str(tiny_pair["models_yaml"]), "--device", "cpu", *extra]) == 2
    assert words in capsys.readouterr().err


# -- 6: a damaged database is moved aside exactly as found; a replaced one is noticed; shutdown checkpoints ----------


def _killed_with_a_wal(tmp_path):
    """The files a killed writer leaves: the database and a WAL full of committed, unmerged transactions (copied
    while the writer still holds them open, so nothing was checkpointed)."""
    import json
    import shutil

    from localspec.store.db import STATE_SUFFIX, ConversationStore, file_fingerprint

    live = tmp_path / "live"
    live.mkdir()
    store = ConversationStore(live / "conversations.db")
    try:
        cid = store.create_conversation("killed", "tiny")
        for i in range(200):
            store.add_message(cid, "user", f"message {i} " * 30)
        path = tmp_path / "conversations.db"
        for suffix in ("", "-wal"):
            shutil.copyfile(live / f"conversations.db{suffix}", tmp_path / f"conversations.db{suffix}")
    finally:
        store.close()
    # the record the writer's last checkpoint left, for this copy
    (tmp_path / f"conversations.db{STATE_SUFFIX}").write_text(json.dumps(file_fingerprint(path)))
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size > 50_000, "the writer should leave a WAL behind"
    return path, wal


def test_damaged_database_is_moved_exactly_as_found(tmp_path):
    from localspec.store.db import ConversationStore

    path, _wal = _killed_with_a_wal(tmp_path)
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size // 2 + 100)
    found = {
        suffix: path.with_name(path.name + suffix).read_bytes()
        for suffix in ("", "-wal", "-shm")
        if path.with_name(path.name + suffix).exists()
    }
    with ConversationStore(path) as store:
        moved = store.recovered_from
        assert moved is not None and store.list_conversations() == []
    for suffix, data in found.items():
        assert moved.with_name(moved.name + suffix).read_bytes() == data, f"{suffix or 'db'} was altered"


def test_database_replaced_while_a_wal_remains_is_detected(tmp_path):
    import shutil

    from localspec.store.db import ConversationStore

    path, _wal = _killed_with_a_wal(tmp_path)
    other = tmp_path / "other.db"
    with ConversationStore(other) as store:
        store.create_conversation("another file", "m")
    shutil.copyfile(other, path)  # overwrite the main file; the old WAL stays next to it
    with ConversationStore(path) as store:
        assert store.recovered_from is not None
        assert store.list_conversations() == []


def test_killed_writer_keeps_its_wal_data(tmp_path):
    from localspec.store.db import ConversationStore

    path, _wal = _killed_with_a_wal(tmp_path)
    with ConversationStore(path) as store:  # a plain kill is not damage: everything committed is there
        assert store.recovered_from is None
        (summary,) = store.list_conversations()
        assert len(store.get_conversation(summary.id).messages) == 200


@pytest.mark.slow
def test_sigterm_checkpoints_the_wal(tiny_pair, tmp_path):
    from .apphelpers import AppProcess, tiny_models_yaml

    app = AppProcess(tiny_models_yaml(tiny_pair, tmp_path), tmp_path).wait_ready()
    from gradio_client import Client

    send(Client(app.url, verbose=False), "hello there", max_new=24).result(timeout=120)
    app.proc.terminate()
    app.proc.wait(timeout=30)
    app.stop()
    wal = tmp_path / "conversations.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, f"{wal.stat().st_size} bytes left unmerged"


# -- 2: Gradio's temporary files stay under LOCALSPEC_HOME, owner-only, and go at exit -------------------------------


@pytest.mark.slow
def test_exports_are_private_and_removed_at_exit(tiny_pair, tmp_path):
    import stat
    from pathlib import Path

    from gradio_client import Client

    from .apphelpers import AppProcess, tiny_models_yaml

    home = tmp_path / "home"
    home.mkdir()
    app = AppProcess(tiny_models_yaml(tiny_pair, tmp_path), home).wait_ready()
    try:
        client = Client(app.url, verbose=False, download_files=False)  # the server's own path comes back
        send(client, "hello there", max_new=8).result(timeout=120)
        chooser = client.predict(api_name="/list_conversations")
        cid = chooser["choices"][0][1] if isinstance(chooser, dict) else chooser
        exported, _status = client.predict(cid, api_name="/export_json")
        served = Path(exported["path"])
        assert served.is_relative_to(home / "tmp"), served
        assert stat.S_IMODE(served.stat().st_mode) == 0o600
        for parent in served.relative_to(home).parents:
            if parent != Path("."):
                assert stat.S_IMODE((home / parent).stat().st_mode) == 0o700, parent
    finally:
        app.proc.terminate()
        app.proc.wait(timeout=30)
        app.stop()
    assert not list((home / "tmp").glob("gradio-*")), "the temporary folder outlived the app"
    log = app.log_path.read_text()
    assert "share=True" not in log and "localspec: serving on http://127.0.0.1:" in log  # item 8's log line


# -- 8: wrong passwords are slowed down per client; no "public link" line ---------------------------------------------


def test_throttle_grows_per_client_and_resets_on_success():
    import asyncio

    from localspec.ui.auth import CLIENT, FREE_FAILURES, ThrottledPassword

    waits: list[tuple[str, float]] = []

    async def fake_sleep(seconds):
        waits.append((CLIENT.get(), seconds))

    throttle = ThrottledPassword(lambda _user, given: given == "right", sleep=fake_sleep)

    async def attempt(client, password):
        CLIENT.set(client)
        return await throttle.attempt("u", password)

    async def scenario():
        for _ in range(FREE_FAILURES + 4):
            assert not await attempt("10.0.0.1", "wrong")
        assert await attempt("10.0.0.2", "right")  # another client is not slowed down
        assert await attempt("10.0.0.1", "right")  # the right password still works (after its wait)
        assert not await attempt("10.0.0.1", "wrong")  # and clears the record

    asyncio.run(scenario())
    delays = [s for c, s in waits if c == "10.0.0.1"]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0] and all(c == "10.0.0.1" for c, _ in waits)


def test_login_route_throttles_by_client_address(tiny_session):
    import urllib.error
    import urllib.parse
    import urllib.request

    from localspec.ui import build_app
    from localspec.ui.auth import CLIENT, launch_kwargs

    options = launch_kwargs(lambda _user, given: given == "secret")
    waits = []

    async def fake_sleep(seconds):
        waits.append((CLIENT.get(), seconds))

    options["auth"].__self__.sleep = fake_sleep
    demo = build_app(two_pair_manager(tiny_session))
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **options)
    try:
        for password in ["a", "b", "c", "d", "e", "secret"]:
            body = urllib.parse.urlencode({"username": "x", "password": password}).encode()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/login", data=body, timeout=10)
            except urllib.error.HTTPError as exc:
                assert exc.code == 400 and password != "secret"
    finally:
        demo.close()
    assert waits == [("127.0.0.1", 0.5), ("127.0.0.1", 1.0), ("127.0.0.1", 2.0)]


# -- 3: a switch in one tab reaches the others ---------------------------------------------------------------------


def tab(name: str):
    return SimpleNamespace(session_hash=name)


def test_other_tabs_learn_about_a_switch(tiny_session):
    from localspec.ui.handlers import Handlers

    handlers = Handlers(two_pair_manager(tiny_session))
    tab_a, tab_b = tab("a"), tab("b")
    handlers.on_load(request=tab_a)
    handlers.on_load(request=tab_b)
    assert list(handlers.switch("tiny-ngram", request=tab_b))[-1][1] == "tiny-ngram"

    # A still shows the old pair's proposers: its send says what happened instead of a bare "not available"
    out = list(handlers.send("hello", [], "draft", 3, 0.0, 1.0, 0, 8, 0, True, 0, request=tab_a))[-1]
    assert "switched to tiny-ngram in another window" in out[2] and out[4] == "hello"

    # A's controls catch up on the next tick (gr.Timer), once
    model, proposer, _k, _tree, status = handlers.refresh_pair(request=tab_a)
    assert model == "tiny-ngram" and "switched to tiny-ngram in another window" in status
    assert [value for _label, value in proposer["choices"]] == ["ngram", "history", "none"]
    again = handlers.refresh_pair(request=tab_a)
    assert all(isinstance(part, dict) and part.get("__type__") == "update" and len(part) == 1 for part in again)
    # B, which switched, is not disturbed, and A's next send answers with the new pair
    assert handlers.refresh_pair(request=tab_b)[0] == {"__type__": "update"}
    out = list(handlers.send("hello", [], "ngram", 3, 0.0, 1.0, 0, 8, 0, True, 0, request=tab_a))[-1]
    assert out[3]["model"] == "tiny-ngram"


def test_the_window_polls_for_a_switch(tiny_session):
    import gradio as gr

    from localspec.ui import build_app

    demo = build_app(two_pair_manager(tiny_session))
    assert any(isinstance(block, gr.Timer) for block in demo.blocks.values())
