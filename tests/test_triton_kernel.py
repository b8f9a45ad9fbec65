"""The fused Triton sampler emits exactly the reference's tokens and accepted counts, and matching probabilities.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by triton_fused before Triton
decorates them), so V stays small here; with CUDA the same tests run compiled, at full vocabulary sizes.
"""

import pytest
import torch

from localspec.config import SamplingParams, SpecConfig
from localspec.verify import rejection_sample, triton_available
from localspec.verify.checks import compare_outputs, make_verify_case
from localspec.verify.types import SamplerDraws

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SHAPES = [(1, 1), (1, 3), (1, 8), (4, 1), (4, 3), (4, 8)]
MODES = ["greedy-ngram", "greedy-draft", "stochastic-ngram", "stochastic-draft"]
TEMPERATURES = (0.5, 1.0, 1.5)
# interpreter: V = 1000 by default; 32000 / 49152 slow-marked; 151936 only compiled on a GPU
VOCABS = [
    1000,
    pytest.param(32000, marks=pytest.mark.slow),
    pytest.param(49152, marks=pytest.mark.slow),
    pytest.param(151936, marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")]),
]


def fused():
    from localspec.verify.triton_fused import fused_rejection_sample

    return fused_rejection_sample


def assert_same(case, **launch):
    from functools import partial

    got = case.run(partial(fused(), **launch))
    want = case.run(rejection_sample)
    problems = compare_outputs(got, want)
    assert not problems, problems
    return got


def _case(seed, batch, k, vocab, mode, **extra):
    greedy = mode.startswith("greedy")
    temperature = 0.0 if greedy else TEMPERATURES[seed % len(TEMPERATURES)]
    return make_verify_case(
        seed, batch, k, vocab, temperature=temperature, with_draft_probs=mode.endswith("draft"), device=DEVICE, **extra
    )


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch,k", SHAPES)
def test_kernel_matches_reference(batch, k, mode, vocab):
    seed = SHAPES.index((batch, k)) * 10 + MODES.index(mode)
    # the interpreter's cost is per operation, not per element: a large block keeps it quick at big V
    launch = {} if CUDA or vocab <= 1000 else {"block_v": 8192}
    got = assert_same(_case(seed, batch, k, vocab, mode), **launch)
    if batch == 4:  # the planned rows: all accepted (bonus), first rejected
        assert got.num_accepted[0].item() == k or not mode.startswith("greedy")
        assert got.num_accepted[1].item() == 0


@pytest.mark.parametrize("mode", MODES)
def test_many_blocks_and_splits(mode):
    """Small blocks force several blocks per split and several splits per row: the partial results combine."""
    assert_same(_case(7, 2, 3, 1000, mode), block_v=128, target_splits=4)


@pytest.mark.parametrize("mode", MODES)
def test_plain_decoding_k0(mode):
    assert_same(_case(3, 2, 0, 1000, mode))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["greedy-ngram", "stochastic-draft"])
def test_half_precision_logits(dtype, mode):
    assert_same(_case(11, 4, 3, 1000, mode, dtype=dtype))


@pytest.mark.parametrize(
    "params", [dict(temperature=0.8, top_k=20), dict(temperature=1.2, top_p=0.9), dict(temperature=0.0, top_p=0.05)]
)
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_top_k_top_p(params, with_draft_probs):
    case = make_verify_case(5, 4, 3, 1000, with_draft_probs=with_draft_probs, device=DEVICE, **params)
    assert_same(case)


def _tie_launch():
    return dict(block_v=128, target_splits=4)  # V = 1000 → 4 splits of 2 blocks: ties span lanes, blocks, splits


