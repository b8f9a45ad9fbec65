"""The attention kernel (runtime/attention_kernel.py): a row's output is the one plain decoding computes for the same
position whatever the other rows of the forward hold, it is within its rounding bound of float64, its self-check
refuses a kernel whose rows change with the call, and the embedded target's chains and trees on it are plain
decoding's rows bitwise."""

from __future__ import annotations

import pytest
import torch

from localspec.models.gguf_linear import library_here_now
from localspec.runtime import attention_kernel
from localspec.runtime.attention_kernel import DTYPES, reference_and_bound, self_check

HEADS, KV_HEADS, DIM = 9, 3, 64  # the embedded model's attention


@pytest.fixture(scope="module")
def kernel():
    load = library_here_now()
    if load.library is None or load.library.attention is None:
        pytest.skip(f"attention kernel: {load.status.reason}")
    return load.library.attention


def _inputs(prefix: int, rows: int, seed: int, capacity_extra: int = 5, dtype: torch.dtype = torch.bfloat16):
    generator = torch.Generator().manual_seed(seed)
    capacity = prefix + rows + capacity_extra  # the cache's buffer: the kernel reads views of it
    keys = torch.randn(1, KV_HEADS, capacity, DIM, generator=generator).to(dtype)
    values = torch.randn(1, KV_HEADS, capacity, DIM, generator=generator).to(dtype)
    q = torch.randn(1, HEADS, rows, DIM, generator=generator).mul(3).to(dtype)  # [1, H, T, D]
    return q, keys, values


def test_the_kernel_passes_its_self_check_on_other_data(kernel):
    for seed in (3, 11):
        assert self_check(kernel, seed=seed) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("prefix", "rows"), [(0, 1), (0, 7), (37, 1), (300, 5), (300, 17)])
def test_outputs_are_within_the_rounding_bound_of_float64(kernel, prefix, rows, dtype):
    q, keys, values = _inputs(prefix, rows, seed=prefix + rows, dtype=dtype)
    length = prefix + rows
    out = kernel.attend(q, keys[:, :, :length], values[:, :, :length], prefix, None, DIM**-0.5)  # [1, T, H·D]
    reference, bound = reference_and_bound(q, keys[:, :, :length], values[:, :, :length], prefix, None, DIM**-0.5)
    assert out.shape == (1, rows, HEADS * DIM) and out.dtype == dtype
    assert bool(((out.double() - reference).abs() <= bound).all())


# the kernel's two layouts of a call (attention.c KEY_LANES): the keys in the lanes for a few rows over a cache at least
# as long as they are (and for every single row), the (row, head) pairs in the lanes for more rows than the cache
LAYOUTS = pytest.mark.parametrize("prefix", [120, 4], ids=["keys-in-lanes", "pairs-in-lanes"])


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_chain_row_is_the_row_alone_and_a_tree_row_ignores_what_its_siblings_hold(kernel, dtype, prefix):
    rows, scaling = 9, DIM**-0.5
    q, keys, values = _inputs(prefix, rows, seed=5, dtype=dtype)
    length = prefix + rows
    chain = kernel.attend(q, keys[:, :, :length], values[:, :, :length], prefix, None, scaling)
    for row in range(rows):  # plain decoding of position prefix + row: one row on the keys up to itself
        seen = prefix + row + 1
        alone = kernel.attend(q[:, :, row : row + 1], keys[:, :, :seen], values[:, :, :seen], seen - 1, None, scaling)
        assert torch.equal(alone[0, 0], chain[0, row]), row
    visible = torch.eye(rows, dtype=torch.bool)  # a star: every node under row 0, none sees another
    visible[:, 0] = True
    tree = kernel.attend(q, keys[:, :, :length], values[:, :, :length], prefix, visible, scaling)
    changed_keys, changed_values = keys.clone(), values.clone()
    changed_keys[:, :, prefix + 1 : prefix + 4] = 7.0  # siblings of row 5 (rows 1..3): hidden from it
    changed_values[:, :, prefix + 1 : prefix + 4] = -7.0
    again = kernel.attend(q, changed_keys[:, :, :length], changed_values[:, :, :length], prefix, visible, scaling)
    assert torch.equal(again[0, 5], tree[0, 5]) and not torch.equal(again[0, 1], tree[0, 1])


