"""GGUF block types beyond Q4_1 on the kernels as stored: Q4_0 on the q4 kernel (m = −8·d), Q8_0 and Q5_0 on the q8
kernel, Q4_K with its own scales on q4k (q4f's bits), Q6_K with its own on q6k (q8k's bits), Q5_K and Q5_1 on the q8k
kernel, each taken apart as gguf.quants dequantizes it; a row alone is bitwise the row inside a multi-row call and
within the stated rounding bound of a float64 matmul with gguf.quants' weights (on the activations as the kernels
take them: int8 per group with a scale); a damaged scale names its tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localspec.config import ConfigError
from localspec.models.gguf_linear import _block_linear, dequantize, q4_fields, q8_fields, q8k_fields
from localspec.runtime.layer_kernel import REFERENCE_REL
from localspec.runtime.plan import Choice, tensor_kernel
from localspec.runtime.q4_kernel import (
    FLOAT32_EPS,
    K_GROUP,
    q8_reference_and_bound,
    quantized_activations,
    reference_and_bound,
)

from .conftest import library_or_skip
from .gguf_files import quantized

KERNEL = {"Q4_0": "q4", "Q5_0": "q8", "Q8_0": "q8", "Q4_K": "q4k", "Q6_K": "q6k", "Q5_K": "q8k", "Q5_1": "q8k"}
TYPES = tuple(KERNEL)
SUPER = ("Q4_K", "Q5_K", "Q6_K")  # 256 weights a block: K a multiple of 256


def _k(kind: str, k: int) -> int:
    """A row width of `kind`: k, or the next multiple of 256 for a K-quant."""
    return -(-k // 256) * 256 if kind in SUPER else k


@pytest.fixture(scope="module")
def library():
    return library_or_skip()


def _blocks(kind: str, rows: int, k: int, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """gguf.quants' blocks [N, K/32 · bytes] of random weights (random valid blocks of a K-quant, which it cannot
    quantize), and its own dequantization [N, K] float32."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    rng = np.random.default_rng(seed)
    blocks = quantized((rng.standard_normal((rows, k)) * 0.05).astype(np.float32), kind, rng)
    return torch.from_numpy(np.ascontiguousarray(blocks)), gguf.quants.dequantize(blocks, qtype).reshape(rows, k)


@pytest.mark.parametrize("kind", TYPES)
def test_blocks_come_apart_as_gguf_quants_dequantizes_them(kind):
    blocks, theirs = _blocks(kind, 16, _k(kind, 128) * 2, seed=1)
    assert torch.equal(dequantize(blocks, kind), torch.from_numpy(np.ascontiguousarray(theirs)))


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K"])
def test_k_quant_scales_and_minima_use_all_six_bits_of_every_sub_block(kind):
    # the 6-bit (sc, mn) of sub-blocks 4..7 are split across three bytes: every one of the 8 pairs and both top bits
    # must come out as gguf.quants reads them (random bytes reach them all)
    import gguf

    blocks, _ = _blocks(kind, 64, 256, seed=5)
    sc, mn = gguf.quants.Q4_K.get_scale_min(blocks.numpy().reshape(64, -1)[:, 4:16].copy())
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()  # [64, 1]
    fields = q4_fields(blocks, kind) if kind == "Q4_K" else q8k_fields(blocks, kind)
    step = 1 if kind == "Q4_K" else 2  # q8k: each sub-block's scale twice (groups of 16)
    assert torch.equal(fields.d[:, ::step], d * torch.from_numpy(sc.astype(np.float32)))
    assert bool((torch.from_numpy(sc) >= 32).any()) and bool((torch.from_numpy(mn)[:, 4:] >= 48).any())


