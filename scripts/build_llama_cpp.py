"""Build llama.cpp's llama-server, llama-bench and llama-quantize for this CPU, once, where `localspec bench` finds them
(localspec/bench/llama_bin.py: `<data folder>/llama.cpp/<version>-<cpu tag>/bin`). `make setup-bench-llama` runs it.

    python scripts/build_llama_cpp.py [--jobs 2] [--cflags '-mno-amx-int8 ...'] [--work DIR] [--build-dir DIR]

The source is the vendor/llama.cpp of the pinned llama-cpp-python sdist (pip download, no binary): the llama.cpp
that release's users run. GGML_NATIVE for this CPU, static binaries (the folder holds everything they need), no
web UI, no network code. Every step is skipped when its output is there already, so a second run only re-links what
changed; 15-30 minutes on 2 cores the first time. Needs cmake and a C++ compiler.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localspec.bench.llama_bin import BINARIES, LLAMA_CPP_PYTHON, TOOLS, bin_dir, cpu_tag  # noqa: E402
from localspec.models.paths import cache_dir  # noqa: E402

SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",  # the server's web UI: npm, or a download at build time
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",  # no HTTPS: the bench talks to its server on loopback (this version has no curl option)
)


def run(command: list[str], **kwargs) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def source(work: Path) -> Path:
    """vendor/llama.cpp of the pinned sdist, downloaded and unpacked into `work` unless it is there."""
    tree = work / SDIST / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    archive = work / f"{SDIST}.tar.gz"
    if not archive.is_file():
        spec = f"llama-cpp-python=={LLAMA_CPP_PYTHON}"
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec, "-d", str(work)])
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    return tree


def build(tree: Path, build_dir: Path, cflags: str, jobs: int) -> None:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    flags = [f"-DCMAKE_C_FLAGS={cflags}", f"-DCMAKE_CXX_FLAGS={cflags}"]
    run(["cmake", "-S", str(tree), "-B", str(build_dir), *generator, *CMAKE_OPTIONS, *flags])
    run(["cmake", "--build", str(build_dir), "--parallel", str(jobs), "--target", *BINARIES, *TOOLS])


def install(build_dir: Path, cflags: str) -> Path:
    """Copy the binaries into the folder the bench reads, whole or not at all."""
    target = bin_dir()
    staging = target.with_name(f"bin.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in (*BINARIES, *TOOLS):
        shutil.copy2(build_dir / "bin" / name, staging / name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    record = {
        "llama_cpp_python": LLAMA_CPP_PYTHON,
        "cpu_tag": cpu_tag(),
        "cmake_options": [*CMAKE_OPTIONS, f"CFLAGS={cflags}"],
        "built": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (target.parent / "build.json").write_text(json.dumps(record, indent=1))
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compile jobs")
    parser.add_argument("--cflags", default="", help="extra C and C++ flags (the Makefile turns AMX off)")
    parser.add_argument("--work", type=Path, default=None, help="where the sdist is unpacked (default: the cache)")
    parser.add_argument("--build-dir", type=Path, default=None, help="cmake's build folder (default: WORK/build)")
    args = parser.parse_args()
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        print(
            f"build_llama_cpp: {' and '.join(missing)} not found; install them (apt-get install cmake g++, or "
            "pip install cmake)",
            file=sys.stderr,
        )
        return 2
    work = args.work or cache_dir() / "llama.cpp-build" / f"{LLAMA_CPP_PYTHON}-{cpu_tag()}"
    work.mkdir(parents=True, exist_ok=True)
    build_dir = args.build_dir or work / "build"
    build(source(work), build_dir, args.cflags, args.jobs)
    names = ", ".join((*BINARIES, *TOOLS))
    print(f"build_llama_cpp: llama.cpp {LLAMA_CPP_PYTHON}'s {names} in {install(build_dir, args.cflags)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
