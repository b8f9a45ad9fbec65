"""The kernels' library (kernels/*.c): one shared object, built once for this CPU, verified, self-checked, loaded
once, and handed out as one handle whose members are its kernels:

  q4          the q4 matmul (q4_kernel.Q4Matmul): GGUF Q4_1 and Q4_0 linears, row-invariant
  q8          the q8 matmul (q4_kernel.Q8Matmul): Q8_0 and Q5_0 linears, a Q8_0 LM head, row-invariant
  q4f         the q4 matmul with float32 scales (q4_kernel.Q4FMatmul): Q4_K linears, row-invariant
  q8k         int8 codes with float32 scales and offsets per 16 (q4_kernel.Q8KMatmul): Q6_K, Q5_K and Q5_1
              linears, a Q6_K LM head, row-invariant
  attention   decode / verify attention (attention_kernel.AttentionKernel), or None with the reason
  layer       a whole llama layer in one call (layer_kernel.LayerKernel), or None with the reason

Its limits (group size, lanes, head sizes, instruction set) are the C sources' own (kernels/limits.h), read from the
built library. It needs x86-64 Linux and a C compiler; the source compiles for AVX-512 BF16 or AVX2 with FMA and F16C
and refuses any other target with the reason. It is compiled at first use (`-march=native`, the sources in parallel;
`prebuild` starts that in the background as a command starts) into the data folder's cache and loaded with ctypes;
its OpenMP is torch's own libgomp (same soname, loaded first).

What is loaded is verified: the library is built under a temporary name in an owner-only folder, its sha256 is
written beside it atomically (a `.sha256` sidecar), and a library whose bytes do not match its sidecar (planted,
truncated, left by another build) is removed and built again, never loaded; the hashed file descriptor is what
dlopen opens (no window to swap the file between the check and the load). Anything missing, a failed build or a failed
self-check makes `load_library` return no library and the reason, and the layers stay on torch's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

SOURCE_DIR = Path(__file__).with_name("kernels")  # the C sources
SOURCES = tuple(SOURCE_DIR / name for name in ("limits.c", "q4_matmul.c", "q8_matmul.c", "attention.c", "layer.c"))
HEADERS = tuple(SOURCE_DIR / name for name in ("limits.h", "amx.h", "scalar.h", "attention_body.h"))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
# calls of at least this many rows take the q4 matmuls' AMX tiles, where the CPU has them (the same bits either way;
# the crossing measured by `localspec bench kernels --kernels q4`: docs/kernels.md)
AMX_ROWS = 12
DIGEST = ".sha256"  # the sidecar beside a built library: the sha256 of its bytes, hex


@dataclass(frozen=True)
class Limits:
    """kernels/limits.h, as the built library exports it."""

    isa: str  # the build of the sources that runs: avx512bf16 | avx2
    group: int  # weights per scale along K (a GGUF block)
    k_group: int  # the q8k matmul's (a Q6_K sub-block); 0: a build without it
    lanes: int  # outputs per packed block; head sizes are multiples of it
    max_dim: int  # the attention kernel's largest head size
    max_group: int  # and most query heads per key-value head

    @classmethod
    def of(cls, library: ctypes.CDLL) -> Limits:
        library.localspec_isa.restype = ctypes.c_char_p
        read = lambda name: ctypes.c_int.in_dll(library, f"localspec_{name}").value  # noqa: E731
        try:
            k_group = read("k_group")
        except ValueError:  # a build of sources before the q8k kernel (`localspec bench kernels --against` one)
            k_group = 0
        return cls(
            library.localspec_isa().decode(), read("group"), k_group, *map(read, ("lanes", "max_dim", "max_group"))
        )


@dataclass(frozen=True)
class KernelLibrary:
    """The loaded library: its kernels as members, each self-checked (None: the reason is in `notes`)."""

    limits: Limits
    q4: object  # q4_kernel.Q4Matmul
    q8: object  # q4_kernel.Q8Matmul
    q4f: object  # q4_kernel.Q4FMatmul
    q8k: object  # q4_kernel.Q8KMatmul
    q4k: object  # q4_kernel.Q4KMatmul
    q6k: object  # q4_kernel.Q6KMatmul
    attention: object | None  # attention_kernel.AttentionKernel
    layer: object | None  # layer_kernel.LayerKernel
    notes: tuple[str, ...]  # why a member is None
    amx_rows: int = 0  # the q4 matmuls' calls of at least this many rows run on the AMX tiles (0: none)

    @property
    def isa(self) -> str:
        return self.limits.isa


@dataclass(frozen=True)
class LibraryLoad:
    """What load_library gives: the library, or None and why it cannot run here; reason says how it was built."""

    library: KernelLibrary | None
    reason: str


def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):  # the toolchain's own variable, not a switch of ours
        if name and shutil.which(name):
            return name
    return None


def _missing() -> str | None:
    """Why the library cannot be built on this machine, or None (the instruction sets are the sources' to say)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"x86-64 Linux only (this is {sys.platform} {platform.machine()})"
    if compiler() is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    return None


def _compiler_error(stderr: str) -> RuntimeError:
    lines = stderr.strip().splitlines()
    said = next((line.partition("#error")[2].strip(' "') for line in lines if "#error" in line), None)
    return RuntimeError(said or (lines[-1] if lines else "compiler failed"))


def compile_library(sources, target: Path, march: str = "native") -> Path:
    """Compile kernel sources into the shared library `target` with FLAGS, for `march` (the machine's own target by
    default; another one, e.g. "haswell", builds the AVX2 code on a machine that would run the AVX-512 one): each
    source to an object beside `target`, as many at once as there are cores, then one link. RuntimeError with the
    compiler's message (its #error line where there is one) when it fails."""
    flags = [f"-march={march}" if flag == "-march=native" else flag for flag in FLAGS]
    objects = [target.with_name(f"{target.stem}-{index}-{path.stem}.o") for index, path in enumerate(sources)]
    jobs = max(1, os.cpu_count() or 1)
    pending = [([compiler(), *flags, "-c", str(path), "-o", str(obj)]) for path, obj in zip(sources, objects)]
    running: list[subprocess.Popen] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                running.append(subprocess.Popen(pending.pop(0), stderr=subprocess.PIPE, text=True))
            process = running.pop(0)
            _, stderr = process.communicate(timeout=120)
            if process.returncode:
                raise _compiler_error(stderr)
        command = [compiler(), *flags, *map(str, objects), "-o", str(target), "-lm"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode:
            raise _compiler_error(result.stderr)
    finally:
        for process in running:
            process.kill()
            process.wait()
        for obj in objects:
            obj.unlink(missing_ok=True)
    return target


def target_path(build_dir: Path, march: str = "native", sources=None) -> Path:
    """Where the library for these sources, flags and CPU is kept in build_dir."""
    paths = tuple(SOURCES if sources is None else sources) + HEADERS
    source = b"".join(path.read_bytes() for path in paths)
    cpu = (platform.processor() or "") + ",".join(sorted(cpu_flags()))
    tag = hashlib.sha256(source + " ".join(FLAGS).encode() + march.encode() + cpu.encode())
    return build_dir / f"localspec_kernels-{tag.hexdigest()[:16]}.so"


def _private(build_dir: Path) -> None:
    """build_dir, created owner-only; an existing one of ours loses group and other write access."""
    build_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = build_dir.stat()
    if info.st_uid == os.getuid() and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        build_dir.chmod(stat.S_IMODE(info.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))


def _write_atomically(path: Path, data: bytes) -> None:
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _build(target: Path, march: str, sources) -> None:
    """Compile to a temporary name in the build folder, record its sha256, then move it into place."""
    partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-")) / target.name
    try:
        compile_library(sources, partial, march)
        digest = hashlib.sha256(partial.read_bytes()).hexdigest()
        _write_atomically(target.with_name(target.name + DIGEST), digest.encode())
        os.replace(partial, target)
    finally:
        shutil.rmtree(partial.parent, ignore_errors=True)


def _open_verified(target: Path) -> ctypes.CDLL | None:
    """The library at `target` when its bytes match its sidecar's sha256, else None. dlopen reads the very file
    descriptor that was hashed (/proc/self/fd), so the file cannot be swapped between the check and the load."""
    try:
        recorded = target.with_name(target.name + DIGEST).read_text().strip()
        handle = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(os.dup(handle), "rb") as data:
            digest = hashlib.file_digest(data, "sha256").hexdigest()
        if digest != recorded or not stat.S_ISREG(os.fstat(handle).st_mode):
            return None
        return ctypes.CDLL(f"/proc/self/fd/{handle}")
    finally:
        os.close(handle)


_BUILDING = threading.Lock()  # one build at a time in this process: prebuild's thread, or the load that waits on it


def _opened(build_dir: Path, march: str, sources) -> ctypes.CDLL:
    """The verified library for these sources, built first where there is none or the one there fails its check."""
    with _BUILDING:
        _private(build_dir)
        target = target_path(build_dir, march, sources)
        library = _open_verified(target)
        if library is None:
            target.unlink(missing_ok=True)  # planted or stale: never loaded
            _build(target, march, sources)
            library = _open_verified(target)
            if library is None:
                raise RuntimeError(f"the library built at {target} does not match its recorded sha256")
    return library


def kernels_folder() -> Path:
    """Where this machine's library is built and kept: the data folder's cache."""
    from localspec.config import cache_dir

    return cache_dir() / "kernels"


def prebuild_here() -> threading.Thread | None:
    """prebuild into kernels_folder() unless the environment turns the kernels off (LOCALSPEC_Q4_KERNEL=off)."""
    from localspec.config import Environment

    return prebuild(kernels_folder()) if Environment.read().q4_kernel else None


def prebuild(build_dir: Path) -> threading.Thread | None:
    """Start building this machine's library in a background thread where it is not built yet, so that a first start
    compiles it while Python imports and the model file is read (load_library waits for it, then verifies and loads
    it). Built, never loaded here: loaded before torch, it would bring the system's libgomp in place of torch's own.
    None where there is nothing to build or it cannot be built here; a failure is left for load_library to report."""
    target = target_path(build_dir)
    if _missing() is not None or target.is_file():
        return None

    def build() -> None:
        try:
            with _BUILDING:
                _private(build_dir)
                if not target.is_file():
                    _build(target, "native", SOURCES)
        except (OSError, RuntimeError, subprocess.SubprocessError):
            pass  # load_library builds again and says why

    thread = threading.Thread(target=build, name="localspec-kernels-build", daemon=True)
    thread.start()
    return thread


def use_amx(handle: ctypes.CDLL, wanted: bool) -> int:
    """Turn the q4 matmuls' AMX tiles on for calls of at least AMX_ROWS rows where wanted and this build and CPU can
    (an avx512bf16 build for a CPU with AMX-INT8, Linux granting the tile state), else off; returns that row count,
    0 for off. It holds for the whole process: the library is loaded once."""
    set_rows = getattr(handle, "localspec_amx_rows", None)  # absent from a build of older sources
    if set_rows is None:
        return 0
    set_rows.argtypes, set_rows.restype = [ctypes.c_int], ctypes.c_int
    return AMX_ROWS if set_rows(AMX_ROWS if wanted else 0) and wanted else 0


@functools.cache
def load_library(
    build_dir: Path, enabled: bool = True, layer: bool = True, march: str = "native", amx: bool = True
) -> LibraryLoad:
    """The kernels' library, built into build_dir at first use, verified and self-checked, or why it cannot run
    here. enabled / layer / amx: the LOCALSPEC_Q4_KERNEL / LOCALSPEC_LAYER_KERNEL / LOCALSPEC_AMX switches
    (config.Environment), passed in so that a cached load is keyed by them."""
    from .attention_kernel import AttentionKernel
    from .attention_kernel import self_check as attention_self_check
    from .layer_kernel import LayerKernel
    from .layer_kernel import self_check as layer_self_check
    from .q4_kernel import (
        GROUP,
        K_GROUP,
        LANES,
        Q4FMatmul,
        Q4KMatmul,
        Q4Matmul,
        Q6KMatmul,
        Q8KMatmul,
        Q8Matmul,
        q4k_self_check,
        q6k_self_check,
        q8_self_check,
        q8k_self_check,
        self_check,
    )

    if not enabled:
        return LibraryLoad(None, "turned off (LOCALSPEC_Q4_KERNEL=off)")
    missing = _missing()
    if missing is not None:
        return LibraryLoad(None, missing)
    try:
        handle = _opened(build_dir, march, SOURCES)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return LibraryLoad(None, f"could not build it: {exc}")
    limits = Limits.of(handle)
    if (limits.group, limits.k_group, limits.lanes) != (GROUP, K_GROUP, LANES):
        layout = (limits.group, limits.k_group, limits.lanes)
        return LibraryLoad(None, f"its layout {layout} is not the one q4_kernel.py packs")
    amx_rows = use_amx(handle, amx)  # before the self-checks: they compare its rows with the rows alone
    q4, q8, q4f, q8k, q4k = Q4Matmul(handle), Q8Matmul(handle), Q4FMatmul(handle), Q8KMatmul(handle), Q4KMatmul(handle)
    problem = self_check(q4) or q8_self_check(q8) or self_check(q4f, wide=True) or q8k_self_check(q8k)
    q6k = Q6KMatmul(handle)
    problem = problem or q4k_self_check(q4k) or q6k_self_check(q6k)
    if problem is not None:
        return LibraryLoad(None, f"self-check failed: {problem}")
    attention, notes = AttentionKernel(handle, limits), []
    attention_problem = attention_self_check(attention)
    if attention_problem is not None:
        attention, notes = None, [f"no attention kernel (self-check failed: {attention_problem})"]
    layer_kernel = None
    if not layer:
        notes.append("no layer kernel (turned off: LOCALSPEC_LAYER_KERNEL=off)")
    elif attention is None:
        notes.append("no layer kernel (no attention kernel)")
    else:
        layer_kernel = LayerKernel(handle)
        layer_problem = layer_self_check(layer_kernel, q4, attention)
        if layer_problem is not None:
            layer_kernel = None
            notes.append(f"no layer kernel (self-check failed: {layer_problem})")
    library = KernelLibrary(limits, q4, q8, q4f, q8k, q4k, q6k, attention, layer_kernel, tuple(notes), amx_rows)
    note = "".join(f"; {n}" for n in notes)
    tiles = f" (q4 calls of ≥ {amx_rows} rows on AMX)" if amx_rows else ""
    return LibraryLoad(library, f"{limits.isa}{tiles}, built for this CPU with {compiler()}{note}")
