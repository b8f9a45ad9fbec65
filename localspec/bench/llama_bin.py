"""Where the bench finds llama.cpp's own binaries (llama-server, llama-bench): one folder per llama.cpp version and CPU,
`<data folder>/llama.cpp/<version>-<cpu tag>/bin`, which `make setup-bench-llama` (scripts/build_llama_cpp.py) fills.

The version is the vendor/llama.cpp of a pinned llama-cpp-python sdist: the llama.cpp that a llama-cpp-python user of
that release runs, built with GGML_NATIVE for this CPU, so the tag names the CPU's instruction-set flags.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

from localspec.config import ConfigError

LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python sdist whose vendor/llama.cpp is built
BINARIES = ("llama-server", "llama-bench")  # what the bench's llama.cpp modes need
TOOLS = ("llama-quantize",)  # built beside them: scripts/make_shaped_gguf.py turns its files into any block type
# the instruction sets a tag names, best first (a GGML_NATIVE build needs every flag it was compiled for)
TAG_ISAS = (("avx512bf16", {"avx512f", "avx512_bf16"}), ("avx2", {"avx2", "fma", "f16c"}))
INSTALL_HINT = "run: make setup-bench-llama (builds llama.cpp's llama-server and llama-bench for this CPU once)"


def cpu_tag() -> str:
    """The machine, its best instruction set the bench knows, and a short hash of all its CPU flags: a GGML_NATIVE
    build runs only where the flags it was compiled for are present."""
    from localspec.runtime.library import cpu_flags

    flags = cpu_flags()
    isa = next((name for name, needed in TAG_ISAS if needed <= flags), "generic")
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:8]
    return f"{platform.machine().lower()}-{isa}-{digest}"


def bin_dir() -> Path:
    from localspec.models.paths import home

    return home() / "llama.cpp" / f"{LLAMA_CPP_PYTHON}-{cpu_tag()}" / "bin"


def missing() -> str | None:
    """None when every binary the bench runs is built for this CPU, else what is missing and how to build it."""
    folder = bin_dir()
    absent = [name for name in BINARIES if not (folder / name).is_file()]
    if absent:
        names = " and ".join(absent)
        return f"llama.cpp {LLAMA_CPP_PYTHON}'s {names} not built for this CPU in {folder}; {INSTALL_HINT}"
    return None


def binary(name: str) -> Path:
    """The path of one of BINARIES, or a ConfigError with the install hint."""
    path = bin_dir() / name
    if not path.is_file():
        raise ConfigError(f"llama.cpp's {name} is not built for this CPU ({path} is missing); {INSTALL_HINT}")
    return path