@pytest.mark.parametrize("prefix", [50, 10], ids=["keys-in-lanes", "pairs-in-lanes"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_rows_are_the_same_whatever_the_blocks_of_rows_and_the_thread_count(kernel, threads, prefix):
    # 40 rows: in the pairs' layout more than one block of 16 rows per key-value head at every thread count; the
    # work split changes with the thread count, the row count and the layout, a row's output must not
    rows, scaling = 40, DIM**-0.5
    q, keys, values = _inputs(prefix, rows, seed=8)
    length = prefix + rows
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        chain = kernel.attend(q, keys[:, :, :length], values[:, :, :length], prefix, None, scaling)
        for row in (0, 15, 16, 17, 39):
            seen = prefix + row + 1
            alone = kernel.attend(
                q[:, :, row : row + 1], keys[:, :, :seen], values[:, :, :seen], seen - 1, None, scaling
            )
            assert torch.equal(alone[0, 0], chain[0, row]), row
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("march", ["x86-64", "haswell"])
def test_a_build_for_another_instruction_set_computes_the_same_bits(kernel, march, tmp_path):
    # every lane's arithmetic is the scalar rule (fused multiply-adds, exp_fixed), so the vector width the build picks
    # (16 lanes with AVX-512, 8 with AVX2, 1 on plain x86-64) must not change a bit: a row is the same on every CPU
    import ctypes

    from localspec.runtime.attention_kernel import AttentionKernel
    from localspec.runtime.library import SOURCE_DIR, compile_library, cpu_flags

    if march == "haswell" and not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("this CPU cannot run an AVX2 build")
    library = compile_library([SOURCE_DIR / "attention.c"], tmp_path / f"attention-{march}.so", march=march)
    other = AttentionKernel(ctypes.CDLL(str(library)), kernel.limits)
    prefix, rows, scaling = 70, 9, DIM**-0.5
    visible = torch.eye(rows, dtype=torch.bool)
    visible[:, 0] = True
    visible[4:, 3] = True  # a branch: rows 4.. under row 3
    for dtype in DTYPES:  # float16's conversions in software on plain x86-64, F16C's where the build has it
        q, keys, values = _inputs(prefix, rows, seed=21, dtype=dtype)
        length = prefix + rows
        for mask in (None, visible):
            args = (q, keys[:, :, :length], values[:, :, :length], prefix, mask, scaling)
            assert torch.equal(other.attend(*args), kernel.attend(*args)), dtype
        for cached in (0, 15, 16, prefix):  # a single row takes its own layout (decode_attention): the same bits too
            args = (q[:, :, :1], keys[:, :, : cached + 1], values[:, :, : cached + 1], cached, None, scaling)
            assert torch.equal(other.attend(*args), kernel.attend(*args)), dtype


class _OffByOneRounding:
    """An attention kernel whose rows inside a call of more than `plain_rows` rows are one ulp off."""

    def __init__(self, real, plain_rows: int = 1):
        self.real, self.plain_rows = real, plain_rows

    def attend(self, q, keys, values, prefix, visible, scaling):
        out = self.real.attend(q, keys, values, prefix, visible, scaling)
        bits = torch.int32 if out.dtype == torch.float32 else torch.int16
        return out.view(bits).add(1).view(out.dtype) if q.shape[2] > self.plain_rows else out


def test_the_self_check_refuses_a_kernel_whose_rows_depend_on_the_call(kernel):
    problem = self_check(_OffByOneRounding(kernel))
    assert problem is not None and "decoded alone" in problem


def test_inputs_it_cannot_read_are_refused_with_a_reason(kernel):
    q, keys, values = _inputs(10, 2, seed=1)
    with pytest.raises(TypeError, match="bfloat16"):
        kernel.attend(q.float(), keys[:, :, :12], values[:, :, :12], 10, None, 0.125)
    with pytest.raises(ValueError, match="keys"):
        kernel.attend(q, keys[:, :, :11], values[:, :, :11], 10, None, 0.125)  # 11 keys for 10 cached + 2 rows


def test_the_engines_exact_setup_runs_it_where_the_layers_are_on_the_q4_kernel(embedded_session, kernel):
    from localspec.runtime.model_runner import exact_setup_for

    model = embedded_session.engine.target.model
    setup = exact_setup_for(model)
    assert setup.attention_kernel and setup.padded(1) == 1 and setup.describe() == "attention kernel, 1-row decode"


@pytest.mark.slow
def test_the_embedded_targets_chains_and_trees_on_it_are_plain_decodings_rows_bitwise(
    embedded_session, kernel, monkeypatch
):
    from localspec.runtime.lean_llama import backbone_for
    from localspec.runtime.model_runner import exact_setup_for
    from localspec.runtime.plan import plan_forward

    from .test_lean_llama import unequal_chain_rows, unequal_tree_rows

    model = embedded_session.engine.target.model
    setup = exact_setup_for(model)
    lean = backbone_for(model, plan_forward(model, forward="lean"))[1]
    for layer in lean.layers:  # its torch-op layers, which call attend
        monkeypatch.setattr(layer, "layer_kernel", None)
    _assert_plain_rows_and_that_the_check_can_fail(
        monkeypatch, lambda: (unequal_chain_rows(model, setup), unequal_tree_rows(model, setup))
    )


def _assert_plain_rows_and_that_the_check_can_fail(monkeypatch, count_unequal, plain_rows: int = 1) -> None:
    """count_unequal() (the unequal rows of some checks) is all 0 on the kernel, whose attend the forwards called,
    and all > 0 once every call of more than plain_rows rows (a plain forward's) is one ulp off."""
    calls = []
    attend = attention_kernel.AttentionKernel.attend
    monkeypatch.setattr(attention_kernel.AttentionKernel, "attend", lambda *a: calls.append(1) or attend(*a))
    assert all(count == 0 for count in count_unequal())
    assert calls  # the forwards ran on the kernel
    monkeypatch.setattr(
        attention_kernel.AttentionKernel,
        "attend",
        lambda self, *a: _OffByOneRounding(_Real(attend, self), plain_rows).attend(*a),
    )
    assert all(count > 0 for count in count_unequal())


class _Real:
    def __init__(self, attend, kernel):
        self._attend, self._kernel = attend, kernel

    def attend(self, *args):
        return self._attend(self._kernel, *args)


def test_a_setup_asking_for_the_kernel_on_layers_without_it_runs_their_eager_attention(tiny_pair):
    from transformers import AutoModelForCausalLM

    from localspec.runtime.model_runner import ForwardSetup, ModelRunner

    model = AutoModelForCausalLM.from_pretrained(tiny_pair["target"], dtype=torch.bfloat16).eval()  # dense layers
    asked = ModelRunner(model, compile="off", setup=ForwardSetup("eager", True, attention_kernel=True))
    eager = ModelRunner(model, compile="off", setup=ForwardSetup("eager", True))
    ids = torch.randint(0, model.config.vocab_size, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    logits = []
    for runner in (asked, eager):
        runner.reset()
        runner.extend(ids[:20], logits_to_keep=0)
        logits.append(torch.cat([runner.extend(ids[20:25]).logits, runner.extend(ids[25:26]).logits]))
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_dense_targets_exact_setup_takes_the_attached_kernel_and_its_trees_become_plain_rows(
    tiny_pair, kernel, monkeypatch, dtype
):
    """The loader offers the library to a CPU target off the q4 kernel (gguf_linear.offer_library): its exact setup
    then runs decode / verify attention there, with the dtype's dummy rows for the linears, and chain and tree rows
    (which eager attention leaves unequal on real models: assets/rounding/epyc/) are plain decoding's."""
    from transformers import AutoModelForCausalLM

    from localspec.runtime.model_runner import exact_setup, exact_setup_for
    from localspec.runtime.plan import LoadRecord, record_load
    from localspec.verify.guarantee import guarantee_for_model

    from .test_exact import unequal_rows
    from .test_lean_llama import unequal_tree_rows

    def fresh():
        return AutoModelForCausalLM.from_pretrained(tiny_pair["target"], dtype=dtype).eval()

    bare, model = fresh(), fresh()
    record_load(model, LoadRecord(library_here_now().library))
    assert exact_setup_for(bare) == exact_setup(dtype)  # nothing offered: eager attention
    setup = exact_setup_for(model)
    plain_rows = exact_setup(dtype).padded(1)
    assert setup.attention_kernel and setup.padded(1) == plain_rows and setup.describe().startswith("attention kernel")
    assert "attention kernel" in guarantee_for_model(model, "none", "cpu", exact=True).path
    _assert_plain_rows_and_that_the_check_can_fail(
        monkeypatch, lambda: (unequal_rows(model, setup), unequal_tree_rows(model, setup)), plain_rows
    )
