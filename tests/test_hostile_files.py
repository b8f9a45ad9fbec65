"""Files other apps left, read as hostile input (issue 46, cases 1, 4 and 5): FIFOs, sockets and devices named like
models, names that are not UTF-8, a name of spaces, JSON nested 100,000 deep, a 37-byte tokenizer.json claiming id
50,000,000, a sparse GGUF claiming millions of tensors, a history index with ids out of range or 16M tokens in 66 KB.
Each is made on the spot; the app's start path (Catalog.read) must list the rest and say why each was skipped."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import tracemalloc
from pathlib import Path

import pytest

from localspec.models.discovery import FoundModel, ProposedPair, Root, discover, read_snapshot
from localspec.models.gguf_header import MAX_TENSORS, read_header
from localspec.models.untrusted import MAX_JSON_DEPTH, json_depth, shown
from localspec.models.user_models import Catalog, add_user_pair, load_all
from tests.conftest import REPO
from tests.gguf_files import write_gguf

NOT_UTF8_FILE = b"\xff\xfe-bad-name.gguf"
NOT_UTF8_FOLDER = b"\xc3\x28pub"
DEEP = "[" * 100_000
DISCOVERY_ENV = ("HF_HOME", "HF_HUB_CACHE", "OLLAMA_MODELS", "LLAMA_CACHE")


class Fifo:
    """A FIFO with a writer waiting on it: `opened` tells whether anyone opened it for reading (a reader would
    otherwise block for ever; the writer ends such a read at once, so old code fails instead of hanging)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self._event = threading.Event()
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)  # returns once a reader opens the FIFO
        self._event.set()
        os.close(fd)

    @property
    def opened(self) -> bool:
        return self._event.is_set()

    def close(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)  # releases the waiting writer
        self._thread.join(5)
        os.close(fd)


def unix_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(path.parent)  # a socket's path is limited to 108 bytes: bind it by its name
    try:
        sock.bind(path.name)
    finally:
        os.chdir(cwd)
    return sock


