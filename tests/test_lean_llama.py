"""The lean llama forward (runtime/lean_llama.py): bitwise transformers' own forward in the exact setup (prefill,
chains, trees, features), fused linears that compute each part's columns as before and share their memory, and the
fallback to transformers' forward where the lean one does not apply."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from localspec.config import ConfigError
from localspec.models.gguf_linear import int4_from_q4_1
from localspec.runtime import lean_llama
from localspec.runtime.int4_linear import Int4Linear
from localspec.runtime.lean_llama import LeanLlama, backbone_for, lean_supported
from localspec.runtime.model_runner import FAST, ModelRunner, exact_rows_setup, exact_setup
from localspec.runtime.plan import plan_forward
from localspec.runtime.tree import TokenTree

from .test_gguf_linear import random_blocks


@pytest.fixture(scope="module")
def tiny_by_dtype(tiny_pair):
    from transformers import AutoModelForCausalLM

    return {
        name: AutoModelForCausalLM.from_pretrained(tiny_pair["target"], dtype=dtype).eval()
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))
    }


def _ids(count: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def _runners(model, setup):
    ours = ModelRunner(model, compile="off", setup=setup, forward="lean")
    theirs = ModelRunner(model, compile="off", setup=setup, forward="transformers")
    assert (ours.forward_kind, theirs.forward_kind) == ("lean", "transformers")
    return ours, theirs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("setup_name", ["exact", "fast"])
def test_lean_prefill_chains_and_features_are_transformers_bitwise(tiny_by_dtype, dtype, setup_name):
    # the exact setup's decode rows run in plain decoding's shapes (RowsAsPlain), which transformers does not do;
    # on this tiny model the two still agree, and the real model's check is test_the_embedded_gguf_target_...
    model = tiny_by_dtype[dtype]
    ours, theirs = _runners(model, exact_setup(model.dtype) if setup_name == "exact" else FAST)
    ids = _ids(60, model.config.vocab_size)
    for runner in (ours, theirs):
        runner.reset()
    assert torch.equal(ours.extend(ids[:30]).logits, theirs.extend(ids[:30]).logits)  # the prompt's prefill
    start = 30
    for rows in (1, 2, 3, 5, 9):
        chunk = ids[start : start + rows]
        mine, reference = ours.extend(chunk), theirs.extend(chunk)
        assert torch.equal(mine.logits, reference.logits), rows
        start += rows
    layers = (0,)
    mine = ours.extend(ids[start : start + 3], want_hidden=True, feature_layers=layers)
    reference = theirs.extend(ids[start : start + 3], want_hidden=True, feature_layers=layers)
    assert mine.hidden.shape == reference.hidden.shape and torch.equal(mine.hidden, reference.hidden)
    assert ours.tokens == theirs.tokens


@pytest.fixture(scope="module")
def qwen_models():
    """Random tiny Qwen2 (q/k/v biases) and Qwen3 (q and k norms per head) models, float32 and bfloat16."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    torch.manual_seed(0)
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    models = {}
    for name, config in (
        ("qwen2", Qwen2Config(num_key_value_heads=2, **shape)),
        ("qwen3", Qwen3Config(num_key_value_heads=2, head_dim=16, **shape)),
    ):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        with torch.no_grad():
            for param in model.parameters():  # biases and norms away from their zeros and ones
                param.add_(torch.randn_like(param) * 0.05)
        models[name, "float32"] = model
        models[name, "bfloat16"] = copy.deepcopy(model).to(torch.bfloat16)  # before any runner fuses its layers
    return models


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lean_qwen_layers_are_transformers_bitwise(qwen_models, family, dtype):
    """Qwen2's biases (the projections' own) and Qwen3's q and k norms (before RoPE) in the lean forward: prefill,
    chains and trees bitwise transformers' in the fast setup."""
    model = qwen_models[family, dtype]
    assert lean_supported(model) and not plan_forward(model, forward="lean").on_layer_kernel
    ours, theirs = _runners(model, FAST)
    ids = _ids(40, model.config.vocab_size)
    for runner in (ours, theirs):
        runner.reset()
    assert torch.equal(ours.extend(ids[:20]).logits, theirs.extend(ids[:20]).logits)
    start = 20
    for rows in (1, 3, 5):
        assert torch.equal(
            ours.extend(ids[start : start + rows]).logits, theirs.extend(ids[start : start + rows]).logits
        )
        start += rows


