"""The layer kernel (runtime/layer_kernel.py): a whole decoder layer in one C call. Its rows and the cache rows it
writes are those of plain decoding's 1-row calls bitwise, its outputs are within its bound of the torch-op layer, its
self-check refuses a kernel whose rows change with the call, and the embedded target's exact setup runs it: chains
and trees on it are plain decoding's rows bitwise."""

from __future__ import annotations

import pytest
import torch

from localspec.models.gguf_linear import library_here_now
from localspec.runtime.layer_kernel import REFERENCE_REL, LayerKernel, reference_gap, self_check


@pytest.fixture(scope="module")
def kernels():
    load = library_here_now()
    if load.library is None or load.library.attention is None:
        pytest.skip(f"no q4 / attention kernel here: {load.reason}")
    if load.library.layer is None:
        pytest.fail(f"the layer kernel did not load where the attention kernel did: {load.library.notes}")
    return load.library.layer, load.library.q4, load.library.attention


def test_it_passes_its_self_check_on_other_data(kernels):
    for seed in (3, 11, 40):
        assert self_check(*kernels, seed=seed) is None


def test_outputs_stay_within_the_bound_of_the_torch_op_layer_on_seeds_the_bound_was_not_measured_on(kernels):
    gaps = [reference_gap(*kernels, seed) for seed in range(30, 45)]
    assert max(gaps) <= REFERENCE_REL


class _OffByOneInCalls:
    """A layer kernel whose outputs inside a call of more than one row are one bf16 ulp off."""

    def __init__(self, real: LayerKernel):
        self.real = real

    def bind(self, weights):
        bound = self.real.bind(weights)

        class Bound:
            def run(self, x, cos, sin, cache, visible):
                out = bound.run(x, cos, sin, cache, visible)
                return out.view(torch.int16).add(1).view(torch.bfloat16) if x.shape[1] > 1 else out

        return Bound()


class _WrongNorm:
    """A layer kernel computing the layer with its input norm's weights doubled."""

    def __init__(self, real: LayerKernel):
        self.real = real

    def bind(self, weights):
        from dataclasses import replace

        return self.real.bind(replace(weights, input_norm=(weights.input_norm.float() * 2).to(torch.bfloat16)))


def test_the_self_check_refuses_rows_that_change_with_the_call_and_a_wrong_step(kernels):
    layer, q4, attention = kernels
    problem = self_check(_OffByOneInCalls(layer), q4, attention)
    assert problem is not None and "changes with the rows" in problem
    problem = self_check(_WrongNorm(layer), q4, attention)
    assert problem is not None and "torch-op layer" in problem


def test_it_writes_the_cache_in_place_and_grows_it_keeping_what_was_there():
    from localspec.runtime.static_cache import PreallocatedLayer

    layer = PreallocatedLayer(capacity=4, max_capacity=64)
    template = torch.empty((1, 2, 0, 16), dtype=torch.bfloat16)
    assert layer.append_in_place(3, template) == 0 and layer.keys.shape == (1, 2, 4, 16)
    layer.keys[:, :, :3] = 1.0
    assert layer.append_in_place(5, template) == 3 and layer.length == 8 and layer.keys.shape[2] == 8
    assert bool((layer.keys[:, :, :3] == 1.0).all())
    with pytest.raises(ValueError, match="holds 64 positions"):
        layer.append_in_place(57, template)