def copy_to(good: Path, target: bytes | Path) -> None:
    target = os.fsencode(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(good, "rb") as src, open(target, "wb") as dst:
        dst.write(src.read())


def sparse_gguf(path: Path, tensors: int, size: int) -> Path:
    """A GGUF header claiming `tensors` tensors, then zeros (each reads as an empty, well-formed tensor info) up to
    `size` bytes: a hole, so it costs no disk."""
    with open(path, "wb") as fh:
        fh.write(b"GGUF" + struct.pack("<IQQ", 3, tensors, 0))
        fh.truncate(size)
    return path


def ollama_manifest(root: Path, model: bytes, tag: str, text: str | None) -> Path:
    folder = os.path.join(os.fsencode(root / "manifests" / "registry.ollama.ai" / "library"), model)
    os.makedirs(folder, exist_ok=True)
    path = Path(os.fsdecode(os.path.join(folder, tag.encode())))
    if text is not None:
        path.write_text(text)
    return path


def snapshot(hub: Path, repo: str | bytes, files: dict[str, str | None]) -> Path:
    """models--<repo>/snapshots/rev with the given files (None: left for the caller, e.g. a FIFO)."""
    folder = Path(os.fsdecode(os.path.join(os.fsencode(hub), b"models--" + os.fsencode(repo), b"snapshots", b"r1")))
    folder.mkdir(parents=True)
    for name, text in files.items():
        if text is not None:
            (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("good") / "good.gguf", layers=1, hidden=32, vocab_size=300)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, good_gguf):
    """A home whose every discovery folder holds every hostile file, beside valid models; the app's start path
    (Catalog.read, as localspec.ui.serve calls it) read once with it. Yields (home, read, fifos, sockets)."""
    home = tmp_path_factory.mktemp("home")
    fifos: dict[str, Fifo] = {}
    sockets = []
    gguf_roots = {
        "lmstudio": home / ".lmstudio" / "models" / "pub" / "repo",
        "llama.cpp": home / ".cache" / "llama.cpp",
    }
    for layout, folder in gguf_roots.items():
        folder.mkdir(parents=True)
        copy_to(good_gguf, folder / "plain.gguf")
        copy_to(good_gguf, os.path.join(os.fsencode(folder), NOT_UTF8_FILE))
        copy_to(good_gguf, folder / "   .gguf")
        fifos[f"{layout} gguf"] = Fifo(folder / "pipe.gguf")
        sockets.append(unix_socket(folder / "sock.gguf"))
        (folder / "zero.gguf").symlink_to("/dev/zero")
        sparse_gguf(folder / "sparse.gguf", 1 << 24, 24 * (1 << 24) + 4096)
    copy_to(good_gguf, os.path.join(os.fsencode(home / ".lmstudio" / "models"), NOT_UTF8_FOLDER, b"repo", b"m.gguf"))
    ollama = home / ".ollama" / "models"
    blob = ollama / "blobs" / ("sha256-" + "b" * 64)
    copy_to(good_gguf, blob)
    layer = {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "b" * 64}
    ollama_manifest(ollama, b"\xff-model", "latest", json.dumps({"layers": [layer]}))
    ollama_manifest(ollama, b"deep", "latest", DEEP)
    ollama_manifest(ollama, b"escape", "latest", json.dumps({"layers": [{**layer, "digest": "../../../etc/passwd"}]}))
    fifos["ollama manifest"] = Fifo(ollama_manifest(ollama, b"pipe", "latest", None))
    hub = home / ".cache" / "huggingface" / "hub"
    config = json.dumps({"model_type": "llama", "vocab_size": 10})
    fifos["hf config.json"] = Fifo(snapshot(hub, "o--fifo", {}) / "config.json")
    snapshot(hub, "o--deep", {"config.json": DEEP})
    bomb = snapshot(hub, "o--bomb", {"config.json": config, "tokenizer.json": '{"model":{"vocab":{"a":50000000}}}'})
    (bomb / "model.safetensors").write_bytes(b"\0" * 16)
    tokenizer_fifo = snapshot(hub, "o--tokfifo", {"config.json": config})
    (tokenizer_fifo / "model.safetensors").write_bytes(b"\0" * 16)
    fifos["hf tokenizer.json"] = Fifo(tokenizer_fifo / "tokenizer.json")
    named = snapshot(hub, b"\xc3\x28o--name", {})
    copy_to(good_gguf, named / "x.gguf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        patch.setenv("LOCALSPEC_HOME", str(home / "data"))
        for key in DISCOVERY_ENV:
            patch.delenv(key, raising=False)
        try:
            read = Catalog(REPO / "models.yaml").read()
            opened = {name: fifo.opened for name, fifo in fifos.items()}
            yield home, read, opened
        finally:
            for fifo in fifos.values():
                fifo.close()
            for sock in sockets:
                sock.close()


def reasons(read) -> dict[str, str]:
    return {shown(s.path): s.reason for s in read.found.skipped}


def test_the_app_starts_with_every_hostile_file_in_every_folder(hostile):
    from localspec.ui.machine import found_html

    _home, read, _opened = hostile
    names = {p.name for p in read.pairs}
    assert "SmolLM2-135M-Instruct (embedded)" in names and read.broken == []
    found = {m.name for m in read.found.models}
    assert {"plain", "\\xff\\xfe-bad-name", ".gguf", "m", "\\xff-model:latest", "\\xc3(o/name/x.gguf"} <= found
    # 3 in each GGUF folder, m.gguf, the Ollama blob, the hub cache's GGUF and its two snapshots with weights
    assert len(read.found.models) == 11
    for pair in read.pairs:
        json.dumps(pair.name, ensure_ascii=False).encode("utf-8")  # every name can be shown and sent
    found_html(read).encode("utf-8")  # the window's table renders
    for why in reasons(read).values():
        assert why and "models.yaml entry" not in why
        why.encode("utf-8")


def test_fifos_sockets_and_devices_are_skipped_without_being_opened(hostile):
    _home, read, opened = hostile
    assert opened == dict.fromkeys(opened, False)
    why = reasons(read)
    for path, reason in why.items():
        if path.endswith(("pipe.gguf", "/pipe/latest", "o--fifo/snapshots/r1")):
            assert "FIFO" in reason, (path, reason)
    assert sum("FIFO" in r for r in why.values()) == 4
    assert sum("a socket" in r for r in why.values()) == 2
    assert sum("a character device" in r for r in why.values()) == 1  # both links resolve to /dev/zero: listed once
    tokfifo = next(m for m in read.found.models if m.name == "o/tokfifo")
    assert tokfifo.loadable == "no readable tokenizer.json"


def test_names_that_are_not_utf8_are_shown_escaped_and_still_usable(hostile, tmp_path):
    home, read, _opened = hostile
    pairs = {p.name: p for p in read.pairs}
    pair = pairs["\\xff\\xfe-bad-name"]
    assert os.fsencode(pair.target.source).endswith(b"/" + NOT_UTF8_FILE)  # the real bytes: the file opens
    assert os.path.isfile(os.fsencode(pair.target.source))
    folder = pairs["m"].target.source
    assert NOT_UTF8_FOLDER in os.fsencode(folder) and os.path.isfile(folder)
    proposed = next(p for p in read.proposed if p.target.name == "\\xff\\xfe-bad-name")
    user = tmp_path / "models.yaml"
    add_user_pair(proposed, user)  # written as YAML escapes, read back as the same bytes
    back, broken = load_all(REPO / "models.yaml", (), user)
    assert broken == [] and os.fsencode(back[-1].target.source) == os.fsencode(pair.target.source)


def test_a_file_named_with_spaces_gets_a_usable_name(hostile):
    _home, read, _opened = hostile
    assert [m.name for m in read.found.models if m.path.name == "   .gguf"] == [".gguf", ".gguf"]
    (offered,) = [p for p in read.pairs if p.target.source.endswith("/   .gguf")]  # one name, offered once
    assert offered.name == ".gguf" and os.path.isfile(offered.target.source)


def test_deeply_nested_json_is_skipped_with_its_reason(hostile, monkeypatch, capsys):
    from localspec.cli.main import main

    home, read, _opened = hostile
    why = reasons(read)
    manifest = next(r for p, r in why.items() if p.endswith("/deep/latest"))
    assert "100000 levels deep" in manifest
    config = next(r for p, r in why.items() if "o--deep" in p)
    assert "100000 levels deep" in config
    assert json_depth(b'{"a": "[[[[", "b": [[1]]}') == 3 <= MAX_JSON_DEPTH  # brackets inside strings do not count
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LOCALSPEC_HOME", str(home / "data"))
    for key in DISCOVERY_ENV:
        monkeypatch.delenv(key, raising=False)
    assert main(["models"]) == 0  # `localspec models` lists the rest and says why for each skipped file
    out = capsys.readouterr().out
    assert "\\xff\\xfe-bad-name  [llama.cpp]" in out and "deep/latest: not an Ollama manifest" in out
    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed["models"]) == 11 and any("levels deep" in s["reason"] for s in listed["skipped"])


