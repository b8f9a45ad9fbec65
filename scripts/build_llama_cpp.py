"""Build a C++ peer's binaries for this CPU, once, where `localspec bench` finds them (localspec/bench/llama_bin.py:
`<data folder>/<peer>/<version>-<cpu tag>/bin`): llama.cpp's llama-server, llama-bench and llama-quantize
(`make setup-bench-llama`), or ik_llama.cpp's llama-server and llama-bench (`--peer ik_llama.cpp`,
`make setup-bench-ik`).

    python scripts/build_llama_cpp.py [--peer ik_llama.cpp] [--jobs 2] [--cflags '-mno-amx-int8 ...'] [--work DIR]

The source is the vendor tree of the peer's pinned sdist (pip download, no binary): the engine that release's users
run. GGML_NATIVE for this CPU, static binaries (the folder holds everything they need), no web UI, no network code.
Every step is skipped when its output is there already, so a second run only re-links what changed; 15-30 minutes on
2 cores the first time. Needs cmake and a C++ compiler.
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

from localspec.bench.llama_bin import PEERS, Peer, bin_dir, cpu_tag  # noqa: E402
from localspec.models.paths import cache_dir  # noqa: E402

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
)  # and each peer's own (llama_bin.Peer.cmake_options)


def run(command: list[str], **kwargs) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def source(peer: Peer, work: Path) -> Path:
    """The peer's vendor tree of its pinned sdist, downloaded and unpacked into `work` unless it is there."""
    tree = work / peer.sdist / peer.vendor
    if (tree / "CMakeLists.txt").is_file():
        return tree
    archive = work / f"{peer.sdist}.tar.gz"
    if not archive.is_file():
        spec = f"{peer.package}=={peer.version}"
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec, "-d", str(work)])
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    return tree


def fill_build_info(peer: Peer, tree: Path) -> None:
    """A tree whose sdist left out the script that writes common/build-info.cpp from git (ik-llama-cpp-python's): write
    one that fills the template with the package's name and version instead, for the build's rule to run."""
    template, script = tree / "common" / "build-info.cpp.in", tree / "common" / "cmake" / "build-info-gen-cpp.cmake"
    if script.is_file() or not template.is_file():
        return
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        "set(BUILD_NUMBER 0)\n"
        f'set(BUILD_COMMIT "{peer.package}-{peer.version}")\n'
        'set(BUILD_COMPILER "${CMAKE_C_COMPILER_ID} ${CMAKE_C_COMPILER_VERSION}")\n'
        f'set(BUILD_TARGET "{cpu_tag()}")\n'
        'set(HERE "${CMAKE_CURRENT_LIST_DIR}/..")\n'
        'configure_file("${HERE}/build-info.cpp.in" "${HERE}/build-info.cpp")\n'
    )


def build(peer: Peer, tree: Path, build_dir: Path, cflags: str, jobs: int) -> None:
    fill_build_info(peer, tree)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    flags = [f"-DCMAKE_C_FLAGS={cflags}", f"-DCMAKE_CXX_FLAGS={cflags}"]
    options = [*CMAKE_OPTIONS, *peer.cmake_options]
    run(["cmake", "-S", str(tree), "-B", str(build_dir), *generator, *options, *flags])
    run(["cmake", "--build", str(build_dir), "--parallel", str(jobs), "--target", *peer.binaries, *peer.tools])


def install(peer: Peer, build_dir: Path, cflags: str) -> Path:
    """Copy the binaries into the folder the bench reads, whole or not at all."""
    target = bin_dir(peer)
    staging = target.with_name(f"bin.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in (*peer.binaries, *peer.tools):
        shutil.copy2(build_dir / "bin" / name, staging / name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    record = {
        "peer": peer.name,
        peer.package.replace("-", "_"): peer.version,
        "cpu_tag": cpu_tag(),
        "cmake_options": [*CMAKE_OPTIONS, *peer.cmake_options, f"CFLAGS={cflags}"],
        "built": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (target.parent / "build.json").write_text(json.dumps(record, indent=1))
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", choices=sorted(PEERS), default="llama.cpp", help="which engine (%(default)s)")
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
    peer = PEERS[args.peer]
    work = args.work or cache_dir() / f"{peer.folder}-build" / f"{peer.version}-{cpu_tag()}"
    work.mkdir(parents=True, exist_ok=True)
    build_dir = args.build_dir or work / "build"
    build(peer, source(peer, work), build_dir, args.cflags, args.jobs)
    names = ", ".join((*peer.binaries, *peer.tools))
    print(f"build_llama_cpp: {peer.name} {peer.version}'s {names} in {install(peer, build_dir, args.cflags)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
