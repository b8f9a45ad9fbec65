"""The prepacked bf16 linear (runtime/packed_linear.py): bitwise F.linear's on every row count, built once per layer,
never used where it would change a number (other dtypes, a weight written after packing, LOCALSPEC_PACKED=off), and
the LM head the model runner computes logits with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from localspec.runtime import packed_linear
from localspec.runtime.model_runner import FAST, ModelRunner, exact_setup
from localspec.runtime.packed_linear import PackedLinear


def _packing_here() -> str | None:
    """Why oneDNN cannot prepack a bf16 weight on this machine, or None: torch built without oneDNN, or a CPU
    without what its bf16 reorder needs (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: an AVX2-only Zen 3 EPYC has neither)."""
    if not torch.backends.mkldnn.is_available():
        return "torch built without oneDNN"
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
    except RuntimeError as exc:
        return f"oneDNN cannot prepack bf16 here: {str(exc).splitlines()[0]}"
    return None


needs_onednn = pytest.mark.skipif(_packing_here() is not None, reason=str(_packing_here()))


def _linear(out_features: int, in_features: int, dtype=torch.bfloat16, bias: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias).to(dtype).requires_grad_(False)


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_bf16_layer_is_bitwise_f_linear_on_every_row_count(bias):
    linear = _linear(4096, 576, bias=bias)
    packed = PackedLinear.of(linear)
    assert isinstance(packed, PackedLinear)
    x = torch.randn(1, 17, 576, generator=torch.Generator().manual_seed(1)).bfloat16()  # [1, T, K]
    for rows in range(1, 18):
        assert torch.equal(packed(x[:, :rows]), linear(x[:, :rows])), rows


@needs_onednn
def test_a_layer_is_packed_once_and_shared():
    linear = _linear(256, 64)
    assert PackedLinear.of(linear) is PackedLinear.of(linear)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes_stay_plain_linears(dtype):
    linear = _linear(256, 64, dtype=dtype)
    assert PackedLinear.of(linear) is linear


def test_packing_is_off_by_environment_and_above_the_size_cap(monkeypatch):
    from localspec.config import Environment
    from localspec.runtime.plan import packing

    assert packing(Environment.read({"LOCALSPEC_PACKED": "off"})).value == "plain"  # the plan's choice
    assert packing(Environment.read({})).value == "packed"
    monkeypatch.setattr(packed_linear, "PACK_MAX_BYTES", 256 * 64 * 2 - 1)  # one byte short of the weight's
    linear = _linear(256, 64, seed=1)
    assert PackedLinear.of(linear) is linear


@needs_onednn
def test_a_layer_at_the_size_cap_is_packed(monkeypatch):
    monkeypatch.setattr(packed_linear, "PACK_MAX_BYTES", 256 * 64 * 2)
    assert isinstance(PackedLinear.of(_linear(256, 64, seed=2)), PackedLinear)


def test_a_layer_that_would_round_differently_stays_plain(monkeypatch):
    def off_by_one_ulp(x, packed, bias):
        out = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        return torch.nextafter(out, out + 1)

    monkeypatch.setattr(packed_linear, "_run", off_by_one_ulp)
    linear = _linear(256, 64, seed=3)
    assert PackedLinear.of(linear) is linear


@needs_onednn
def test_a_weight_written_after_packing_is_used_as_written():
    linear = _linear(256, 64, seed=4)
    packed = PackedLinear.of(linear)
    assert isinstance(packed, PackedLinear)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5)).bfloat16()
    with torch.no_grad():
        linear.weight.mul_(2)  # the packed copy is stale now
    assert torch.equal(packed(x), linear(x))


@needs_onednn
@pytest.mark.parametrize("setup_name", ["fast", "exact"])
def test_the_runner_computes_logits_on_the_packed_head_bitwise(tiny_pair, monkeypatch, setup_name):
    from transformers import AutoModelForCausalLM

    def runner(model):
        setup = exact_setup(model.dtype) if setup_name == "exact" else FAST
        return ModelRunner(model, compile="off", setup=setup)

    load = AutoModelForCausalLM.from_pretrained
    packed_model = load(tiny_pair["target"], dtype=torch.bfloat16).eval()
    monkeypatch.setenv("LOCALSPEC_PACKED", "off")
    plain_model = load(tiny_pair["target"], dtype=torch.bfloat16).eval()
    plain = runner(plain_model)
    monkeypatch.delenv("LOCALSPEC_PACKED")
    ours = runner(packed_model)
    assert isinstance(ours._lm_head, PackedLinear) and not isinstance(plain._lm_head, PackedLinear)
    ids = torch.randint(0, packed_model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(6)).tolist()
    ours.reset(), plain.reset()
    assert torch.equal(ours.extend(ids[:20]).logits, plain.extend(ids[:20]).logits)
    start = 20
    for rows in (1, 2, 5, 9):
        chunk = ids[start : start + rows]
        assert torch.equal(ours.extend(chunk).logits, plain.extend(chunk).logits), rows
        start += rows


@pytest.mark.skipif(_packing_here() is None, reason="oneDNN packs bf16 on this machine")
def test_where_onednn_cannot_pack_bf16_the_layer_stays_as_it_is():
    linear = _linear(256, 64)
    assert PackedLinear.of(linear) is linear
