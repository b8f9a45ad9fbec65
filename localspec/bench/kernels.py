"""The kernel calls `localspec bench kernels` times: each build of the kernels' library (the working tree's sources, or
another git revision's) and, per kernel and row count, one prepared call on the embedded model's shapes with random
weights and inputs, the same inputs for every build (so outputs can be compared bit for bit).

The only module of the measurement commands that touches the kernels' Python handle (runtime/q4_kernel.py and its
siblings); the interleaving, medians and tables are bench/interleave.py's.
"""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from localspec.config import ConfigError, Environment
from localspec.runtime import attention_kernel, layer_kernel, library, q4_kernel
from localspec.runtime.attention_kernel import AttentionKernel
from localspec.runtime.layer_kernel import LayerKernel, LayerWeights, LinearPart, rotary
from localspec.runtime.library import HEADERS, SOURCES, Limits, compile_library
from localspec.runtime.q4_kernel import GROUP, Q4Matmul, Q8Matmul, pack_q4, pack_q8

ROOT = Path(__file__).resolve().parents[2]
KERNEL_NAMES = ("q4", "q8", "attention", "layer")
# SmolLM2-135M, the embedded model: its lean linears (N, K) per layer, layers, LM head, attention and MLP shapes
LINEARS = ((960, 576), (576, 576), (3072, 576), (576, 1536))
LAYERS = 30
VOCAB, HIDDEN, INTERMEDIATE = 49152, 576, 1536
HEADS, KV_HEADS, DIM = 9, 3, 64
WHAT = {
    "q4": f"all {LAYERS * len(LINEARS)} lean linears (q4 matmul)",
    "q8": f"the Q8_0 LM head {VOCAB} × {HIDDEN} (q8 matmul)",
    "attention": "one layer's decode / verify attention",
    "layer": "one decoder layer (layer kernel)",
}


@dataclass(frozen=True)
class Build:
    """One build of the library and its kernels; a kernel the build lacks or whose self-check fails is None, and
    missing says why."""

    name: str
    isa: str  # the build of the sources that runs (kernels/limits.h), or why it is not known
    q4: Q4Matmul | None
    q8: Q8Matmul | None
    attention: AttentionKernel | None
    layer: LayerKernel | None
    missing: dict[str, str]

    def kernel(self, name: str):
        return getattr(self, name)