def test_greedy_ties_lowest_index_wins():
    vocab = 1000
    logits = torch.randn(1, 4, vocab, generator=torch.Generator().manual_seed(0))
    tied = [3, 200, 777, 999]  # different lanes, blocks and splits
    logits[0, :, tied] = 10.0
    near = torch.nextafter(torch.tensor(10.0), torch.tensor(0.0))
    logits[0, 2, 900] = 11.0
    logits[0, 2, 10] = torch.nextafter(torch.tensor(11.0), torch.tensor(0.0))  # 1 ulp below the max
    assert near < 10.0
    draft = torch.tensor([[3, 3, 900]])  # position 0: the lowest tied index (accepted) ...
    case_args = (SamplingParams(), None)
    got = assert_same_raw(logits, draft, None, *case_args)
    assert got.output_token_ids.tolist() == [[3, 3, 900, 3]]  # ... bonus: the lowest tied index again
    draft = torch.tensor([[3, 200, 900]])  # position 1: a higher tied index is not the argmax
    got = assert_same_raw(logits, draft, None, *case_args)
    assert got.output_token_ids.tolist() == [[3, 3, -1, -1]]


def test_greedy_many_ties_in_bfloat16():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(4, 4, 1000, generator=gen) * 2).round().clamp(-4, 4).to(torch.bfloat16)  # 9 values: ties
    draft = logits[:, :3].float().argmax(-1)
    draft[1, 1] = (logits[1, 1].float() == logits[1, 1].float().max()).nonzero()[-1, 0]  # highest tied index
    got = assert_same_raw(logits, draft, None, SamplingParams(), None)
    assert got.num_accepted[1].item() == 1


def test_stochastic_ties_lowest_index_wins():
    """All logits equal and all noise equal: every key ties, so the sample is the lowest index with weight."""
    vocab = 1000
    logits = torch.zeros(2, 3, vocab)
    draft = torch.tensor([[0, 5], [7, 7]])
    uniforms = torch.tensor([[0.9, 0.9], [0.0, 0.9]])  # row 0 rejects at 0; row 1 accepts once, rejects at 1
    draws = SamplerDraws(uniforms, torch.ones(2, 3, vocab))
    got = assert_same_raw(logits, draft, None, SamplingParams(temperature=1.0), draws)
    # row 0: the residual drops the rejected draft token 0, so index 1; row 1: draft 7 dropped, index 0
    assert got.output_token_ids.tolist() == [[1, -1, -1], [7, 0, -1]]


def assert_same_raw(logits, draft, draft_probs, sampling, draws):
    from localspec.verify.checks import VerifyCase

    def to(t):
        return None if t is None else t.to(DEVICE)

    draws = None if draws is None else SamplerDraws(to(draws.uniforms), to(draws.noise))
    return assert_same(VerifyCase(to(logits), to(draft), to(draft_probs), sampling, draws), **_tie_launch())


def test_non_contiguous_inputs():
    """Expanded (stride-0) logits and draft probabilities, as the chi-square checks pass them."""
    case = _case(21, 1, 3, 1000, "stochastic-draft")
    from localspec.verify.checks import VerifyCase

    expanded = VerifyCase(
        case.target_logits.expand(3, -1, -1),
        case.draft_token_ids.expand(3, -1),
        case.draft_probs.expand(3, -1, -1),
        case.sampling,
        SamplerDraws(case.draws.uniforms.expand(3, -1).contiguous(), case.draws.noise.expand(3, -1, -1).contiguous()),
    )
    got = assert_same(expanded)
    assert torch.equal(got.output_token_ids[0], got.output_token_ids[2])


def test_perturbed_draws_change_the_output():
    """The comparison can fail: changing a draw changes the kernel's tokens (and the reference follows)."""
    case = _case(2, 1, 3, 1000, "stochastic-ngram")
    base = assert_same(case)
    n = base.num_accepted[0].item()
    token = base.output_token_ids[0, n].item()
    noise = case.draws.noise.clone()
    noise[0, n, token] *= 1e6  # the emitted token's key collapses: another token must be drawn
    perturbed = assert_same(
        type(case)(
            case.target_logits, case.draft_token_ids, None, case.sampling, SamplerDraws(case.draws.uniforms, noise)
        )
    )
    assert perturbed.output_token_ids[0, n].item() != token
    accept_all = assert_same(
        type(case)(
            case.target_logits,
            case.draft_token_ids,
            None,
            case.sampling,
            SamplerDraws(torch.zeros_like(case.draws.uniforms), case.draws.noise),
        )
    )
    assert accept_all.num_accepted.item() == 3  # uniforms of 0 accept every draft with p_target > 0


