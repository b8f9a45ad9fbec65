"""A head on the kernels' library (heads/on_kernels.py): its Q8_0 blocks round the weights within half a step, its
layer on the layer kernel computes the torch module's layer (on the same Q8_0 weights) up to bfloat16 rounding and
writes the same cache rows, and a proposer over it drafts through the kernel and stays lossless."""

from __future__ import annotations

import pytest
import torch

from localspec.heads.layers import KVCache
from localspec.heads.on_kernels import KernelModule, fits, q8_blocks
from localspec.models.gguf_linear import library_here_now
from localspec.proposers.head import HeadProposer

from .support import make_head
from .test_heads import PROMPT, run_engine


@pytest.fixture(scope="module")
def library():
    load = library_here_now()
    if load.library is None or load.library.layer is None:
        pytest.skip(f"no layer kernel here: {load.reason}")
    return load.library


def test_q8_blocks_round_each_weight_within_half_a_step():
    weight = torch.randn(32, 96, generator=torch.Generator().manual_seed(0)) * 0.05
    weight[3, 32:64] = 0.0  # a group of zeros: d 0, codes 0
    codes, d = q8_blocks(weight)
    assert codes.dtype == torch.int8 and d.dtype == torch.float16 and d.shape == (32, 3)
    assert int(codes.abs().max()) == 127  # each group's largest weight takes the full range
    step = d.float().repeat_interleave(32, dim=1)  # [N, K]
    error = (codes.float() * step - weight).abs()
    assert bool((error <= step / 2 + 1e-3 * step + 1e-12).all())
    assert float(d[3, 1]) == 0.0 and int(codes[3, 32:64].abs().max()) == 0


def q8_weights(module) -> None:
    """The module's linears replaced by their Q8_0 values, so the torch ops and the kernel read the same weights."""
    with torch.no_grad():
        for linear in (module.q_proj, module.k_proj, module.v_proj, module.o_proj, module.gate_proj, module.up_proj):
            codes, d = q8_blocks(linear.weight)
            linear.weight.copy_(codes.float() * d.float().repeat_interleave(32, dim=1))
        codes, d = q8_blocks(module.down_proj.weight)
        module.down_proj.weight.copy_(codes.float() * d.float().repeat_interleave(32, dim=1))


def torch_layer(module, x, positions, cache, theta):
    """HeadModule's decoder layer after its fusion, on the torch ops (as FeatureHead.run_module runs it)."""
    from localspec.heads.layers import rope_cos_sin

    attn_input, residual = module.input_layernorm(x[None]), x[None]
    cos, sin = rope_cos_sin(positions, module.head_dim, theta)
    q, k, v = module.qkv(attn_input, cos, sin)
    keys, values = cache.append(k, v)
    t, total = q.shape[2], keys.shape[2]
    mask = torch.ones((t, total), dtype=torch.bool).tril(total - t)
    out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    return module.finish(out, residual)[0]


def test_the_layer_on_the_kernel_is_the_torch_layer_up_to_bf16_rounding(tiny_models, library):
    target, _ = tiny_models
    head = make_head(target, "eagle").to(torch.bfloat16)
    module, config = head.layers[0], head.config
    assert fits(module, torch.bfloat16) and not fits(module, torch.float32)
    q8_weights(module)
    on_kernel = KernelModule.of(module, library.layer, config.rms_eps, config.rope_theta)
    generator = torch.Generator().manual_seed(1)
    ours, theirs = (KVCache(config.num_kv_heads, config.head_dim, torch.bfloat16, torch.device("cpu")) for _ in "ab")
    for first, rows in ((0, 5), (5, 1), (6, 3)):  # a catch-up of 5 rows, a draft step, 3 more rows
        x = torch.randn(rows, config.hidden_size, generator=generator).to(torch.bfloat16)
        positions = torch.arange(first + 1, first + 1 + rows)
        got = on_kernel.run(x, positions, ours)
        with torch.inference_mode():
            want = torch_layer(module, x, positions, theirs, config.rope_theta)
        assert got.shape == want.shape == (rows, config.hidden_size) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05 * float(want.abs().max()))
    assert ours.length == theirs.length == 9
    torch.testing.assert_close(ours.keys[:, :, :9].float(), theirs.keys[:, :, :9].float(), rtol=0.03, atol=0.03)
    torch.testing.assert_close(ours.values[:, :, :9].float(), theirs.values[:, :, :9].float(), rtol=0.03, atol=0.03)