def test_lean_fast_trees_are_transformers_bitwise(tiny_by_dtype):
    model = tiny_by_dtype["bfloat16"]
    ours, theirs = _runners(model, FAST)
    ids = _ids(30, model.config.vocab_size, seed=1)
    tree = TokenTree(token_ids=[5, 6, 7, 8, 9], parents=[-1, 0, 0, 1, -1])
    for runner in (ours, theirs):
        runner.reset()
        runner.extend(ids, logits_to_keep=0)
    mine, reference = ours.extend_tree(3, tree), theirs.extend_tree(3, tree)
    assert torch.equal(mine.logits, reference.logits)
    for runner in (ours, theirs):
        runner.keep_path(len(ids), [0, 2])
    assert torch.equal(ours.extend([11, 12]).logits, theirs.extend([11, 12]).logits)  # the kept rows' cache


TREE = TokenTree(token_ids=list(range(40, 51)), parents=[-1, -1, 0, 0, 1, 2, 2, 4, -1, 5, 3])


def unequal_tree_rows(model, setup, prompts: int = 3) -> int:
    """Rows of a lean tree forward whose logits are not bitwise plain decoding's along the row's path."""
    runner = ModelRunner(model, compile="off", setup=setup, forward="lean")
    unequal = 0
    for seed in range(prompts):
        prompt = _ids(20 + 9 * seed, model.config.vocab_size, seed=10 + seed)
        runner.reset()
        runner.extend(prompt, logits_to_keep=0)
        tree_logits = runner.extend_tree(7, TREE).logits  # [N+1, V]
        runner.keep_path(len(prompt), [0])
        for row, path in enumerate([[]] + [TREE.ancestors(node) for node in range(TREE.size)]):
            runner.crop(len(prompt))
            for token in [7] + [TREE.token_ids[node] for node in path]:
                plain = runner.extend([token]).logits[-1]
            unequal += int(not torch.equal(plain, tree_logits[row]))
    return unequal


def test_rows_as_plain_tree_rows_are_plain_decodings_rows_bitwise(tiny_by_dtype):
    model = tiny_by_dtype["bfloat16"]
    assert unequal_tree_rows(model, exact_rows_setup(model.dtype)) == 0


def test_a_lean_exact_row_is_the_row_plain_decoding_computes(tiny_by_dtype):
    model = tiny_by_dtype["bfloat16"]
    runner = ModelRunner(model, compile="off", setup=exact_setup(model.dtype), forward="lean")
    ids = _ids(40, model.config.vocab_size, seed=2)
    runner.reset()
    runner.extend(ids[:20], logits_to_keep=0)
    plain = torch.cat([runner.extend([token]).logits for token in ids[20:]])  # [20, V]
    runner.crop(20)
    chained = torch.cat([runner.extend(ids[i : i + 5]).logits for i in range(20, 40, 5)])  # [20, V]
    assert torch.equal(chained, plain)


def _int4_kernels():
    from localspec.models.gguf_linear import library_here_now

    load = library_here_now()
    q4 = load.library.q4 if load.library is not None else None
    return [None, pytest.param(q4, marks=pytest.mark.skipif(q4 is None, reason=f"q4 kernel: {load.reason}"))]


@pytest.mark.parametrize("kernel", _int4_kernels(), ids=["torch", "q4"])
def test_fused_int4_layers_give_each_parts_columns_and_share_its_codes(kernel):
    parts = [int4_from_q4_1(random_blocks(rows, 96, seed=rows)[0], kernel) for rows in (128, 64, 64)]
    alone_before = [part(torch.randn(3, 96, generator=torch.Generator().manual_seed(3)).bfloat16()) for part in parts]
    fused = lean_llama._fused(parts)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(3)).bfloat16()  # [3, K]
    assert torch.equal(fused(x), torch.cat(alone_before, dim=-1))
    assert all(torch.equal(part(x), before) for part, before in zip(parts, alone_before, strict=True))
    storage = fused.packed.untyped_storage().data_ptr()
    assert all(part.packed.untyped_storage().data_ptr() == storage for part in parts)  # codes kept once
    small = [int4_from_q4_1(random_blocks(rows, 96, seed=rows)[0], kernel) for rows in (32, 16, 16)]
    if kernel is None:  # rows that are not whole packing blocks (64 rows) would interleave: those stay separate
        assert Int4Linear.concatenated(small) is None and lean_llama._fused(small) is None
    else:  # the q4 layout stacks any blocks of 16 outputs
        fused_small = lean_llama._fused(small)
        assert torch.equal(fused_small(x), torch.cat([part(x) for part in small], dim=-1))
    mixed = [int4_from_q4_1(random_blocks(64, 96, seed=rows)[0], k) for rows, k in ((1, None), (2, kernel))]
    assert (Int4Linear.concatenated(mixed) is None) == (kernel is not None)  # never two kernels in one layer


