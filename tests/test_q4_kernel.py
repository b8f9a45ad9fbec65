"""The q4 kernel: its layout round-trips, it matches float64 within its stated bound, a row's output does not depend
on the other rows of the call, its self-check refuses a kernel that is off by one rounding, and where it cannot run
the reason is said and torch's kernel takes over."""

from __future__ import annotations

import pytest
import torch

from localspec.config import Environment
from localspec.models.gguf_linear import library_here_now
from localspec.runtime import library as kernel_library
from localspec.runtime import q4_kernel
from localspec.runtime.library import load_library
from localspec.runtime.q4_kernel import pack_q4, reference_and_bound, self_check, unpack_q4

from .conftest import library_or_skip
from .test_gguf_linear import random_blocks


def _fields(n: int, k: int, seed: int = 0):
    """codes [N, K], d and m [N, K/32] float16, as test_gguf_linear's random_blocks draws them."""
    return random_blocks(n, k, seed)[1:]


@pytest.fixture(scope="module")
def kernel():
    return library_or_skip("q4 kernel")


def test_the_layout_round_trips():
    codes, d, m = _fields(48, 96)
    back_codes, back_d, back_m = unpack_q4(*pack_q4(codes, d, m))
    assert torch.equal(back_codes, codes.to(torch.int32)) and torch.equal(back_d, d) and torch.equal(back_m, m)


def test_the_q6k_planes_hold_every_6_bit_code_and_give_it_back():
    """pack_q6k keeps Q6_K's codes q − 32 ∈ [−32, 31] in 4 + 2 bit planes (6 bits a code, as the file stores them):
    every code of every quad and lane comes back, and the planes are three quarters of the int8 quads' bytes."""
    from localspec.runtime.q4_kernel import _quads, six_codes, six_planes

    codes = torch.randint(-32, 32, (32, 512), generator=torch.Generator().manual_seed(3)).to(torch.int8)
    codes[0, :64] = torch.arange(-32, 32, dtype=torch.int8)  # each value at least once
    quads = _quads(codes, 16)  # [N/16, K/16, 4, 16, 4]
    planes = six_planes(quads)
    assert planes.shape == (2, 32, 3, 16, 4) and planes.numel() * 4 == quads.numel() * 3
    back = six_codes(planes.reshape(2, 32, 3, 64)).reshape(quads.shape)
    assert torch.equal(back, quads)


def test_a_layer_that_is_not_whole_blocks_is_refused():
    with pytest.raises(ValueError, match="16·n outputs"):
        pack_q4(*_fields(24, 64))


def test_the_kernel_passes_its_self_check_on_other_data(kernel):
    assert self_check(kernel.q4, seed=7) is None


@pytest.mark.parametrize(("n", "k"), [(576, 576), (1536, 576), (576, 1536)])  # the embedded model's shapes
def test_rows_are_the_same_alone_and_inside_17_rows_and_within_the_rounding_bound_of_float64(kernel, n, k):
    codes, d, m = _fields(n, k, seed=n + k)
    packed, dm = pack_q4(codes, d, m)
    kernel = kernel.q4
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)  # [17, K]
    full = kernel.matmul(x, packed, dm, n)  # [17, N]
    for rows in range(1, 18):
        assert torch.equal(kernel.matmul(x[:rows], packed, dm, n), full[:rows])
    reference, bound = reference_and_bound(x, codes, d, m)
    assert bool(((full.double() - reference).abs() <= bound).all())
    assert kernel.matmul(x.reshape(17, 1, k), packed, dm, n).shape == (17, 1, n)  # leading dims kept
    assert kernel.matmul(x[:0], packed, dm, n).shape == (0, n)


class _OffByOneRounding:
    """A kernel whose rows inside a call of more than one row are one bf16 ulp off: a shape-dependent kernel."""

    def __init__(self, real):
        self.real = real

    def matmul(self, x, codes, dm, out_features):
        out = self.real.matmul(x, codes, dm, out_features)
        if x.reshape(-1, x.shape[-1]).shape[0] > 1:
            out = out.view(torch.int16).add(1).view(torch.bfloat16)
        return out