def test_turned_off_it_says_so(kernels, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_LAYER_KERNEL", "off")  # read at the next load: no cache to clear
    library = library_here_now().library
    assert library.layer is None and any("LOCALSPEC_LAYER_KERNEL=off" in note for note in library.notes)


def _lean(model):
    from localspec.runtime.lean_llama import backbone_for
    from localspec.runtime.plan import plan_forward

    return backbone_for(model, plan_forward(model, forward="lean"))[1]


def _layers(model):
    return _lean(model).layers


def test_the_embedded_targets_layers_run_on_it_and_stay_close_to_their_torch_ops(embedded_session, kernels):
    from .support import layer_kernel_logits

    model = embedded_session.engine.target.model
    assert _lean(model).on_layer_kernel
    generator = torch.Generator().manual_seed(4)
    prompt, new = torch.randint(0, 30000, (40,), generator=generator).tolist(), [501, 9, 2000, 77, 4]
    on_kernel, torch_ops, calls = layer_kernel_logits(model, prompt, new)  # [5, V] each
    assert calls == model.config.num_hidden_layers
    # The two differ in the norms' sums and SiLU's exp; a one-ulp difference there can move an activation's int8
    # code (the matmuls take activations as int8 per group of 32), so single logits move by up to ~3. Measured over
    # 12 prompts of random ids (these and seeds 5..15 of the same draw; Sapphire Rapids Xeon, 2026-12-06): mean
    # |Δlogit| 0.20–0.39, max 1.2–3.1, argmax equal at 3–5 of the 5 positions. The bound on the mean is twice the
    # largest measured; a wrong step (a norm, the rotary, a residual) moves logits by whole units everywhere
    gap = (on_kernel - torch_ops).abs()
    assert 0 < float(gap.max()) and float(gap.mean()) <= 0.78
    assert bool((on_kernel.argmax(-1) == torch_ops.argmax(-1)).float().mean() >= 0.6)


@pytest.mark.slow
def test_the_embedded_targets_chains_and_trees_on_it_are_plain_decodings_rows_bitwise(
    embedded_session, kernels, monkeypatch
):
    from localspec.runtime.model_runner import exact_setup_for

    from .test_lean_llama import unequal_chain_rows, unequal_tree_rows

    model = embedded_session.engine.target.model
    setup = exact_setup_for(model)
    assert unequal_chain_rows(model, setup) == 0 and unequal_tree_rows(model, setup) == 0
    # the same checks fail when the layers' rows are one rounding off inside multi-row calls
    for layer in _layers(model):
        monkeypatch.setattr(layer, "layer_kernel", _OffByOneInCalls(kernels[0]).bind(layer.layer_kernel.weights))
    assert unequal_chain_rows(model, setup) > 0 and unequal_tree_rows(model, setup) > 0


def test_the_embedded_targets_prompt_is_read_on_it_as_its_rows_alone_and_a_longer_one_on_sdpa(
    embedded_session, kernels, monkeypatch
):
    # a prompt past the decode-sized rows runs on the layer kernel too, up to PREFILL_KERNEL_MAX_ROWS: a row there
    # does not depend on the rows beside it, so the prompt read in one forward gives the logits of the same prompt
    # read in pieces (60 rows, then a token at a time) bit for bit; past that bound the prompt is sdpa's
    from localspec.runtime import layer_kernel, lean_llama, plan
    from localspec.runtime.model_runner import ModelRunner, exact_setup_for

    model = embedded_session.engine.target.model
    runner = ModelRunner(model, compile="off", setup=exact_setup_for(model), forward="lean")
    assert runner.plan.prefill_attention.value == "kernel"
    calls, sdpa_calls, run, sdpa = [], [], layer_kernel.BoundLayer.run, lean_llama._sdpa
    monkeypatch.setattr(
        layer_kernel.BoundLayer, "run", lambda self, x, *a: calls.append(x.shape[1]) or run(self, x, *a)
    )
    monkeypatch.setattr(lean_llama, "_sdpa", lambda q, *a: sdpa_calls.append(q.shape[2]) or sdpa(q, *a))
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 30000, (plan.DECODE_MAX_ROWS + 36,), generator=generator).tolist()
    layers = model.config.num_hidden_layers
    runner.reset()
    whole = runner.extend(ids).logits  # [100, V]
    assert calls == [len(ids)] * layers and not sdpa_calls
    runner.reset()
    pieces = [runner.extend(ids[:60]).logits] + [runner.extend([token]).logits for token in ids[60:]]
    assert torch.equal(whole, torch.cat(pieces))
    monkeypatch.setattr(plan, "PREFILL_KERNEL_MAX_ROWS", len(ids) - 1)
    calls.clear()
    runner.reset()
    runner.extend(ids, logits_to_keep=1)
    assert sdpa_calls == [len(ids)] * layers and not calls
