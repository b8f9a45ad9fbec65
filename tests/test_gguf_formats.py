"""GGUF block types beyond Q4_1 on the kernels as stored: Q4_0 on the q4 kernel (m = −8·d), Q8_0 and Q5_0 on the q8
kernel, each taken apart as gguf.quants dequantizes it; a row alone is bitwise the row inside a multi-row call and
within the stated rounding bound of a float64 matmul with gguf.quants' weights; a damaged scale names its tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localspec.config import ConfigError
from localspec.models.gguf_linear import _block_linear, dequantize, q4_fields, q8_fields
from localspec.runtime.plan import Choice, tensor_kernel
from localspec.runtime.q4_kernel import q8_reference_and_bound, reference_and_bound

from .conftest import library_or_skip

TYPES = ("Q4_0", "Q5_0", "Q8_0")


@pytest.fixture(scope="module")
def library():
    return library_or_skip()


def _blocks(kind: str, rows: int, k: int, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """gguf.quants' blocks [N, K/32 · bytes] of random weights, and its own dequantization [N, K] float32."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    values = (np.random.default_rng(seed).standard_normal((rows, k)) * 0.05).astype(np.float32)
    blocks = gguf.quants.quantize(values, qtype)
    return torch.from_numpy(np.ascontiguousarray(blocks)), gguf.quants.dequantize(blocks, qtype).reshape(rows, k)


@pytest.mark.parametrize("kind", TYPES)
def test_blocks_come_apart_as_gguf_quants_dequantizes_them(kind):
    blocks, theirs = _blocks(kind, 16, 128, seed=1)
    assert torch.equal(dequantize(blocks, kind), torch.from_numpy(np.ascontiguousarray(theirs)))


@pytest.mark.parametrize("kind", TYPES)
def test_each_type_runs_on_its_kernel_row_invariant_and_within_the_bound_of_float64(kind, library):
    blocks, theirs = _blocks(kind, 48, 192, seed=2)
    choice = tensor_kernel(kind, "linear", library)
    assert choice.value == ("q4" if kind == "Q4_0" else "q8")
    layer = _block_linear(kind, blocks, choice, library, f"blk.0.{kind}")
    x = torch.randn(13, 192, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    full = layer(x)  # [13, 48] bf16
    for row in range(13):
        assert torch.equal(layer(x[row : row + 1]), full[row : row + 1])  # bitwise the row alone
    if kind == "Q4_0":
        fields = q4_fields(blocks, kind)
        reference, bound = reference_and_bound(x, fields.codes, fields.d, fields.m)
    else:
        codes, d = q8_fields(blocks, kind)
        reference, bound = q8_reference_and_bound(x, codes, d)
        bound = bound + 2.0**-8 * reference.abs()  # and the float32 sum rounded to bf16 once (half an ulp: 2^-9)
    exact = x.double() @ torch.from_numpy(np.ascontiguousarray(theirs)).double().T  # gguf.quants' weights
    assert torch.allclose(reference, exact, rtol=0, atol=1e-12)
    assert bool(((full.double() - exact).abs() <= bound).all())


def test_a_q4_0_scale_whose_minimum_overflows_float16_stays_dense_with_the_reason(library):
    blocks, _ = _blocks("Q4_0", 16, 64)
    blocks[0, 0:2] = torch.tensor([60000.0], dtype=torch.float16).view(torch.uint8)  # 8·d = 480,000: no float16
    made = _block_linear("Q4_0", blocks, tensor_kernel("Q4_0", "linear", library), library, "blk.3.ffn_up.weight")
    assert isinstance(made, Choice) and made.value == "dense" and "blk.3.ffn_up.weight" in made.reason


@pytest.mark.parametrize("kind", TYPES)
def test_a_nan_scale_is_an_error_naming_the_tensor(kind, library):
    blocks, _ = _blocks(kind, 16, 64)
    blocks[2, 0:2] = torch.tensor([float("nan")], dtype=torch.float16).view(torch.uint8)
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
    assert plan.layer_kernel.value == ("on" if kind == "Q4_0" else "off")  # the layer kernel reads the q4 layout
    assert plan.setup_id == "exact-kernels"
    assert unequal_chain_rows(loaded.target, exact_setup_for(loaded.target)) == 0


def test_quant_auto_takes_kernel_types_by_itself_and_names_the_linears_without_one(tmp_path, library):
    from localspec.models.gguf_linear import auto_quant

    from .gguf_files import write_gguf

    mixed = {"blk.0.ffn_down.weight": "Q5_1"}  # no kernel for Q5_1
    chosen = auto_quant(write_gguf(tmp_path / "m.gguf", layers=1, linear_type="Q8_0", tensor_types=mixed))
    assert chosen.quant == "gguf" and "Q8_0 linears run on the kernels" in chosen.reason
    assert "Q5_1 stays dense" in chosen.reason and "blk.0.ffn_down.weight" in chosen.reason
    none = auto_quant(write_gguf(tmp_path / "n.gguf", layers=1, linear_type="Q5_1"))
    assert none.quant == "none" and "no kernel for Q5_1" in none.reason and "blk.0.attn_q.weight" in none.reason