def test_fused_dense_layers_share_the_weight_and_compute_the_same():
    torch.manual_seed(0)
    parts = [nn.Linear(24, rows, bias=False) for rows in (8, 4, 4)]
    x = torch.randn(2, 24)
    before = torch.cat([part(x) for part in parts], dim=-1)
    fused = lean_llama._fused(parts)
    assert torch.equal(fused(x), before)
    assert all(part.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr() for part in parts)
    assert lean_llama._fused([nn.Linear(24, 8, bias=True), nn.Linear(24, 8, bias=False)]) is None


def test_the_forward_falls_back_to_transformers_where_lean_does_not_apply(tiny_by_dtype, monkeypatch):
    model = tiny_by_dtype["float32"]
    assert lean_supported(model)
    for cache, compile in (("dynamic", "off"), ("static", "reduce-overhead")):  # a dynamic or CUDA-graph cache
        assert backbone_for(model, plan_forward(model, cache=cache, compile=compile))[0] == "transformers"
    assert backbone_for(model, plan_forward(model, forward="transformers"))[1] is model.base_model
    kind, first = backbone_for(model, plan_forward(model, forward="lean"))
    assert kind == "lean" and isinstance(first, LeanLlama)
    assert backbone_for(model, plan_forward(model, forward="lean"))[1] is first  # runners of one model share it
    monkeypatch.setenv("LOCALSPEC_FORWARD", "transformers")
    assert ModelRunner(model, compile="off").forward_kind == "transformers"
    monkeypatch.setenv("LOCALSPEC_FORWARD", "fastest")
    with pytest.raises(ConfigError, match="LOCALSPEC_FORWARD"):
        ModelRunner(model, compile="off")
    monkeypatch.setattr(model.config, "mlp_bias", True)
    assert not lean_supported(model)
    assert ModelRunner(model, compile="off", forward="lean").forward_kind == "transformers"


@pytest.mark.slow
def test_the_embedded_gguf_target_runs_lean_and_bitwise_as_transformers(embedded_session):
    model = embedded_session.engine.target.model
    assert embedded_session.engine.target.forward_kind == "lean"
    assert backbone_for(model, plan_forward(model))[1].fused == (model.config.num_hidden_layers,) * 2
    ids = embedded_session.tokenizer("Translate into French: the library opens at nine.")["input_ids"]
    for setup in (exact_setup(torch.bfloat16), FAST):
        ours, theirs = _runners(model, setup)
        for runner in (ours, theirs):
            runner.reset()
        assert torch.equal(ours.extend(ids).logits, theirs.extend(ids).logits)  # prefill: the same ops
        if setup == FAST:  # the exact setup's decode rows are plain decoding's instead (the tests below)
            for rows in (1, 2, 5):
                chunk = _ids(rows, 1000, seed=rows)
                assert torch.equal(ours.extend(chunk).logits, theirs.extend(chunk).logits), rows


def unequal_chain_rows(model, setup, prompt_len: int = 300) -> int:
    """Rows of lean chains of R = 2..9 whose logits are not bitwise plain decoding's (a long prompt)."""
    runner = ModelRunner(model, compile="off", setup=setup, forward="lean")
    prompt, new = _ids(prompt_len, 30000, seed=5), _ids(18, 30000, seed=6)
    runner.reset()
    runner.extend(prompt, logits_to_keep=0)
    plain = torch.cat([runner.extend([token]).logits for token in new])  # [18, V]
    unequal = 0
    for rows in range(2, 10):
        runner.crop(prompt_len)
        chunks = [runner.extend(new[i : i + rows]).logits for i in range(0, len(new), rows)]
        unequal += int((torch.cat(chunks)[: len(new)] != plain).any(-1).sum())
    return unequal


@pytest.mark.slow
def test_the_embedded_targets_rows_as_plain_chains_are_plain_decoding_bitwise(embedded_session):
    assert unequal_chain_rows(embedded_session.engine.target.model, exact_rows_setup(torch.bfloat16)) == 0


def test_the_tree_row_check_sees_a_difference_in_one_forwards_rows(tiny_by_dtype, monkeypatch):
    # whether masked tree rows round as plain decoding's depends on the CPU's kernels (on an AVX-512 BF16 EPYC they
    # do for the embedded model, on a Sapphire Rapids Xeon they do not), so the check's ability to fail is shown here
    # by changing the tree forward's attention alone, by one part in 64
    model = tiny_by_dtype["bfloat16"]
    eager = lean_llama._eager_attention

    def tree_rows_changed(q, keys, values, mask, scaling):
        out = eager(q, keys, values, mask, scaling)  # [1, H, T, D]
        return out * (1 + 2**-6) if q.shape[2] == TREE.size + 1 else out

    assert unequal_tree_rows(model, exact_setup(model.dtype)) == 0
    monkeypatch.setattr(lean_llama, "_eager_attention", tree_rows_changed)
    assert unequal_tree_rows(model, exact_setup(model.dtype)) == 3 * (TREE.size + 1)