@pytest.mark.parametrize("kind", TYPES)
def test_each_type_runs_on_its_kernel_row_invariant_and_within_the_bound_of_float64(kind, library):
    k = _k(kind, 192) if kind not in SUPER else 512
    blocks, theirs = _blocks(kind, 48, k, seed=2)
    choice = tensor_kernel(kind, "linear", library)
    assert choice.value == KERNEL[kind]
    layer = _block_linear(kind, blocks, choice, library, f"blk.0.{kind}")
    assert getattr(layer, "layout", None) == KERNEL[kind] or layer.kernel.KIND == KERNEL[kind]
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    full, nine = layer(x), layer(x[:9])  # [17, 48], [9, 48] bf16
    for row in range(17):
        alone = layer(x[row : row + 1])
        assert torch.equal(alone, full[row : row + 1])  # bitwise the row alone, inside 17 rows
        assert row >= 9 or torch.equal(alone, nine[row : row + 1])  # and inside 9
    if KERNEL[kind] in ("q4", "q4k"):
        fields, group = q4_fields(blocks, kind), 32
        codes, d, m = fields.codes, fields.d, fields.m
        reference, bound = reference_and_bound(x, codes, d, m)
    else:
        fields = q8k_fields(blocks, kind) if KERNEL[kind] in ("q8k", "q6k") else None
        codes, d = q8_fields(blocks, kind) if fields is None else (fields.codes, fields.d)
        m, group = (torch.zeros(d.shape), 32) if fields is None else (fields.m, K_GROUP)
        reference, bound = q8_reference_and_bound(x, codes, d, None if fields is None else fields.m)
        bound = bound + 2.0**-8 * reference.abs()  # and the float32 sum rounded to bf16 once (half an ulp: 2^-9)
    weights = torch.from_numpy(np.ascontiguousarray(theirs)).double()  # gguf.quants' float32 weights: d·q + m
    offsets = m.double().repeat_interleave(group, dim=1)  # [N, K]: each weight's m
    xs, xq = x.double(), quantized_activations(x, group)  # [17, K]: x, and x as the kernel takes it
    exact = xq @ weights.T + (xs - xq) @ offsets.T  # Σ d·q·x̂ + m·x with gguf.quants' weights
    # the reference's weights are the blocks' exact ones; gguf.quants rounds each to float32 (at most half an ulp)
    rounding = FLOAT32_EPS * (xq.abs() @ weights.abs().T + (xs - xq).abs() @ offsets.abs().T)
    assert bool(((reference - exact).abs() <= rounding).all())
    assert bool(((full.double() - exact).abs() <= bound + rounding).all())


def test_q4_k_on_its_own_scales_gives_the_float32_scales_bits_from_fewer_bytes(library):
    """q4k makes each sub-block's d·sc and −dmin·mn from the file's float16 d, dmin and 6-bit sc, mn (exact in
    float32), so its outputs are q4f's (float32 d and m per 32) bit for bit, read from 4.625 bits a weight, not 6."""
    from localspec.runtime.int4_linear import Int4Linear

    blocks, _ = _blocks("Q4_K", 48, 512, seed=6)
    q4k = _block_linear("Q4_K", blocks, tensor_kernel("Q4_K", "linear", library), library, "blk.0.ffn_up.weight")
    fields = q4_fields(blocks, "Q4_K")
    q4f = Int4Linear.from_q4_1(fields.codes, fields.d, fields.m, library.q4f)
    x = (torch.randn(9, 512, generator=torch.Generator().manual_seed(8)) * 2).to(torch.bfloat16)
    assert q4k.layout == "q4k" and torch.equal(q4k(x), q4f(x))
    bits = {
        name: 8 * sum(t.numel() * t.element_size() for t in (m.packed, m.scales_zeros)) / (48 * 512)
        for name, m in (("q4k", q4k), ("q4f", q4f))
    }
    assert bits == {"q4k": 4.625, "q4f": 6.0}


def test_q6_k_on_its_own_scales_gives_the_float32_scales_bits_from_fewer_bytes(library):
    """q6k makes each sub-block's d·sc from the file's float16 d and int8 sc (exact in float32), so its outputs are
    q8k's (float32 d and m per 16) bit for bit, read from the file's own 6.5625 bits a weight, not 12."""
    from localspec.runtime.q8_head import Q8Linear

    blocks, _ = _blocks("Q6_K", 48, 512, seed=7)
    q6k = _block_linear("Q6_K", blocks, tensor_kernel("Q6_K", "linear", library), library, "blk.0.ffn_down.weight")
    fields = q8k_fields(blocks, "Q6_K")
    q8k = Q8Linear.from_q8k(fields.codes, fields.d, fields.m, library.q8k)
    x = (torch.randn(9, 512, generator=torch.Generator().manual_seed(8)) * 2).to(torch.bfloat16)
    assert q6k.kernel is library.q6k and torch.equal(q6k(x), q8k(x))
    bits = {
        name: 8 * sum(t.numel() * t.element_size() for t in (m.codes, m.scales)) / (48 * 512)
        for name, m in (("q6k", q6k), ("q8k", q8k))
    }
    assert bits == {"q6k": 6.5625, "q8k": 12.0}