def sources_at(rev: str, folder: Path) -> list[Path]:
    """The library's sources (and the headers beside them) as they were at git revision `rev`, written to folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in SOURCES + HEADERS:
        relative = path.relative_to(ROOT).as_posix()
        shown = subprocess.run(["git", "show", f"{rev}:{relative}"], cwd=ROOT, capture_output=True, check=False)
        if shown.returncode and path in SOURCES:
            raise ConfigError(f"cannot read {relative} at {rev}: {shown.stderr.decode().strip()}")
        if not shown.returncode:
            (folder / path.name).write_bytes(shown.stdout)
    return [folder / path.name for path in SOURCES]


def load_build(name: str, sources: list[Path], target: Path, march: str = "native") -> Build:
    """Compile `sources` for `march` into target and load each kernel of it after its self-check."""
    missing_here = library._missing()
    if missing_here is not None:
        raise ConfigError(f"the kernels' library cannot be built here: {missing_here}")
    try:
        handle = ctypes.CDLL(str(compile_library(sources, target, march)))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"building {name} for {march} failed: {exc}") from exc
    library.use_amx(handle, Environment().amx)  # as the app loads it (a build of older sources has no switch)
    missing: dict[str, str] = {}
    try:
        isa = Limits.of(handle).isa
    except AttributeError:  # an older revision's library, which exports no limits
        isa = "ISA not exported"
    q4, q8 = Q4Matmul(handle), Q8Matmul(handle)
    problem = q4_kernel.self_check(q4) or q4_kernel.q8_self_check(q8)
    if problem is not None:
        missing["q4"] = missing["q8"] = f"self-check failed: {problem}"
    attention = layer = None
    try:
        attention = AttentionKernel(handle, Limits.of(handle))
        problem = attention_kernel.self_check(attention)
        if problem is not None:
            missing["attention"], attention = f"self-check failed: {problem}", None
    except AttributeError as exc:  # an older revision's library without the kernel
        missing["attention"] = f"not in this build ({exc})"
    try:
        layer = LayerKernel(handle)
        problem = None if attention is None else layer_kernel.self_check(layer, q4, attention)
        if attention is None or problem is not None:
            missing["layer"], layer = f"self-check failed: {problem}" if problem else "no attention kernel", None
    except AttributeError as exc:
        missing["layer"] = f"not in this build ({exc})"
    checked = "q4" not in missing
    return Build(name, isa, q4 if checked else None, q8 if checked else None, attention, layer, missing)


def _q4_weights(n: int, k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    codes = torch.randint(0, 16, (n, k), generator=generator)
    d = (torch.rand(n, k // GROUP, generator=generator) * 0.4 / k**0.5).half()
    m = (-7.5 * d.float() + torch.randn(n, k // GROUP, generator=generator) * 0.01).half()  # centred weights
    return pack_q4(codes, d, m)


def _q4_projection(n: int, k: int, generator: torch.Generator) -> tuple[LinearPart]:
    """One q4 linear as the layer kernel takes a projection: one part."""
    return (LinearPart("q4", n, *_q4_weights(n, k, generator)),)


class _Cache:
    """A cache layer of fixed buffers that every call writes at the same positions (what BoundLayer.run needs)."""

    def __init__(self, cached: int, rows: int, generator: torch.Generator) -> None:
        shape = (1, KV_HEADS, cached + rows, DIM)  # [1, Hkv, capacity, D]
        self.keys, self.values = (torch.randn(shape, generator=generator).to(torch.bfloat16) for _ in range(2))
        self.cached = cached

    def append_in_place(self, rows: int, template: torch.Tensor) -> int:
        return self.cached


Call = Callable[[Build], Callable[[], torch.Tensor]]


def prepare(kernel: str, rows: int, cached: int, seed: int = 0) -> Call:
    """For each build, a call of `kernel` on `rows` rows (`cached` positions before them for attention and layer)
    returning its output; the weights and inputs are made once, here."""
    generator = torch.Generator().manual_seed(seed)
    if kernel == "q4":
        weights = [(n, *_q4_weights(n, k, generator)) for n, k in LINEARS]
        x = {k: torch.randn(rows, k, generator=generator).to(torch.bfloat16) for k in (HIDDEN, INTERMEDIATE)}

        def q4(build: Build) -> Callable[[], torch.Tensor]:
            def call() -> torch.Tensor:
                for _ in range(LAYERS):
                    outs = [build.q4.matmul(x[k], codes, dm, n) for (n, codes, dm), (_, k) in zip(weights, LINEARS)]
                return torch.cat([out.flatten() for out in outs])

            return call

        return q4
    if kernel == "q8":
        codes = torch.randint(-128, 128, (VOCAB, HIDDEN), generator=generator).to(torch.int8)
        packed, scales = pack_q8(codes, (torch.rand(VOCAB, HIDDEN // 32, generator=generator) * 0.01).half())
        x = torch.randn(rows, HIDDEN, generator=generator).to(torch.bfloat16)
        return lambda build: lambda: build.q8.matmul(x, packed, scales, VOCAB)
    if kernel == "attention":
        q = torch.randn(1, HEADS, rows, DIM, generator=generator).mul(3).to(torch.bfloat16)  # [1, H, T, D]
        cache = _Cache(cached, rows, generator)
        return lambda build: lambda: build.attention.attend(q, cache.keys, cache.values, cached, None, DIM**-0.5)
    if kernel == "layer":
        norm = lambda: (1 + 0.2 * torch.randn(HIDDEN, generator=generator)).to(torch.bfloat16)  # noqa: E731
        qkv = ((HEADS + 2 * KV_HEADS) * DIM, HIDDEN)
        shapes = (qkv, (HIDDEN, HEADS * DIM), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE))
        parts = [_q4_projection(n, k, generator) for n, k in shapes]
        weights = LayerWeights(norm(), norm(), *parts, 1e-5, 1e-5, DIM**-0.5, HEADS, KV_HEADS, DIM, INTERMEDIATE)
        x = torch.randn(1, rows, HIDDEN, generator=generator).to(torch.bfloat16)  # [1, T, H]
        cos, sin = rotary(rows, cached, DIM)
        cache = _Cache(cached, rows, generator)

        def layer(build: Build) -> Callable[[], torch.Tensor]:
            bound = build.layer.bind(weights)
            return lambda: bound.run(x, cos, sin, cache, None)

        return layer
    raise ConfigError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNEL_NAMES)}")