@pytest.mark.slow
def test_the_embedded_targets_rows_as_plain_trees_are_bitwise(embedded_session):
    model = embedded_session.engine.target.model
    assert unequal_tree_rows(model, exact_rows_setup(torch.bfloat16)) == 0
    masked = unequal_tree_rows(model, exact_setup(torch.bfloat16))
    if masked:  # not a failure: the reason rows_as_plain exists, on CPUs whose kernels round masked rows differently
        total = 3 * (TREE.size + 1)
        warnings.warn(f"masked tree rows not bitwise plain decoding's on this CPU: {masked} of {total}", stacklevel=1)


def test_a_long_prefill_runs_sdpa_in_the_exact_setup_and_the_rows_after_it_stay_plain(tiny_by_dtype, monkeypatch):
    # a prompt's prefill is the same forward in plain decoding and in speculation, so the exact setup need not run it
    # eagerly; the decode and verify rows after it must still round as plain decoding's
    from localspec.runtime.plan import DECODE_MAX_ROWS

    model = tiny_by_dtype["bfloat16"]
    calls = []
    sdpa = lean_llama._sdpa
    monkeypatch.setattr(lean_llama, "_sdpa", lambda *args: calls.append(args[0].shape[2]) or sdpa(*args))
    runner = ModelRunner(model, compile="off", setup=exact_setup(model.dtype), forward="lean")
    prompt_len = DECODE_MAX_ROWS + 36
    ids = _ids(prompt_len + 20, model.config.vocab_size, seed=4)
    runner.reset()
    runner.extend(ids[:prompt_len], logits_to_keep=0)
    assert calls == [prompt_len] * model.config.num_hidden_layers  # the prefill's rows, on sdpa in every layer
    plain = torch.cat([runner.extend([token]).logits for token in ids[prompt_len:]])  # [20, V]
    runner.crop(prompt_len)
    chained = torch.cat([runner.extend(ids[i : i + 5]).logits for i in range(prompt_len, prompt_len + 20, 5)])
    assert torch.equal(chained, plain) and len(calls) == model.config.num_hidden_layers  # decode rows stay eager


def test_a_prompt_on_an_empty_cache_runs_sdpas_causal_attention_with_the_masks_bits(tiny_by_dtype, monkeypatch):
    # sdpa's own causal attention skips the blocks above the diagonal that a mask tensor makes it compute and drop;
    # a masked key adds exactly 0, so the outputs are the mask's bit for bit. A prompt read on top of a cache (a
    # later turn) keeps the mask: sdpa's is_causal aligns the diagonal to the top left
    from localspec.runtime.plan import DECODE_MAX_ROWS
    from localspec.runtime.tree import causal_mask

    model = tiny_by_dtype["bfloat16"]
    masks = []
    sdpa = lean_llama._sdpa
    monkeypatch.setattr(lean_llama, "_sdpa", lambda q, k, v, mask: masks.append(mask) or sdpa(q, k, v, mask))
    runner = ModelRunner(model, compile="off", setup=exact_setup(model.dtype), forward="lean")
    prompt_len, layers = DECODE_MAX_ROWS + 36, model.config.num_hidden_layers
    ids = _ids(2 * prompt_len, model.config.vocab_size, seed=6)
    runner.reset()
    runner.extend(ids[:prompt_len], logits_to_keep=0)  # as the engine reads a prompt
    assert len(masks) == layers and all(mask is lean_llama.CAUSAL for mask in masks)
    runner.extend(ids[prompt_len:], logits_to_keep=0)  # a second prompt on top of the first
    assert len(masks) == 2 * layers and all(isinstance(mask, torch.Tensor) for mask in masks[layers:])

    @torch.inference_mode()
    def prompt_read(mask):  # the backbone on the prompt alone, as the runner calls it
        runner.reset()
        out = runner._backbone(
            input_ids=torch.tensor([ids[:prompt_len]]),
            attention_mask=mask,
            attention="sdpa",
            output_hidden_states=True,
            **{runner._cache_kwarg: runner.cache},
        )
        return torch.stack(out.hidden_states), runner.cache.layers[-1].keys[:, :, :prompt_len].clone()

    causal, masked = prompt_read(None), prompt_read(causal_mask(0, prompt_len, torch.bool, torch.device("cpu")))
    assert masks[-1] is not lean_llama.CAUSAL and masks[-layers - 1] is lean_llama.CAUSAL
    assert torch.equal(causal[0], masked[0]) and torch.equal(causal[1], masked[1])  # every layer's rows, the keys