def test_the_self_check_refuses_a_kernel_whose_rows_depend_on_the_row_count(kernel):
    problem = self_check(_OffByOneRounding(kernel.q4))
    assert problem is not None and "row count" in problem


def test_where_it_cannot_run_it_says_why(tmp_path):
    """The instruction sets are the C sources' to say (kernels/limits.h): a target with neither (x86-64-v2: SSE4.2,
    no AVX2) is refused with their reason; the switch is read from the environment record, no cache to clear."""
    if kernel_library._missing() is not None:
        pytest.skip(f"q4 kernel: {kernel_library._missing()}")
    load = load_library(tmp_path, march="x86-64-v2")
    assert load.library is None and "neither instruction set" in load.reason
    assert "LOCALSPEC_Q4_KERNEL=off" in load_library(tmp_path, enabled=False).reason
    assert Environment.read({"LOCALSPEC_Q4_KERNEL": "off"}).q4_kernel is False


def test_a_source_that_does_not_compile_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    if kernel_library._missing() is not None:
        pytest.skip(f"q4 kernel: {kernel_library._missing()}")
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(kernel_library, "SOURCES", (broken,))
    load = load_library(tmp_path / "build")
    assert load.library is None and load.reason.startswith("could not build it")


def test_a_first_start_builds_the_library_once_in_the_background(monkeypatch, tmp_path):
    """prebuild compiles the library in a thread while the caller goes on (the app imports torch meanwhile), and
    never loads it there (loaded before torch, it would bring another libgomp); load_library waits for that build
    instead of making its own, and nothing but the library and its sha256 is left in the folder (the per-source
    objects of the parallel compile are removed)."""
    import threading

    from localspec.runtime.library import DIGEST, target_path

    if kernel_library._missing() is not None:
        pytest.skip(f"q4 kernel: {kernel_library._missing()}")
    builds, opened_in = [], []
    compile_library, open_verified = kernel_library.compile_library, kernel_library._open_verified
    monkeypatch.setattr(kernel_library, "compile_library", lambda *a, **k: builds.append(a) or compile_library(*a, **k))
    monkeypatch.setattr(
        kernel_library,
        "_open_verified",
        lambda target: opened_in.append(threading.current_thread().name) or open_verified(target),
    )
    build = tmp_path / "kernels"
    thread = kernel_library.prebuild(build)
    assert thread is not None
    load = load_library(build)
    thread.join()
    assert load.library is not None and load.library.q4 is not None, load.reason
    assert len(builds) == 1
    assert opened_in and set(opened_in) == {threading.current_thread().name}  # loaded by the load only
    assert kernel_library.prebuild(build) is None  # built already: nothing to do
    target = target_path(build)
    assert sorted(path.name for path in build.iterdir()) == sorted([target.name, target.name + DIGEST])
    load_library.cache_clear()


def test_the_exact_setup_drops_the_dummy_row_only_where_every_decoder_linear_is_row_invariant(kernel):
    from torch import nn

    from localspec.runtime.int4_linear import Int4Linear
    from localspec.runtime.model_runner import exact_setup, exact_setup_for

    def model_of(*linears):
        model = nn.Module()
        model.model = nn.Module()
        model.model.layers = nn.ModuleList([nn.Sequential(*linears)])
        model.embed = nn.Embedding(4, 64, dtype=torch.bfloat16)
        model.get_input_embeddings = lambda: model.embed
        return model

    q4 = [Int4Linear.from_q4_1(*_fields(64, 64, seed=s), kernel.q4) for s in (1, 2)]
    torch_int4 = Int4Linear.from_q4_1(*_fields(64, 64, seed=3), None)
    dense = nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)
    assert exact_setup_for(model_of(*q4)).padded(1) == 1
    assert exact_setup_for(model_of(*q4)).attention == "eager" and exact_setup_for(model_of(*q4)).explicit_mask
    for mixed in (model_of(q4[0], torch_int4), model_of(q4[0], dense)):  # one shape-dependent linear: dummy row back
        assert exact_setup_for(mixed) == exact_setup(torch.bfloat16) and exact_setup_for(mixed).padded(1) == 2


