"""`dtype: auto` / `quant: auto`: run the target in the weight format fastest for speculative decoding here, measured.

A format is a compute dtype of the unquantized weights (float32, bfloat16, float16) or, for `quant: auto` on a GGUF
source, gguf-int4: the file's Q4_1 blocks as int4 linears computing in bfloat16 (gguf_linear.py).

At the first load of a model on a machine, the target is loaded in each candidate format and timed: the median
of a 1-token and a (K+1)-token forward on a 64-token KV cache (the plain step and the verify step), all interleaved. The
pick is the dtype with the best predicted speculative throughput under the adaptive controller's cost model
(runtime/speedup.py): speedup(k) = E(k) / (k·c + v(k)) over plain decoding in that dtype, so tokens per second
= max_k speedup(k) / t(1 token). With no acceptance known at load time, every draft position is accepted with
PRIOR_ACCEPTANCE, and the proposer's cost c is taken as 0 (an n-gram lookup; a draft's cost scales with the dtype
much as the target's does). v(k) is the straight line between the two measured sizes.

The decision is cached in the data folder (cache_dir()/dtype-decisions.json), keyed by the CPU model or GPU name,
the torch thread count, the torch version and the model (source and weight bytes), so later loads do not time
anything. An unreadable cache file is measured again and rewritten. An explicit dtype in the entry always wins.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from localspec.runtime.speedup import PRIOR_ACCEPTANCE, predicted_speedups

from .decision_cache import read_decisions, write_decision

CONTEXT_TOKENS = 64  # KV cache length the forwards are timed on
REPEATS = 7  # timed forwards per model and size (the median is kept)
WARMUP_ROUNDS = 2  # untimed rounds first (kernel selection, allocator)
CACHE_FILE = "dtype-decisions.json"
CACHE_VERSION = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GGUF_INT4 = "gguf-int4"  # the format label of quant gguf (its compute dtype: bfloat16)
GGUF_COMPUTE = "bfloat16"

How = Literal["entry", "measured", "cached", "fixed"]
# times models' forwards: ({name: model}, sizes) → {name: {tokens: median seconds}} (names left out: non-finite
# logits); injectable so tests need no real timing
Timer = Callable[[dict[str, torch.nn.Module], tuple[int, ...]], dict[str, dict[int, float]]]
Loader = Callable[[str], torch.nn.Module]


def format_fields(label: str) -> dict[str, str]:
    """A format label → the ModelSpec fields that load it: {"quant": ..., "dtype": ...}."""
    if label == GGUF_INT4:
        return {"quant": "gguf", "dtype": GGUF_COMPUTE}
    return {"quant": "none", "dtype": label}


@dataclass(frozen=True)
class Timing:
    dtype: str  # the format label: a dtype name, or gguf-int4
    plain_s: float  # 1-token forward
    verify_s: float  # (K+1)-token forward
    tokens_per_s: float  # predicted speculative throughput


@dataclass(frozen=True)
class DtypeDecision:
    """Which dtype the target runs in, and why. how: entry (set in models.yaml), measured (timed at this load),
    cached (timed at an earlier load on this machine), fixed (auto, but nothing to measure: one candidate, or
    quantized weights)."""

    dtype: str
    how: How
    k: int = 0
    timings: tuple[Timing, ...] = ()
    measured_on: str = ""  # YYYY-MM-DD
    note: str = ""
    quant: str = "none"  # gguf when the GGUF's int4 blocks won (quant: auto)

    @property
    def label(self) -> str:
        """The format label: the dtype, or gguf-int4."""
        return GGUF_INT4 if self.quant == "gguf" else self.dtype

    def describe(self) -> str:
        """e.g. 'bfloat16 (auto: 1-token 22 ms vs 37 ms float32, 5-token 25 ms vs 60 ms, measured 2026-12-01)'."""
        if self.how == "entry":
            return f"{self.label} (set in models.yaml)"
        if self.how == "fixed" or not self.timings:
            return f"{self.label} (auto: {self.note or 'not measured'})"
        own = next(t for t in self.timings if t.dtype == self.label)
        others = [t for t in self.timings if t.dtype != self.label]
        plain = " vs ".join([f"{own.plain_s * 1e3:.0f} ms"] + [f"{t.plain_s * 1e3:.0f} ms {t.dtype}" for t in others])
        verify = " vs ".join([f"{own.verify_s * 1e3:.0f} ms"] + [f"{t.verify_s * 1e3:.0f} ms" for t in others])
        return f"{self.label} (auto: 1-token {plain}, {self.k + 1}-token {verify}, measured {self.measured_on})"

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype,
            "quant": self.quant,
            "how": self.how,
            "k": self.k,
            "measured_on": self.measured_on,
            "note": self.note,
            "timings": [t.__dict__ for t in self.timings],
            "text": self.describe(),
        }

    @classmethod
    def from_dict(cls, data: dict, how: How) -> DtypeDecision:
        timings = tuple(
            Timing(str(t["dtype"]), float(t["plain_s"]), float(t["verify_s"]), float(t["tokens_per_s"]))
            for t in data["timings"]
        )
        quant = str(data.get("quant", "none"))
        label = GGUF_INT4 if quant == "gguf" else data["dtype"]
        if data["dtype"] not in DTYPES or quant not in ("none", "gguf") or not any(t.dtype == label for t in timings):
            raise ValueError(f"cached format {label!r} is not one that was measured")
        return cls(str(data["dtype"]), how, int(data["k"]), timings, str(data["measured_on"]), str(data["note"]), quant)


# -- what the machine is and runs -------------------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda:" + torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return "cpu:" + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu:" + (platform.processor() or platform.machine())


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def candidates(device: torch.device) -> list[str]:
    """The dtypes worth timing here: float32 and bfloat16 on a CPU (float16 too where the CPU has float16 matmul
    instructions), bfloat16 (where supported) and float16 on CUDA."""
    if device.type == "cuda":
        return (["bfloat16"] if torch.cuda.is_bf16_supported() else []) + ["float16"]
    found = ["float32", "bfloat16"]
    if _cpu_flags() & {"avx512_fp16", "amx_fp16"}:
        found.append("float16")
    return found


def cache_key(device: torch.device, source: str, folder: str, quant: str = "none") -> str:
    weights = 0
    path = Path(folder)
    if path.is_dir():
        weights = sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".bin", ".pt"))
    if not weights and source.endswith(".gguf"):  # the file itself (quant gguf): the weights are the file's
        from .loading import gguf_path

        file = gguf_path(source)
        weights = file.stat().st_size if file is not None else 0
    threads = f"threads {torch.get_num_threads()}" if device.type == "cpu" else ""
    formats = "quant auto" if quant == "auto" else ""  # another candidate set: another decision
    kernel = ""
    if source.endswith(".gguf") and device.type == "cpu":  # its int4 layers run on whichever kernel loads here
        from .gguf_linear import library_here_now

        kernel = "int4 kernel " + ("q4" if library_here_now().library is not None else "torch")
    parts = (device_name(device), threads, f"torch {torch.__version__}", source, f"{weights} bytes", formats, kernel)
    return " | ".join(x for x in parts if x)


# -- timing -------------------------------------------------------------------------------------------------------
@torch.inference_mode()
def time_forwards(
    models: dict[str, torch.nn.Module],
    sizes: tuple[int, ...],
    setups: dict | None = None,
    context: int = CONTEXT_TOKENS,
) -> dict[str, dict[int, float]]:
    """Median seconds of a T-token forward (logits for every row, as a verify step) on a `context`-long cache,
    per model and T, interleaved round by round over models and sizes (a busy minute hits them all alike). A model
    whose logits are not finite is left out of the result. setups: {name: ForwardSetup} for the runners (the fast
    one by default; one model may be timed under two names and setups)."""
    from localspec.runtime.model_runner import FAST, ModelRunner

    setups = setups or {}
    runners = {name: ModelRunner(model, setup=setups.get(name, FAST)) for name, model in models.items()}
    vocab = min(runner.vocab_size for runner in runners.values())
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (context + max(sizes),), generator=generator).tolist()
    for runner in runners.values():
        runner.reset()
        runner.extend(ids[:context], logits_to_keep=0)
    samples = {name: {size: [] for size in sizes} for name in runners}
    for round_ in range(-WARMUP_ROUNDS, REPEATS):
        for size in sizes:
            for name, runner in list(runners.items()):
                started = time.perf_counter()
                logits = runner.extend(ids[context : context + size]).logits
                finite = bool(torch.isfinite(logits).all())
                elapsed = time.perf_counter() - started
                runner.crop(context)
                if not finite:
                    del runners[name], samples[name]
                elif round_ >= 0:
                    samples[name][size].append(elapsed)
    return {name: {size: statistics.median(v) for size, v in by_size.items()} for name, by_size in samples.items()}


def predicted_throughput(plain_s: float, verify_s: float, k: int, acceptance: float = PRIOR_ACCEPTANCE) -> float:
    """Tokens per second of the best k ≤ K under the cost model, from a 1-token and a (K+1)-token forward time."""
    ratio = max(verify_s / plain_s, 1.0)
    verify = [1.0 + (ratio - 1.0) * i / k for i in range(k + 1)] if k else [1.0]
    return max(predicted_speedups([acceptance] * k, 0.0, verify)) / plain_s


# -- the cache ----------------------------------------------------------------------------------------------------
def _read_cache() -> dict:
    return read_decisions(CACHE_FILE, CACHE_VERSION)


def _write_cache(key: str, decision: DtypeDecision) -> None:
    write_decision(CACHE_FILE, CACHE_VERSION, key, decision.to_dict())


def cached_decision(key: str) -> DtypeDecision | None:
    raw = _read_cache().get(key)
    if raw is None:
        return None
    try:
        return DtypeDecision.from_dict(raw, "cached")
    except (KeyError, TypeError, ValueError):
        return None


# -- the decision -------------------------------------------------------------------------------------------------
def decide(
    key: str,
    device: torch.device,
    k: int,
    load: Loader,
    timer: Timer | None = None,
    progress: Callable[[str], None] | None = None,
    names: list[str] | None = None,
) -> tuple[DtypeDecision, torch.nn.Module | None]:
    """The cached decision for `key` (and no model), or: load every candidate format (default: the dtypes the
    device runs), time them interleaved, cache the pick, and return it with the loaded winner. All candidates are
    held during the timing (once per machine and model); the losers are released before this returns."""
    found = cached_decision(key)
    if found is not None:
        return found, None
    names = names or candidates(device)
    if len(names) == 1:
        fields = format_fields(names[0])
        note = f"the only format {device.type} runs"
        return DtypeDecision(fields["dtype"], "fixed", k, note=note, quant=fields["quant"]), None
    timer = timer or time_forwards
    models = {}
    for name in names:
        if progress is not None:
            progress(f"First start on this machine: loading the target in {name} to time it (once)…")
        models[name] = load(name)
    if progress is not None:
        progress(f"Timing {', '.join(names)} (1-token and {k + 1}-token forwards, interleaved)…")
    measured = timer(models, (1, k + 1))
    timings = [
        Timing(
            name,
            measured[name][1],
            measured[name][k + 1],
            predicted_throughput(measured[name][1], measured[name][k + 1], k),
        )
        for name in names
        if name in measured
    ]
    if not timings:
        return DtypeDecision("float32", "fixed", k, note="every format measured gave non-finite logits"), None
    best = max(timings, key=lambda t: t.tokens_per_s)
    winner = models.pop(best.dtype)
    models.clear()  # the others are released
    fields = format_fields(best.dtype)
    decision = DtypeDecision(
        fields["dtype"], "measured", k, tuple(timings), time.strftime("%Y-%m-%d"), quant=fields["quant"]
    )
    _write_cache(key, decision)
    return decision, winner


def choose_dtype(
    spec,
    folder: str,
    k: int,
    device: torch.device,
    load: Loader,
    progress: Callable[[str], None] | None = None,
    timer: Timer | None = None,
) -> tuple[DtypeDecision, torch.nn.Module | None]:
    """The hook loading.load_pair calls for a target with dtype auto or quant auto: (decision, the loaded winner or
    None). quant auto adds gguf-int4 to the dtypes (all those the device runs for dtype auto, else the entry's)."""
    names = None
    if spec.quant == "auto":
        names = (candidates(device) if spec.dtype == "auto" else [spec.dtype]) + [GGUF_INT4]
    return decide(cache_key(device, spec.source, folder, spec.quant), device, k, load, timer, progress, names)


def fixed_decision(spec, model: torch.nn.Module, why: str = "") -> DtypeDecision:
    """The decision record of a target whose dtype was not measured: set in the entry, or auto for quantized
    weights (which compute in the dtype loading.py gives them); why: where quant auto chose gguf without timing."""
    quant = "gguf" if spec.quant == "gguf" else "none"
    if spec.dtype != "auto" and spec.quant != "gguf":
        return DtypeDecision(spec.dtype, "entry")
    if spec.quant == "gguf":
        how, note = ("fixed", why) if why else ("entry", "gguf blocks compute in bfloat16")
        return DtypeDecision(GGUF_COMPUTE, how, note=note, quant=quant)
    return DtypeDecision(str(model.dtype).replace("torch.", ""), "fixed", note=f"{spec.quant} weights are not measured")
