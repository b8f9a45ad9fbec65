"""A GGUF target's transformers config and tokenizer, made in memory from the header gguf_header.py reads.

A GGUF holds no config.json and no tokenizer.json: its key-value section is both. transformers makes them from the
file itself (AutoConfig / AutoTokenizer with gguf_file=), the config through its legacy reader, which decodes every
field of the header (seconds for a 49k-token vocabulary). Here both come from one read of the header by our own
reader, nothing is written, and they are what transformers makes (tests/test_gguf_meta.py checks it):

  config     transformers' own table for the architecture (GGUF_TO_TRANSFORMERS_MAPPING's config part: e.g.
             llama.block_count → num_hidden_layers, tokenizer.ggml.bos_token_id → bos_token_id), applied as its
             load_gguf_checkpoint applies it: model_type from general.architecture (a llama file named "mistral"
             is mistral), tie_word_embeddings where the file has no output.weight, vocab_size from the token list
             where the file does not state it
  tokenizer  transformers' GGUF converter (convert_gguf_tokenizer: the vocabulary, merges and token types as a
             tokenizers Tokenizer, the control tokens special) given the fields it reads from the file, and the
             tokenizer config (chat template, special tokens, add_bos_token) as get_gguf_tokenizer makes it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .gguf_header import GGUFHeader, read_header

# the header's arrays a load reads: the tokenizer's (discovery reads the tokens alone)
TOKENIZER_ARRAYS = frozenset(
    {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"}
)


def load_header(path: Path) -> GGUFHeader:
    """The header with the arrays a load reads (gguf_header keeps it: the load's other reads take it from there)."""
    return read_header(path, TOKENIZER_ARRAYS)


def config_values(header: GGUFHeader) -> dict[str, Any]:
    """The config dict transformers' load_gguf_checkpoint makes of this header (its "config" part)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    fields = header.fields
    architecture = str(fields.get("general.architecture", ""))
    named = fields.get("general.name")
    renamed = "mistral" if "llama" in architecture and named == "mistral" else architecture
    table = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    if renamed not in table:
        raise ValueError(f"GGUF model with architecture {architecture} is not supported yet.")
    values: dict[str, Any] = {"tie_word_embeddings": all(t.name != "output.weight" for t in header.tensors)}
    for key, value in fields.items():
        key = key.replace(architecture, renamed)
        prefix, _, rest = key.partition(".")
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, renamed)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        renames = table.get(prefix) or {}
        target = renames.get(rest)
        if rest in renames and target not in (None, -1):
            values[target] = value
    if "vocab_size" not in values and "tokenizer.ggml.tokens" in fields:
        values["vocab_size"] = len(fields["tokenizer.ggml.tokens"])
    return values


def header_config(path: Path):
    """The transformers config of the GGUF file at `path` (a llama, mistral, qwen2 or qwen3 file)."""
    from transformers import CONFIG_MAPPING

    values = config_values(load_header(path))
    config = CONFIG_MAPPING[values["model_type"]].from_dict(values)
    config._name_or_path = str(path)  # where it came from, as from_pretrained(folder) gives the folder
    return config


_TOKENIZER_FIELDS = {  # tokenizer.ggml.<key> → get_gguf_tokenizer's name
    "model": "tokenizer_type",
    "pre": "pre_tokenizer_type",
    "tokens": "tokens",
    "scores": "scores",
    "token_type": "token_type",
    "merges": "merges",
    "precompiled_charsmap": "precompiled_charsmap",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "unknown_token_id": "unk_token_id",
    "padding_token_id": "pad_token_id",
    "add_space_prefix": "add_prefix_space",
}
_SPECIAL = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
            "pad_token": "padding_token_id"}  # fmt: skip


def tokenizer_parts(header: GGUFHeader) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(architecture, tokenizer fields, tokenizer config) as transformers' get_gguf_tokenizer makes them."""
    fields = header.fields
    tokenizer = {name: fields[f"tokenizer.ggml.{key}"] for key, name in _TOKENIZER_FIELDS.items()
                 if f"tokenizer.ggml.{key}" in fields}  # fmt: skip
    config = {name: fields[key] for key, name in (("tokenizer.chat_template", "chat_template"),
              ("tokenizer.ggml.add_bos_token", "add_bos_token"), ("tokenizer.ggml.add_eos_token", "add_eos_token"))
              if key in fields}  # fmt: skip
    kind = tokenizer.get("tokenizer_type")
    if kind == "llama":
        config.setdefault("add_bos_token", True)  # llama.cpp's default for a sentencepiece vocabulary
    elif kind == "gemma4":
        config["add_bos_token"] = False
    tokens = tokenizer.get("tokens") or []
    for name, key in _SPECIAL.items():
        index = fields.get(f"tokenizer.ggml.{key}")
        config[name] = tokens[index] if index is not None else None
    return str(fields.get("general.architecture", "")), tokenizer, config


def header_tokenizer(path: Path):
    """The tokenizer of the GGUF file at `path`, as TokenizersBackend.from_pretrained(folder, gguf_file=…) makes it.
    Named by the file's folder, as from_pretrained names it: with more than 100,000 tokens (Qwen, Llama 3)
    transformers looks for a config.json beside it by that name (its Mistral regex check), and a file's path there
    is an error."""
    from transformers.integrations.gguf import convert_gguf_tokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    architecture, fields, config = tokenizer_parts(load_header(path))
    backend, more = convert_gguf_tokenizer(architecture, fields)
    return TokenizersBackend(tokenizer_object=backend, name_or_path=str(Path(path).parent), **config, **more)