def test_comparison_reports_a_wrong_output():
    case = _case(4, 4, 3, 1000, "greedy-draft")
    want = case.run(rejection_sample)
    wrong_tokens = type(want)(
        want.output_token_ids + 1,
        want.num_accepted,
        want.target_probs_of_drafts,
        want.draft_probs_of_drafts,
        want.target_prob_of_last,
    )
    wrong_probs = type(want)(
        want.output_token_ids,
        want.num_accepted,
        want.target_probs_of_drafts * 1.01,
        want.draft_probs_of_drafts,
        want.target_prob_of_last,
    )
    assert compare_outputs(want, want) == []
    assert any("output_token_ids" in p for p in compare_outputs(wrong_tokens, want))
    assert any("target_probs_of_drafts" in p for p in compare_outputs(wrong_probs, want))


@pytest.fixture
def session_on_device(request, tiny_pair):
    if not CUDA:
        return request.getfixturevalue("tiny_session")
    from localspec.chat import ChatSession
    from localspec.models.loading import load_pair
    from localspec.models.registry import load_registry

    return ChatSession(load_pair(load_registry(tiny_pair["models_yaml"])[0], device="cuda"))


def test_engine_tokens_identical_with_triton_sampler(session_on_device):
    """End to end on the tiny pair: the engine with sampler=triton emits the torch sampler's tokens (same seed)."""
    tiny_session = session_on_device
    ids = tiny_session.prompt_ids([{"role": "user", "content": "hello there"}], 8)[0]
    results = {}
    for sampler in ("torch", "triton"):
        for temperature in (0.0, 1.0):
            spec = SpecConfig(proposer="draft", k=3, sampler=sampler)
            sampling = SamplingParams(temperature=temperature, max_new_tokens=8, seed=3)
            tokens = [t.token_id for ev in tiny_session.stream_ids(ids, sampling, spec) for t in ev.tokens]
            results[sampler, temperature] = tokens
    assert results["torch", 0.0] == results["triton", 0.0]
    assert results["torch", 1.0] == results["triton", 1.0]
    assert len(results["torch", 1.0]) == 8


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_no_recompilation_when_k_changes():
    from localspec.verify import triton_fused as tf

    kernels = (tf._row_stats_kernel, tf._sample_partials_kernel, tf._finalize_kernel)

    def compiled():
        return sum(len(cache[0]) for kernel in kernels for cache in kernel.device_caches.values())

    for mode in ("greedy-draft", "stochastic-draft"):
        _case(0, 1, 4, 32000, mode).run(fused())
    before = compiled()
    for k in (1, 2, 3, 5, 8, 13, 16):
        for mode in ("greedy-draft", "stochastic-draft"):
            _case(k, 1, k, 32000, mode).run(fused())
    assert compiled() == before


COMPILE_SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "0"  # before triton_fused imports triton: compiled-mode kernels, no GPU needed
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from localspec.verify import triton_fused as tf

assert not tf.INTERPRETED


def arg_type(name, logits_type):
    if name in ("logits_ptr", "argmax_ptr"):
        return logits_type
    if name in ("draft_ids_ptr", "out_tokens_ptr", "out_accepted_ptr"):
        return "*i64"
    if name.endswith("idx_ptr"):
        return "*i32"
    if name.endswith("_ptr"):
        return "*fp32"
    return "fp32" if name == "temperature" else "i32"