def test_a_q4_0_scale_whose_minimum_overflows_float16_stays_dense_with_the_reason(library):
    blocks, _ = _blocks("Q4_0", 16, 64)
    blocks[0, 0:2] = torch.tensor([60000.0], dtype=torch.float16).view(torch.uint8)  # 8·d = 480,000: no float16
    made = _block_linear("Q4_0", blocks, tensor_kernel("Q4_0", "linear", library), library, "blk.3.ffn_up.weight")
    assert isinstance(made, Choice) and made.value == "dense" and "blk.3.ffn_up.weight" in made.reason


@pytest.mark.parametrize("kind", TYPES)
def test_a_nan_scale_is_an_error_naming_the_tensor(kind, library):
    blocks, _ = _blocks(kind, 16, _k(kind, 64))
    at = 208 if kind == "Q6_K" else 0  # Q6_K's d is its last two bytes
    blocks[2, at : at + 2] = torch.tensor([float("nan")], dtype=torch.float16).view(torch.uint8)
    with pytest.raises(ConfigError, match=r"tensor blk\.1\.attn_v\.weight: block 0 of row 2 has the scale nan"):
        _block_linear(kind, blocks, tensor_kernel(kind, "linear", library), library, "blk.1.attn_v.weight")


def test_a_truncated_file_and_an_unknown_type_name_the_tensor(tmp_path):
    from localspec.models.discovery import read_gguf

    from .gguf_files import write_gguf

    path = write_gguf(tmp_path / "t.gguf", layers=1, linear_type="Q8_0")
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    found = read_gguf(path, "llama.cpp", path.name)
    assert found.loadable is not None and "blk.0.ffn_down.weight" in found.loadable and "file ends" in found.loadable
    # the first tensor's type id (after name, dims, shape) set to one gguf does not know
    name = b"token_embd.weight"
    at = data.index(name) + len(name) + 4 + 8 * 2
    broken = bytearray(data)
    broken[at : at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(broken))
    found = read_gguf(path, "llama.cpp", path.name)
    assert found.loadable is not None and "type 99" in found.loadable and "token_embd.weight" in found.loadable


def layer_kernel_gap(target, seed: int = 0) -> tuple[float, int]:
    """A 5-row forward after a 40-token prompt on the layer kernel against the torch-op layers: (max |Δ logit| ÷
    max |logit|, layer kernel calls)."""
    from .support import layer_kernel_logits

    generator = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    prompt, new = (torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (40, 5))
    on_kernel, torch_ops, calls = layer_kernel_logits(target, prompt, new)
    return float((on_kernel - torch_ops).abs().max() / torch_ops.abs().max()), calls


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_a_tiny_models_verify_rows_are_plain_decodings_rows_bitwise(kind, library, tmp_path, monkeypatch):
    """A whole tiny llama GGUF of each type loads on its kernel by itself (quant auto), and every row of its chain
    verify forwards is bitwise the row plain decoding computes: greedy speculation emits plain decoding's tokens."""
    from pathlib import Path

    from localspec.models.loading import load_pair
    from localspec.models.registry import parse_pair
    from localspec.models.user_models import file_entry
    from localspec.runtime.model_runner import exact_setup_for
    from localspec.runtime.plan import plan_forward

    from .gguf_files import write_gguf
    from .test_lean_llama import unequal_chain_rows

    path = write_gguf(tmp_path / f"tiny-{kind}.gguf", linear_type=kind, seed=4)
    pair = parse_pair(file_entry(path), 0, Path.cwd())
    loaded = load_pair(pair, device="cpu", load_draft=False, exact="off")
    assert loaded.quant == "gguf" and loaded.dtype.how == "fixed"  # no flag: the file's blocks on the kernels
    plan = plan_forward(loaded.target, exact=True)
    assert dict(plan.tensor_types)[kind].value == ("q4" if kind == "Q4_0" else "q8")
    assert plan.layer_kernel.value == "on"  # whole layers in one C call, each linear on its type's kernel
    assert plan.setup_id == "exact-kernels"
    assert unequal_chain_rows(loaded.target, exact_setup_for(loaded.target)) == 0
    gap, calls = layer_kernel_gap(loaded.target)  # the layer kernel's own bound on its gap to the torch-op layer
    assert calls == loaded.target.config.num_hidden_layers and gap <= REFERENCE_REL, gap