def test_the_cli_note_says_which_int4_kernel_runs_and_why(monkeypatch):
    from localspec.models.gguf_linear import int4_kernel_note

    monkeypatch.setenv("LOCALSPEC_Q4_KERNEL", "off")
    assert int4_kernel_note() == (
        "int4 kernel: torch's _weight_int4pack_mm_for_cpu (the q4 kernel: turned off (LOCALSPEC_Q4_KERNEL=off))"
    )
    monkeypatch.delenv("LOCALSPEC_Q4_KERNEL")  # read again at the next load: no cache to clear
    here = library_here_now()
    assert int4_kernel_note().startswith("int4 kernel: q4" if here.library is not None else "int4 kernel: torch's")


def _q8_fields(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (n, k), generator=generator).to(torch.int8)
    d = (torch.rand(n, k // 32, generator=generator) * 0.004 + 1e-4).half()
    return codes, d


def test_q8_0_blocks_are_taken_apart_as_the_gguf_reader_does():
    import gguf
    import numpy as np

    from localspec.models.gguf_linear import q8_fields

    codes, d = _q8_fields(8, 128, seed=1)
    blocks = torch.cat(  # ggml's block_q8_0: d, then 32 int8 codes
        [d.view(torch.uint8).reshape(8, 4, 2), codes.view(torch.uint8).reshape(8, 4, 32)], dim=-1
    ).reshape(8, -1)
    back_codes, back_d = q8_fields(blocks)
    assert torch.equal(back_codes, codes) and torch.equal(back_d, d)
    theirs = gguf.dequantize(blocks.numpy(), gguf.GGMLQuantizationType.Q8_0).reshape(8, 128)
    ours = (codes.reshape(8, 4, 32).float() * d.float()[..., None]).reshape(8, 128)
    assert torch.equal(ours, torch.from_numpy(np.ascontiguousarray(theirs)))


def test_the_q8_heads_rows_are_the_same_alone_and_inside_17_rows_and_within_the_bound_of_float64(kernel):
    from localspec.runtime.q4_kernel import q8_reference_and_bound
    from localspec.runtime.q8_head import Q8Head

    codes, d = _q8_fields(4096, 576, seed=2)  # the embedded model's head: 49,152 × 576
    head = Q8Head.from_q8_0(codes, d, kernel.q8)
    x = torch.randn(17, 576, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    full = head(x)  # [17, N] float32
    assert full.dtype == torch.float32 and full.shape == (17, 4096)
    for rows in range(1, 18):
        assert torch.equal(head(x[:rows]), full[:rows])
    reference, bound = q8_reference_and_bound(x, codes, d)
    assert bool(((full.double() - reference).abs() <= bound).all())


class _Q8OffByOneRounding:
    """The q8 matmul one float32 ulp off for calls of more than one row."""

    def __init__(self, real):
        self.real = real

    def matmul(self, x, codes, d, out_features):
        out = self.real.matmul(x, codes, d, out_features)
        return out.view(torch.int32).add(1).view(torch.float32) if x.shape[0] > 1 else out


def test_the_q8_self_check_refuses_a_kernel_whose_rows_depend_on_the_row_count(kernel):
    problem = q4_kernel.q8_self_check(_Q8OffByOneRounding(kernel.q8))
    assert problem is not None and "row count" in problem


def test_the_avx2_build_passes_both_self_checks_on_a_machine_that_runs_the_avx512_one(kernel, tmp_path):
    """A machine runs one build of the library (-march=native); the other build's matmuls are checked here by
    compiling them for Haswell (AVX2 + FMA + F16C), on every CPU that can run it."""
    import ctypes

    from localspec.runtime.library import SOURCES, Limits, compile_library, cpu_flags
    from localspec.runtime.q4_kernel import Q4Matmul, Q8Matmul, q8_self_check

    if not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("this CPU cannot run an AVX2 build")
    library = ctypes.CDLL(str(compile_library(SOURCES, tmp_path / "kernels-haswell.so", march="haswell")))
    assert Limits.of(library).isa == "avx2"
    for seed in (3, 4):
        assert self_check(Q4Matmul(library), seed) is None and q8_self_check(Q8Matmul(library), seed) is None


def test_both_builds_give_every_matmul_the_same_bits(kernel, tmp_path):
    """The matmuls' integer dot products are exact and their float steps are the same operations in both builds
    (kernels/q4_matmul.c, q8_matmul.c), so the AVX2 build and this machine's give every output the same bits: q4, q4f,
    q8, q8k, q4k and q6k."""
    import ctypes

    from localspec.runtime.library import SOURCES, compile_library, cpu_flags
    from localspec.runtime.q4_kernel import (
        Q4FMatmul,
        Q4KMatmul,
        Q4Matmul,
        Q6KMatmul,
        Q8KMatmul,
        Q8Matmul,
        k_scales,
        pack_q4k,
        pack_q6k,
        pack_q8,
        pack_q8k,
    )

    if not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("this CPU cannot run an AVX2 build")
    if kernel.limits.isa == "avx2":
        pytest.skip("this machine runs the AVX2 build itself")
    haswell = ctypes.CDLL(str(compile_library(SOURCES, tmp_path / "kernels-haswell.so", march="haswell")))
    generator = torch.Generator().manual_seed(11)
    n, k = 4096, 1536  # enough outputs that a float32 step done otherwise shows in some bfloat16 result
    x = (torch.randn(9, k, generator=generator) * 3).to(torch.bfloat16)
    x[2, :32] = 0  # a group whose scale is 0
    d, m = k_scales(generator, n, k // 32, 63), -k_scales(generator, n, k // 32, 63)
    codes = torch.randint(0, 16, (n, k), generator=generator)
    signed = torch.randint(-128, 128, (n, k), generator=generator).to(torch.int8)
    d16, m16 = k_scales(generator, n, k // 16, 127), -k_scales(generator, n, k // 16, 63)
    cases = [
        (Q4Matmul, pack_q4(codes, d.half(), m.half())),
        (Q4FMatmul, pack_q4(codes, d, m, torch.float32)),
        (Q8Matmul, pack_q8(signed, d.half())),
        (Q8KMatmul, pack_q8k(signed.clamp(-32, 31), d16, m16)),
        (Q4KMatmul, pack_q4k(codes, d[:, ::8].half(), m[:, ::8].abs().half(), d16[:, ::2].long() % 64, codes[:, ::32])),
        (Q6KMatmul, pack_q6k(signed.clamp(-32, 31), d[:, ::8].half(), signed[:, ::16])),
    ]
    for kind, (packed, scales) in cases:
        here = getattr(kernel, kind.KIND).matmul(x, packed, scales, n)
        assert torch.equal(here, kind(haswell).matmul(x, packed, scales, n)), kind.KIND


def test_the_amx_tiles_give_the_bits_of_the_dot_products(kernel, tmp_path):
    """Where the CPU has AMX-INT8, the block matmuls' calls of many rows sum Σ q·x̂ on the tiles (kernels/amx.h):
    the same exact int32 sums and float steps, so the same bits as the VNNI dot products, at every row count, for q4,
    q4f, q4k, q8, q8k and q6k; the loaded library turns them on for calls of at least AMX_ROWS rows."""
    import ctypes

    from localspec.runtime.library import AMX_ROWS, SOURCES, compile_library, use_amx
    from localspec.runtime.q4_kernel import (
        Q4FMatmul,
        Q4KMatmul,
        Q4Matmul,
        Q6KMatmul,
        Q8KMatmul,
        Q8Matmul,
        k_scales,
        pack_q4k,
        pack_q6k,
        pack_q8,
        pack_q8k,
    )

    if kernel.limits.isa != "avx512bf16":
        pytest.skip("AMX runs in the avx512bf16 build only")
    own = ctypes.CDLL(str(compile_library(SOURCES, tmp_path / "kernels-own.so")))  # its own switch, not the shared one
    if not use_amx(own, True):
        pytest.skip("no AMX-INT8 on this CPU (or Linux did not grant the tile state)")
    assert kernel.amx_rows == (AMX_ROWS if Environment().amx else 0)
    generator = torch.Generator().manual_seed(5)
    n, k = 1024, 768
    codes = torch.randint(0, 16, (n, k), generator=generator)
    d, m = k_scales(generator, n, k // 32, 63), -k_scales(generator, n, k // 32, 63)
    d16, m16 = k_scales(generator, n, k // 16, 127), -k_scales(generator, n, k // 16, 63)
    signed = torch.randint(-128, 128, (n, k), generator=generator).to(torch.int8)
    sc = torch.randint(-128, 128, (n, k // 16), generator=generator)
    cases = [
        (Q4Matmul, pack_q4(codes, d.half(), m.half())),
        (Q4FMatmul, pack_q4(codes, d, m, torch.float32)),
        (Q4KMatmul, pack_q4k(codes, d[:, ::8].half(), m[:, ::8].abs().half(), d16[:, ::2].long() % 64, codes[:, ::32])),
        (Q8Matmul, pack_q8(signed, d.half())),
        (Q8KMatmul, pack_q8k(signed.clamp(-32, 31), d16, m16)),
        (Q6KMatmul, pack_q6k(signed.clamp(-32, 31), d[:, ::8].half(), sc)),
    ]
    set_rows = own.localspec_amx_rows
    for kind, (packed, scales) in cases:
        matmul = kind(own)
        for rows in (4, 9, 16, 17, 33):
            x = (torch.randn(rows, k, generator=generator) * 3).to(torch.bfloat16)
            x[1, 32:64] = 0  # a group whose scale is 0
            set_rows(1)
            tiles = matmul.matmul(x, packed, scales, n)
            set_rows(0)
            dots = matmul.matmul(x, packed, scales, n)
            assert torch.equal(tiles.view(torch.uint8), dots.view(torch.uint8)), (kind.KIND, rows)  # bit for bit


def test_a_library_planted_in_the_cache_is_never_loaded(tmp_path):
    """A shared object left at the library's own name in the build folder (with no sha256 the build recorded, or a
    recorded one that does not match) runs no constructor: it is removed and the library built again; the build
    folder is owner-only."""
    import subprocess

    from localspec.runtime.library import DIGEST, compiler, target_path

    if kernel_library._missing() is not None:
        pytest.skip(f"q4 kernel: {kernel_library._missing()}")
    build, marker = tmp_path / "kernels", tmp_path / "planted-ran"
    source = tmp_path / "planted.c"
    source.write_text(
        "#include <stdio.h>\n"
        f'__attribute__((constructor)) static void planted(void) {{ FILE *f = fopen("{marker}", "w"); '
        "if (f) fclose(f); }\n"
    )
    build.mkdir(mode=0o777)
    build.chmod(0o777)
    target = target_path(build)
    subprocess.run([compiler(), "-shared", "-fPIC", str(source), "-o", str(target)], check=True)
    load = load_library(build)  # no sha256 recorded for it: removed, built again
    assert not marker.exists(), "the planted library's constructor ran"
    assert load.library is not None and load.library.q4 is not None, load.reason
    subprocess.run([compiler(), "-shared", "-fPIC", str(source), "-o", str(target)], check=True)
    assert kernel_library._open_verified(target) is None  # a recorded sha256 of other bytes: not opened
    assert not marker.exists() and target.with_name(target.name + DIGEST).exists()
    assert build.stat().st_mode & 0o022 == 0  # no longer writable by group or others
    load_library.cache_clear()