def test_a_head_on_the_kernels_drafts_through_them_and_stays_lossless(tiny_models, library, monkeypatch):
    target, _ = tiny_models
    head = make_head(target, "eagle").to(torch.bfloat16)
    assert head.use_kernels(library.layer, library.q8) == 1
    calls = []
    run = KernelModule.run
    monkeypatch.setattr(KernelModule, "run", lambda self, *a: calls.append(a[0].shape[0]) or run(self, *a))
    baseline, _ = run_engine(target, None)
    for k in (1, 3):
        ids, stats = run_engine(target, HeadProposer(head), k=k)
        assert ids == baseline
        assert stats.drafted > 0
    assert calls and max(calls) > 1  # catch-ups of several rows and single draft steps both ran on the kernel
    head.float()  # moved: its kernel copies are dropped, the torch ops run again
    assert head._kernel_layers == ()


def test_a_tree_depth_recomputes_the_rows_before_it_bitwise(tiny_models, library):
    target, _ = tiny_models
    head = make_head(target, "eagle").to(torch.bfloat16)
    config = head.config
    on_kernel = KernelModule.of(head.layers[0], library.layer, config.rms_eps, config.rope_theta)
    cache = KVCache(config.num_kv_heads, config.head_dim, torch.bfloat16, torch.device("cpu"))
    generator = torch.Generator().manual_seed(2)
    on_kernel.run(torch.randn(6, config.hidden_size, generator=generator).to(torch.bfloat16), torch.arange(1, 7), cache)
    x = torch.randn(5, config.hidden_size, generator=generator).to(torch.bfloat16)
    # a tree: two depth-1 nodes (rows 0, 1), then three children: of 0, of 0 and of 1 (rows 2, 3, 4)
    parents = [-1, -1, 0, 0, 1]
    visible = torch.zeros(5, 5, dtype=torch.bool)
    for j in range(5):
        walk = j
        while walk >= 0:
            visible[j, walk], walk = True, parents[walk]
    positions = torch.tensor([7, 7, 8, 8, 8])
    first = on_kernel.run(x[:2], positions[:2], cache, visible[:2, :2])
    cache.crop(6)
    again = on_kernel.run(x, positions, cache, visible)
    assert torch.equal(again[:2], first)  # a row is a function of what it sees
    cache.crop(6)
    alone = on_kernel.run(x[[0, 3]], positions[[0, 3]], cache, torch.tensor([[True, False], [True, True]]))
    assert torch.equal(alone[1], again[3])  # a node sees its ancestors and itself only, not its sibling
    assert not torch.equal(again[2], again[3])


def test_a_head_on_the_kernels_drafts_trees_that_stay_lossless(tiny_models, library, monkeypatch):
    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine

    target, _ = tiny_models
    head = make_head(target, "eagle").to(torch.bfloat16)
    head.use_kernels(library.layer, library.q8)
    masked = []
    run = KernelModule.run
    monkeypatch.setattr(
        KernelModule, "run", lambda self, *a: masked.append(len(a) > 3 and a[3] is not None) or run(self, *a)
    )
    engine = Engine(target, {2})
    sampling = SamplingParams(temperature=0.0, max_new_tokens=40)
    plain = [t.token_id for e in engine.generate(list(PROMPT), sampling, SpecConfig(proposer="none")) for t in e.tokens]
    spec = SpecConfig(proposer="head", k=4, tree_nodes=8, adaptive=False)
    trees, last = [], None
    for event in engine.generate(list(PROMPT), sampling, spec, HeadProposer(head)):
        trees.extend(t.token_id for t in event.tokens)
        last = event
    assert trees == plain and last.stats.drafted > 0
    assert any(masked)  # the trees' depths ran on the kernel under their masks