def test_quant_auto_takes_kernel_types_by_itself_and_names_the_linears_without_one(tmp_path, library):
    from localspec.models.gguf_linear import auto_quant

    from .gguf_files import write_gguf

    mixed = {"blk.0.ffn_down.weight": "MXFP4", "blk.0.ffn_up.weight": "Q5_1"}  # no kernel for MXFP4
    chosen = auto_quant(write_gguf(tmp_path / "m.gguf", layers=1, linear_type="Q8_0", tensor_types=mixed))
    assert chosen.quant == "gguf" and "Q5_1, Q8_0 linears run on the kernels" in chosen.reason
    assert "MXFP4 stays dense" in chosen.reason and "blk.0.ffn_down.weight" in chosen.reason
    none = auto_quant(write_gguf(tmp_path / "n.gguf", layers=1, linear_type="MXFP4"))
    assert none.quant == "none" and "no kernel for MXFP4" in none.reason and "blk.0.attn_q.weight" in none.reason
    other = auto_quant(write_gguf(tmp_path / "p.gguf", layers=1, linear_type="Q8_0", architecture="phi3"))
    assert other.quant == "none" and "this file is 'phi3'" in other.reason  # built dequantized, by transformers


# a file holding every new type: layer 0 as a Q4_K_M file stores it (attn_v and ffn_down one step up, in Q6_K), layer
# 1 as a Q5_K_M one with a Q5_1 attn_v (as the 576-wide embedded model's "Q4_K_M" file holds)
MIXED = {
    **{f"blk.0.{name}.weight": "Q4_K" for name in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")},
    **{f"blk.{i}.{name}.weight": "Q6_K" for i in (0, 1) for name in ("attn_v", "ffn_down")},
    "blk.1.attn_v.weight": "Q5_1",
}


@pytest.mark.slow
def test_a_tiny_k_quant_models_tensors_run_on_their_kernels_and_speculation_is_plain_decoding(library, tmp_path):
    """A tiny llama GGUF of Q4_K, Q5_K, Q6_K and Q5_1 linears loads by itself (quant auto) with every linear on its
    type's kernel; every row of its chain verify forwards is bitwise plain decoding's, and greedy n-gram speculation
    emits plain decoding's tokens."""
    from pathlib import Path

    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine
    from localspec.models.loading import load_pair
    from localspec.models.registry import parse_pair
    from localspec.models.user_models import file_entry
    from localspec.proposers import NgramProposer
    from localspec.runtime.model_runner import exact_setup_for
    from localspec.runtime.plan import plan_forward

    from .gguf_files import write_gguf
    from .test_lean_llama import unequal_chain_rows

    path = write_gguf(
        tmp_path / "tiny-k.gguf", layers=2, hidden=256, linear_type="Q5_K", tensor_types=MIXED, embedding_type="Q6_K"
    )
    pair = parse_pair(file_entry(path), 0, Path.cwd())
    loaded = load_pair(pair, device="cpu", load_draft=False, exact="off")
    assert loaded.quant == "gguf"  # no flag: the file's blocks on the kernels
    plan = plan_forward(loaded.target, exact=True)
    kinds = ("Q4_K", "Q5_K", "Q6_K", "Q5_1")
    assert {kind: choice.value for kind, choice in plan.tensor_types} == {kind: KERNEL[kind] for kind in kinds}
    on_kernels = {kernel for _, choice in plan.linears for kernel in choice.value.split("+")}
    assert on_kernels == {"q4k", "q6k", "q8k"}  # Q4_K, Q6_K, and Q5_K / Q5_1 on q8k: no linear dense
    assert plan.setup_id == "exact-kernels" and plan.layer_kernel.value == "on"  # mixed block types in one call
    assert plan.lm_head.value == "q6k" and "Q6_K" in plan.lm_head.reason  # the tied Q6_K embedding as the head
    target = loaded.target
    assert unequal_chain_rows(target, exact_setup_for(target)) == 0
    gap, calls = layer_kernel_gap(target)  # q4k, q6k and q8k linears, fused and apart, in the one C call per layer
    assert calls == target.config.num_hidden_layers and gap <= REFERENCE_REL, gap
    engine = Engine(target, exact=True)
    prompt = torch.randint(0, target.config.vocab_size, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    sampling = SamplingParams(max_new_tokens=24)

    def tokens(spec, proposer):
        return [t.token_id for e in engine.generate(prompt * 2, sampling, spec, proposer) for t in e.tokens]

    plain = tokens(SpecConfig(proposer="none"), None)
    assert tokens(SpecConfig(proposer="ngram", k=4), NgramProposer(1, 4)) == plain


def test_a_shaped_file_has_the_shapes_heads_and_float16_weights_it_names(tmp_path):
    import gguf

    from localspec.bench.shaped_gguf import SHAPES, Shape, write_shaped

    assert SHAPES["smollm2-1.7b"] == Shape(layers=24, hidden=2048, heads=32, kv_heads=32, ffn=8192)
    path = write_shaped(tmp_path / "shaped.gguf", Shape(layers=2, hidden=256, heads=8, kv_heads=2, ffn=512))
    reader = gguf.GGUFReader(str(path))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert (field("llama.block_count"), field("llama.attention.head_count")) == (2, 8)
    assert (field("llama.attention.head_count_kv"), field("llama.feed_forward_length")) == (2, 512)
    tensors = {t.name: t for t in reader.tensors}
    for name, rows, columns in (("attn_q", 256, 256), ("attn_k", 64, 256), ("attn_v", 64, 256), ("ffn_down", 256, 512)):
        tensor = tensors[f"blk.1.{name}.weight"]
        assert tensor.tensor_type.name == "F16" and list(tensor.shape) == [columns, rows], name
    assert tensors["token_embd.weight"].tensor_type.name == "F16"


def test_a_shaped_file_at_a_larger_vocabulary_loads_with_every_row_and_the_same_tokenizer(tmp_path):
    """Qwen's 151,936 rows from the embedded tokenizer padded with unused tokens: the model scores every row, the
    tokenizer is the embedded one for every text and knows the unused ones by their ids. Above 100,000 tokens
    transformers looks for a config.json by the tokenizer's name (a file's path there was an OSError: every Qwen
    and Llama 3 GGUF failed to load)."""
    from localspec.bench.shaped_gguf import SHAPES, embedded_tokenizer, write_gguf
    from localspec.models.gguf_meta import header_tokenizer

    assert SHAPES["qwen2.5-1.5b-vocab"].vocab == 151936
    own, vocab = len(embedded_tokenizer()["tokenizer.ggml.tokens"]), 100_032
    small = write_gguf(tmp_path / "own.gguf", layers=1, hidden=32, heads=2, kv_heads=1)
    large = write_gguf(
        tmp_path / "large.gguf", layers=1, hidden=32, heads=2, kv_heads=1, vocab_size=vocab, linear_type="Q8_0"
    )
    tokenizer, padded = header_tokenizer(small), header_tokenizer(large)
    assert len(padded) == vocab and len(tokenizer) == own
    text = "The capital of Australia is Canberra. ¿Qué? 東京 <|im_start|>"
    assert padded.encode(text) == tokenizer.encode(text)
    assert padded.convert_ids_to_tokens(vocab - 1) == f"<|unused_{vocab - 1}|>"
    from localspec.models.gguf_model import build_from_file
    from localspec.runtime.library import LibraryLoad

    model = build_from_file(large, str(large), torch.bfloat16, LibraryLoad(library_or_skip(), "test"))
    assert model.config.vocab_size == vocab
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, vocab) and bool(torch.isfinite(logits).all())