common = dict(MUL_INVERSE=True)
variants = [
    (tf._row_stats_kernel, dict(GREEDY=True, SEPARATE_ARGMAX=True, INDEX_64=False, BLOCK_V=1024), "*bf16"),
    (tf._row_stats_kernel, dict(GREEDY=False, SEPARATE_ARGMAX=False, INDEX_64=False, BLOCK_V=1024), "*fp32"),
    (tf._sample_partials_kernel, dict(HAS_DRAFT_PROBS=True, INDEX_64=False, BLOCK_V=1024, SPLITS_POW2=32), "*fp32"),
    (tf._sample_partials_kernel, dict(HAS_DRAFT_PROBS=False, INDEX_64=False, BLOCK_V=1024, SPLITS_POW2=32), "*bf16"),
    (tf._finalize_kernel, dict(GREEDY=True, HAS_DRAFT_PROBS=False, POSITIONS_POW2=32, SPLITS_POW2=32), "*fp32"),
    (tf._finalize_kernel, dict(GREEDY=False, HAS_DRAFT_PROBS=True, POSITIONS_POW2=32, SPLITS_POW2=32), "*fp32"),
]
variants_for_vectors = [
    (tf._row_stats_kernel, dict(GREEDY=False, SEPARATE_ARGMAX=False, INDEX_64=False, BLOCK_V=1024)),
    (tf._sample_partials_kernel, dict(HAS_DRAFT_PROBS=True, INDEX_64=False, BLOCK_V=1024, SPLITS_POW2=32)),
]
for fn, consts, logits_type in variants:
    consts = {**consts, **common}
    signature = {n: "constexpr" if n in consts else arg_type(n, logits_type) for n in fn.arg_names}
    kernel = triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32),
                            options={"enable_fp_fusion": False})
    assert kernel.asm["cubin"], fn.__name__
    print("compiled", fn.__name__)

# with V, the chunk and the row stride divisible by 16 (as Triton specialises them for V = 32000, 49152, 151936),
# the streaming loads over V must be 128-bit vector loads
for fn, consts in variants_for_vectors:
    consts = {**consts, **common}
    signature = {n: "constexpr" if n in consts else arg_type(n, "*fp32") for n in fn.arg_names}
    aligned = [i for i, n in enumerate(fn.arg_names)
               if n.endswith("_ptr") or n in ("V", "chunk") or (n.startswith("stride_") and n.endswith("row"))]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    kernel = triton.compile(ASTSource(fn, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                            options={"enable_fp_fusion": False})
    assert "ld.global.v4" in kernel.asm["ptx"], f"{fn.__name__}: loads over V are not vectorised"
    print("vectorised", fn.__name__)
"""


@pytest.mark.slow  # a subprocess
def test_kernels_compile_for_hopper_without_a_gpu(tmp_path):
    """The interpreter does not check what compiled Triton rejects (global access, loop-carried types, ...):
    compile every kernel for sm_90 here, with Triton's bundled ptxas, in a process where the interpreter is off,
    and check that the loads over V are vectorised when V is divisible by 16."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(tmp_path / "cache"),
        "TRITON_DEFAULT_FP_FUSION": "0",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("compiled") == 6 and proc.stdout.count("vectorised") == 2


@pytest.mark.slow  # a subprocess
@pytest.mark.skipif(CUDA, reason="about the interpreter, which only runs without CUDA")
def test_interpreter_works_when_triton_was_imported_first():
    """bitsandbytes imports Triton before localspec can set TRITON_INTERPRET: the kernels must still run."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys, triton.language\n"  # Triton's own @jit functions now exist in compiled mode
        "from localspec.verify.checks import compare_outputs, make_verify_case\n"
        "from localspec.verify import rejection_sample\n"
        "from localspec.verify.triton_fused import INTERPRETED, fused_rejection_sample\n"
        "assert INTERPRETED\n"
        "case = make_verify_case(1, 2, 3, 600, temperature=1.0, with_draft_probs=True)\n"
        "problems = compare_outputs(case.run(fused_rejection_sample), case.run(rejection_sample))\n"
        "assert not problems, problems\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, in the interpreter, about the NaNs
@pytest.mark.parametrize("mode", ["greedy-draft", "stochastic-draft", "stochastic-ngram"])
def test_nan_logits_stay_in_bounds(mode):
    """NaN logits are reported by the engine after the step; the kernel must not read or emit outside the row."""
    case = _case(9, 2, 3, 1000, mode)
    logits = case.target_logits.clone()
    logits[0] = float("nan")
    logits[1, 2, 17] = float("nan")
    out = fused()(logits, case.draft_token_ids, case.draft_probs, case.sampling, case.draws)
    tokens = out.output_token_ids.cpu()
    assert ((tokens >= -1) & (tokens < 1000)).all()
    assert 0 <= out.num_accepted.min().item() and out.num_accepted.max().item() <= 3
