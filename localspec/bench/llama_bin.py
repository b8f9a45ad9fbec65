"""Where the bench finds its C++ peers' binaries: one folder per peer, version and CPU,
`<data folder>/<peer folder>/<version>-<cpu tag>/bin`, which `make setup-bench-llama` / `make setup-bench-ik`
(scripts/build_llama_cpp.py) fill.

A peer is a C++ engine built from the vendor/ tree of a pinned PyPI sdist: llama.cpp from llama-cpp-python (the
llama.cpp that a llama-cpp-python user of that release runs), and ik_llama.cpp, the fastest CPU fork of llama.cpp,
from ik-llama-cpp-python. Both are built with GGML_NATIVE for this CPU, so the tag names the CPU's instruction-set
flags.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

from localspec.config import ConfigError


@dataclass(frozen=True)
class Peer:
    name: str  # how the bench and its report name the engine
    package: str  # the PyPI sdist whose vendor tree is built
    version: str
    vendor: str  # the engine's tree inside the unpacked sdist
    folder: str  # <data folder>/<folder>/<version>-<cpu tag>/bin
    binaries: tuple[str, ...]  # what the bench runs
    tools: tuple[str, ...]  # built beside them
    make_target: str
    cmake_options: tuple[str, ...]  # on top of build_llama_cpp.CMAKE_OPTIONS
    server_options: tuple[str, ...]  # its llama-server's spelling of "no web UI"
    returns_ids: bool  # its /completion returns the generated ids (return_tokens); else only their text

    @property
    def sdist(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}"

    @property
    def install_hint(self) -> str:
        return f"run: make {self.make_target} (builds {self.name}'s {' and '.join(self.binaries)} for this CPU once)"


LLAMA_CPP = Peer(
    "llama.cpp",
    "llama-cpp-python",
    "0.3.36",
    "vendor/llama.cpp",
    "llama.cpp",
    ("llama-server", "llama-bench"),  # the bench's llama.cpp modes
    ("llama-quantize",),  # scripts/make_shaped_gguf.py turns its files into any block type
    "setup-bench-llama",
    (
        "-DLLAMA_BUILD_UI=OFF",  # the server's web UI: npm, or a download at build time
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",  # no HTTPS: the bench talks to its server on loopback (this version has no curl option)
    ),
    ("--no-webui",),
    True,
)
IK_LLAMA = Peer(
    "ik_llama.cpp",
    "ik-llama-cpp-python",
    "0.1.5",
    "vendor/ik_llama.cpp",
    "ik_llama.cpp",
    ("llama-server", "llama-bench"),  # the bench's ik_llama.cpp mode; its pp512 / tg128 in the report
    (),
    "setup-bench-ik",
    ("-DLLAMA_CURL=OFF", "-DGGML_IQK_FA_ALL_QUANTS=OFF"),  # IQK flash attention for the usual KV types: a faster build
    ("--webui", "none"),
    False,
)
PEERS = {peer.name: peer for peer in (LLAMA_CPP, IK_LLAMA)}
LLAMA_CPP_PYTHON = LLAMA_CPP.version
BINARIES = LLAMA_CPP.binaries
TOOLS = LLAMA_CPP.tools
# the instruction sets a tag names, best first (a GGML_NATIVE build needs every flag it was compiled for)
TAG_ISAS = (("avx512bf16", {"avx512f", "avx512_bf16"}), ("avx2", {"avx2", "fma", "f16c"}))


def cpu_tag() -> str:
    """The machine, its best instruction set the bench knows, and a short hash of all its CPU flags: a GGML_NATIVE
    build runs only where the flags it was compiled for are present."""
    from localspec.runtime.library import cpu_flags

    flags = cpu_flags()
    isa = next((name for name, needed in TAG_ISAS if needed <= flags), "generic")
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:8]
    return f"{platform.machine().lower()}-{isa}-{digest}"


def bin_dir(peer: Peer = LLAMA_CPP) -> Path:
    from localspec.models.paths import home

    return home() / peer.folder / f"{peer.version}-{cpu_tag()}" / "bin"


def missing(peer: Peer = LLAMA_CPP) -> str | None:
    """None when every binary the bench runs of `peer` is built for this CPU, else what is missing and how to build
    it."""
    folder = bin_dir(peer)
    absent = [name for name in peer.binaries if not (folder / name).is_file()]
    if absent:
        names = " and ".join(absent)
        return f"{peer.name} {peer.version}'s {names} not built for this CPU in {folder}; {peer.install_hint}"
    return None


def binary(name: str, peer: Peer = LLAMA_CPP) -> Path:
    """The path of one of the peer's binaries or tools, or a ConfigError with the install hint."""
    path = bin_dir(peer) / name
    if not path.is_file():
        raise ConfigError(f"{peer.name}'s {name} is not built for this CPU ({path} is missing); {peer.install_hint}")
    return path