def test_a_found_pair_that_cannot_be_offered_is_skipped_and_the_others_are_offered(tmp_path):
    def found(name: str, file: str) -> FoundModel:
        return FoundModel(name, tmp_path / file, "llama.cpp", "gguf", 1, "llama", "F32", 1, ("a",))

    broken, fine = ProposedPair(found("  ", "a.gguf"), None), ProposedPair(found("fine", "b.gguf"), None)
    skipped: list = []
    pairs, _ = load_all(REPO / "models.yaml", [broken, fine], tmp_path / "none.yaml", skipped)
    assert "fine" in {p.name for p in pairs}
    (why,) = skipped
    assert why.path == tmp_path / "a.gguf" and "not offered" in why.reason and "models.yaml entry" not in why.reason


def test_a_tiny_tokenizer_json_claiming_a_huge_id_costs_nothing(tmp_path):
    folder = tmp_path / "snapshot"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 1000}))
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    (folder / "tokenizer.json").write_text('{"model":{"vocab":{"a":50000000}}}')
    tracemalloc.start()
    try:
        model = read_snapshot(folder, "huggingface", "o/bomb")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert model.tokens == () and "50000000" in model.loadable and "vocab_size 1000" in model.loadable
    assert peak < 10 << 20  # the list of 50M ids would take 400 MB
    (folder / "tokenizer.json").write_text('{"model":{"vocab":{"a":0,"b":999}}}')  # ids up to the declared size
    assert len(read_snapshot(folder, "huggingface", "o/ok").tokens) == 1000


@pytest.mark.parametrize("tensors", [MAX_TENSORS + 1, 1 << 24])
def test_a_sparse_gguf_claiming_millions_of_tensors_is_refused_before_allocating(tmp_path, tensors):
    path = sparse_gguf(tmp_path / "sparse.gguf", tensors, 24 * tensors + 4096)  # room for every claimed tensor
    with pytest.raises(ValueError, match=f"claims {tensors} tensors"):
        read_header(path)
    small = sparse_gguf(tmp_path / "small.gguf", tensors, 4096)  # a 4 KB file cannot hold them
    with pytest.raises(ValueError, match="past the end of the file"):
        read_header(small)
    found = discover((Root("llama.cpp", tmp_path),))
    assert found.models == () and len(found.skipped) == 2


def test_a_gguf_array_count_beyond_the_file_is_refused(tmp_path):
    path = tmp_path / "arr.gguf"
    key = b"tokenizer.ggml.tokens"
    with open(path, "wb") as fh:  # one field: an array of 2^40 strings in a 100-byte file
        fh.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key)
        fh.write(struct.pack("<IIQ", 9, 8, 1 << 40) + b"\0" * 40)
    with pytest.raises(ValueError, match="past the end"):
        read_header(path)


@pytest.mark.slow  # converts a GGUF file
def test_a_found_model_whose_name_is_not_utf8_loads_and_answers(tmp_path, monkeypatch):
    from localspec.chat import ChatSession
    from localspec.config import SamplingParams
    from localspec.models.loading import load_pair

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "data"))
    made = write_gguf(tmp_path / "made.gguf", layers=1, hidden=32)
    copy_to(made, os.path.join(os.fsencode(tmp_path / "cache" / "llama.cpp"), NOT_UTF8_FILE))
    catalog = load_all(REPO / "models.yaml", propose_pairs_in(tmp_path / "cache" / "llama.cpp"), tmp_path / "no.yaml")
    pair = next(p for p in catalog[0] if p.name == "\\xff\\xfe-bad-name")
    messages: list[str] = []
    session = ChatSession(load_pair(pair, device="cpu", progress=messages.append))
    assert all(m.encode("utf-8") for m in messages)  # progress lines name the file escaped
    ids, _notice = session.prompt_ids([{"role": "user", "content": "Hello"}], 4)
    events = session.engine.generate(ids, SamplingParams(max_new_tokens=4), session.default_spec(), None)
    assert sum(len(e.tokens) for e in events) == 4


def propose_pairs_in(folder: Path):
    from localspec.models.discovery import propose_pairs

    return propose_pairs(discover((Root("llama.cpp", folder),)).models)
