"""The forward plan: every choice of how a model's forwards are computed, made once, in this module, with its reason.

`plan_forward` reads the machine (the kernels' library and its self-checks, runtime/library.py), the model (its
architecture, each decoder linear's block type and kernel as the loader built it from KERNELS, its LM head), the
setting (exact or fast forwards) and the environment (config.Environment), and returns a frozen ForwardPlan:

  linears            per tensor class, the kernel (by GGUF block type, from KERNELS: one row per block type, the way
                     ggml keeps one type_traits table; a new type is a new row, not a new branch)
  lm_head            the q8 / q6k kernel on the file's Q8_0 / Q6_K blocks, oneDNN's prepacked dense head, or the
                     plain one
  decode / verify    the attention of 1..DECODE_MAX_ROWS-row forwards: the attention kernel (each row as plain
                     decoding computes it), eager with the explicit mask, or sdpa; the layer kernel where it runs
  prefill            a longer forward's attention (plain decoding and speculation run a prompt alike): the layer
                     kernel up to PREFILL_KERNEL_MAX_ROWS rows where the layers run on it, else sdpa
  dummy rows         the rows a forward is padded with so each row rounds as in any other row count
  forward, cache,    the lean llama forward or transformers', the preallocated cache or a dynamic one, and
  compile            torch.compile's mode
  setup              the guarantee's setup id (verify/guarantee.py reads its measured rows by it)
  exact cost         whether `exact: auto` has to time the exact setup against the fast one (exact_cost: not on
                     exact-kernels, whose exact forwards cost nothing extra)

ModelRunner and the lean forward execute the plan and decide nothing. `ForwardPlan.summary()` is the one-line form
the bench and the chat window print; `to_dict()` is what `localspec generate --json` prints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from localspec.config import CompileMode, Environment, ForwardKind
from localspec.measured import exact_rows

from .library import KernelLibrary, LibraryLoad, kernels_folder, load_library
from .q8_head import embedding_format

AttentionPath = Literal["sdpa", "eager"]  # transformers' attention implementations the setups use
AttentionKind = Literal["sdpa", "eager", "kernel"]  # a forward's attention (kernel: attention_kernel.py)
CacheKind = Literal["static", "dynamic"]
Setup = Literal["fast", "exact", "exact-kernels", "exact-attention"]  # the guarantee's setup ids
SETUPS: tuple[Setup, ...] = ("fast", "exact", "exact-kernels", "exact-attention")
# architectures whose decoder layer runtime/lean_llama.py and the layer kernel (kernels/layer.c) compute exactly:
# qwen2 is llama's layer with q/k/v biases (the projection modules', a block linear's in the kernel's LinearRef),
# qwen3 with an RMSNorm of each head's q and k before RoPE
LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3")


# ---- the kernels, one row per GGUF block type -------------------------------------------------------------------
@dataclass(frozen=True)
class KernelRow:
    """What runs a tensor of one GGUF block type: the library's member `kernel` for the `roles` it serves, else
    `fallback` (torch's), with why."""

    block_type: str
    kernel: str  # KernelLibrary member: q4 | q8 | q4f | q8k | q4k | q6k
    roles: tuple[str, ...]  # linear (a decoder layer's matmul) | lm_head (a tied token embedding, Q8_0 or Q6_K)
    fallback: str  # what runs the tensor without the library: torch-int4 | dense
    why: str


KERNELS: dict[str, KernelRow] = {
    row.block_type: row
    for row in (
        KernelRow("Q4_0", "q4", ("linear",), "torch-int4", "row-invariant, the q4 layout with m = -8·d (exact)"),
        KernelRow("Q4_1", "q4", ("linear",), "torch-int4", "row-invariant, the file's own d and m"),
        KernelRow("Q5_0", "q8", ("linear",), "dense", "row-invariant, codes q - 16 as int8, the file's own d"),
        KernelRow("Q8_0", "q8", ("linear", "lm_head"), "dense", "the exact weights, float32 sums, row-invariant"),
        KernelRow(
            "Q4_K", "q4k", ("linear",), "dense", "row-invariant, the q4 layout with the file's own d, dmin, sc, m"
        ),
        KernelRow(
            "Q6_K",
            "q6k",
            ("linear", "lm_head"),
            "dense",
            "row-invariant, codes q − 32 as int8, the file's own d and sc",
        ),
        KernelRow("Q5_K", "q8k", ("linear",), "dense", "row-invariant, int8 codes, float32 d·sc and −dmin·m"),
        KernelRow("Q5_1", "q8k", ("linear",), "dense", "row-invariant, int8 codes, the file's own d and m"),
    )
}
KERNEL_NAMES = frozenset(row.kernel for row in KERNELS.values())  # the library's members the table names


@dataclass(frozen=True)
class Choice:
    """One decision of the plan and why it was made."""

    value: str
    reason: str


def tensor_kernel(block_type: str, role: str, library: KernelLibrary | None, why_not: str = "") -> Choice:
    """The kernel that runs a tensor of this block type in this role (KERNELS), or its fallback and why; "dense":
    no row (the loader keeps the dequantized weight)."""
    row = KERNELS.get(block_type)
    if row is None or role not in row.roles:
        return Choice("dense", f"no kernel for {block_type} as {role.replace('_', ' ')}: the dequantized weight")
    if library is None:
        return Choice(row.fallback, f"the kernels' library is not here: {why_not or 'not offered'}")
    return Choice(row.kernel, f"{block_type}: {row.why}")


def library_here(build_dir=None, env: Environment | None = None) -> LibraryLoad:
    """This machine's kernels' library (built into the data folder's cache, or build_dir) under the environment's
    switches (load_library caches by them, so a changed switch is read at the next load)."""
    if build_dir is None:
        build_dir = kernels_folder()
    env = env or Environment.read()
    return load_library(build_dir, env.q4_kernel, env.layer_kernel, amx=env.amx)


@dataclass(frozen=True)
class LoadRecord:
    """What the loader built a model with, kept on the model (as LOAD_ATTR) for the plan: the library it offered
    (None: none), its kernel choice per tensor class, and the LM head module (Q8_0 / Q6_K) where one was built."""

    library: KernelLibrary | None
    tensors: tuple[tuple[str, Choice], ...] = ()
    head: nn.Module | None = field(default=None, compare=False)
    types: tuple[tuple[str, Choice], ...] = ()  # per GGUF block type of the decoder linears: what runs it


LOAD_ATTR = "localspec_load"


def record_load(model: nn.Module, record: LoadRecord) -> None:
    object.__setattr__(model, LOAD_ATTR, record)  # a plain attribute: not a submodule, not in the state dict


def load_record(model: nn.Module) -> LoadRecord:
    return getattr(model, LOAD_ATTR, None) or LoadRecord(None)


def offer_library(model: nn.Module, types: tuple[tuple[str, Choice], ...] = ()) -> None:
    """Offer this machine's library to a target the loader did not build from a GGUF's blocks: a CPU model's plan
    may run decode / verify attention there (where it fits); another device's is offered none. types: a GGUF
    source's block types, each with why it runs dense."""
    first = next(model.parameters(), None)  # a model without parameters is on no device the library serves
    on_cpu = first is not None and first.device.type == "cpu"
    record_load(model, LoadRecord(library_here().library if on_cpu else None, types=types))


# ---- the forward setups -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ForwardSetup:
    """How every forward of a runner is computed. The kernels a CPU (or cuBLAS) picks depend on the row count, so a
    row's logits can round differently alone than inside a (K+1)-row verify forward (scripts/measure_rounding.py,
    assets/rounding/): with eager attention, an explicit additive mask and at least 2 rows per forward (a 1-token
    forward gets one dummy row after it, whose cache row is dropped) each bfloat16 chain row of the real model was
    measured bitwise equal to the same row inside 2..17-row forwards (float32 / float16: see EXACT_ROWS).

    attention: the transformers attention implementation. explicit_mask: pass the causal additive mask built here
    instead of transformers' own (preallocated cache only). min_rows / row_multiple: the dummy rows (the last token
    repeated) after the real ones. rows_as_plain (lean forward only): each real row of a decode or verify forward
    gets its own attention in plain decoding's shapes (lean_llama.RowsAsPlain), at about 2× the verify cost, so
    exact_setup leaves it off and exact_rows_setup turns it on. attention_kernel: decode / verify attention on
    attention_kernel.py where the lean forward has it."""

    attention: AttentionPath = "sdpa"
    explicit_mask: bool = False
    min_rows: int = 1
    row_multiple: int = 1  # forwards are padded up to a multiple of this many rows
    rows_as_plain: bool = False
    attention_kernel: bool = False

    def padded(self, rows: int) -> int:
        """The row count a forward of `rows` real rows runs with (≥ min_rows, a multiple of row_multiple)."""
        whole = -(-rows // self.row_multiple) * self.row_multiple
        return max(whole, self.min_rows) if rows else 0

    @property
    def rows(self) -> str:
        """The rows of its forwards in words: '1-row decode', '≥ 8 rows, multiples of 8'."""
        rows = "1-row decode" if self.min_rows == 1 else f"≥ {self.min_rows} rows"
        return rows + (f", multiples of {self.row_multiple}" if self.row_multiple > 1 else "")

    def describe(self) -> str:
        """The setup in words, e.g. 'eager + mask, ≥ 2 rows' or 'attention kernel, 1-row decode'."""
        if self == FAST:
            return "fast"
        rows = self.rows
        if self.attention_kernel:
            return f"attention kernel, {rows}"
        plain = ", rows as plain" if self.rows_as_plain else ""
        return f"{self.attention}{' + mask' if self.explicit_mask else ''}, {rows}{plain}"


# forwards of up to this many real rows are decode / verify-sized: in the exact setup those are the rows that must
# round as plain decoding's. A longer forward is a prompt's prefill, which plain decoding and speculation run alike on
# the same prompt, so the lean forward runs its attention on sdpa in every setup (1.5x eager at 1,024 tokens) except:
DECODE_MAX_ROWS = 64
# a forward of up to this many rows on a model whose layers run on the layer kernel runs there too, so a prompt (read
# in the engine's 512-token forwards) does: 1.14-1.9x sdpa's on the embedded model and its Q4_K_M requantization
# from 65 to 4,096 prompt tokens, 0.95-1.10x on a 1.7B-shaped Q4_K_M file; one forward of 2,048 rows or more is
# sdpa's causal attention's (Zen 4, assets/bench/2026-12-08-zen4-prefill/)
PREFILL_KERNEL_MAX_ROWS = 1024
FAST = ForwardSetup()  # transformers' defaults: sdpa, its own mask, 1-row decode forwards
# (min_rows, row_multiple) per compute dtype: the fewest rows per forward, and their multiple, from which a row's result
# was measured not to depend on the row count; what was measured where is in assets/rounding/exact_rows.json
_EXACT_ROWS_BY_NAME, EXACT_ROWS_DEFAULT = exact_rows()
EXACT_ROWS = {getattr(torch, name): rows for name, rows in _EXACT_ROWS_BY_NAME.items()}


def exact_setup(dtype: torch.dtype) -> ForwardSetup:
    """The exact setup for a model computing in `dtype`: eager attention, the explicit mask, EXACT_ROWS padding."""
    min_rows, multiple = EXACT_ROWS.get(dtype, EXACT_ROWS_DEFAULT)
    return ForwardSetup(attention="eager", explicit_mask=True, min_rows=min_rows, row_multiple=multiple)


def exact_rows_setup(dtype: torch.dtype) -> ForwardSetup:
    """exact_setup with every decode / verify row's attention computed in plain decoding's shapes (rows_as_plain)."""
    return dataclasses.replace(exact_setup(dtype), rows_as_plain=True)


def _decoder_linears(model: nn.Module) -> list[nn.Module] | None:
    from .int4_linear import Int4Linear
    from .q8_head import Q8Linear

    decoder = getattr(getattr(model, "model", None), "layers", None)
    if decoder is None:
        return None
    return [m for m in decoder.modules() if isinstance(m, (nn.Linear, Int4Linear, Q8Linear))]


def row_invariant_layers(model: nn.Module) -> bool:
    """Whether every linear of the model's decoder layers computes a row the same whatever the row count: all are
    Int4Linear on the q4 kernel or Q8Linear on the q8 kernel. Then the exact setup needs no dummy row (the dummy
    row is for bfloat16 F.linear, which rounds a lone row differently)."""
    linears = _decoder_linears(model)
    return bool(linears) and all(getattr(m, "row_invariant", False) for m in linears)


def kernel_layout_layers(model: nn.Module) -> bool:
    """Whether every decoder linear is on one of the block-type kernels (q4, q4f, q4k, q8, q8k, q6k; a BiasedLinear's
    inner one): what the layer kernel reads."""
    from .layer_kernel import KINDS

    linears = _decoder_linears(model)
    return bool(linears) and all(getattr(getattr(m, "kernel", None), "KIND", None) in KINDS for m in linears)


def lean_supported(model: nn.Module) -> bool:
    """A transformers llama, qwen2 or qwen3 whose layers the lean forward computes exactly: plain RoPE, no MLP
    biases, SiLU, full attention (attention biases are the projection modules' own)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in LEAN_MODEL_TYPES:
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    return (
        rope.get("rope_type", "default") == "default"
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "hidden_act", "silu") == "silu"
        and not getattr(config, "pretraining_tp", 1) > 1
    )


def _attention_kernel_fits(model: nn.Module, library: KernelLibrary | None) -> tuple[bool, str]:
    if library is None or library.attention is None:
        return False, "no attention kernel here" if library is None else "; ".join(library.notes)
    config = model.config
    dtype, device = embedding_format(model)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if device.type != "cpu" or not library.attention.fits(heads, kv_heads, dim, dtype):
        return False, f"the attention kernel does not take {heads}/{kv_heads} heads of {dim} in {dtype} on {device}"
    return True, "every row computed as plain decoding's, whatever the other rows"


def offered_library(model: nn.Module, env: Environment | None = None) -> KernelLibrary | None:
    """The library a model's plan may use: the one the loader offered, or, for layers already on its q4 kernel
    (a model built outside the loader), this machine's."""
    record = load_record(model)
    if record.library is not None or not row_invariant_layers(model):
        return record.library
    return library_here(env=env).library


def exact_setup_for(
    model: nn.Module, library: KernelLibrary | None | bool = True, env: Environment | None = None
) -> ForwardSetup:
    """The exact setup for this model: where every decoder linear is row-invariant, 1-row decode forwards, else
    exact_setup of its dtype with its dummy rows; decode / verify attention on the attention kernel wherever the
    lean forward can run it (library: the offered one by default; the lean forward unless LOCALSPEC_FORWARD says
    otherwise)."""
    env = env or Environment.read()
    library = offered_library(model, env) if library is True else library or None
    kernel = env.forward == "lean" and lean_supported(model) and _attention_kernel_fits(model, library)[0]
    if row_invariant_layers(model):
        return ForwardSetup(attention="eager", explicit_mask=True, attention_kernel=kernel)
    dtype = embedding_format(model)[0]
    return dataclasses.replace(exact_setup(dtype), attention_kernel=kernel)


def setup_id(setup: ForwardSetup, row_invariant: bool) -> Setup:
    """The guarantee's id of a setup: fast, exact on torch's ops, exact with only the attention kernel, or exact on
    the row-invariant kernels throughout."""
    if setup == FAST:
        return "fast"
    if not setup.attention_kernel:
        return "exact"
    return "exact-kernels" if row_invariant else "exact-attention"


def exact_cost(plan: ForwardPlan) -> Choice:
    """Whether `exact: auto` must time a model's exact setup against the fast one (models/exact_choice.py), from the
    model's exact plan. On exact-kernels every decoder linear is on a row-invariant block kernel and decode / verify
    attention on the attention kernel: no dummy row, no eager attention, and the same kernels serve plain decoding,
    where the fast setup runs sdpa and no layer kernel; so the exact setup costs nothing extra and is on untimed.
    Any other exact setup pays dummy rows or eager attention somewhere, and is timed."""
    if plan.setup_id == "exact-kernels":
        return Choice("known", "exact-kernels: every linear on row-invariant kernels, no timing needed")
    return Choice("timed", f"{plan.setup_id}: {plan.setup.describe()} against the fast setup, timed once per machine")


def packing(env: Environment | None = None) -> Choice:
    """Whether bf16 linears run on oneDNN's prepacked weight (runtime/packed_linear.py, checked bitwise per layer)."""
    if (env or Environment.read()).packed:
        return Choice("packed", "oneDNN's prepacked weight where bitwise F.linear's (checked per layer)")
    return Choice("plain", "turned off (LOCALSPEC_PACKED=off)")


# ---- the plan -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ForwardPlan:
    """Every choice of a runner's forwards and why (module docstring). The kernels it names ride along, outside
    equality and printing."""

    setup: ForwardSetup
    setup_id: Setup
    forward: ForwardKind
    forward_reason: str
    cache: CacheKind
    compile: CompileMode
    library: Choice
    linears: tuple[tuple[str, Choice], ...]
    tensor_types: tuple[tuple[str, Choice], ...]  # per GGUF block type of the decoder linears (none: not a GGUF)
    lm_head: Choice
    decode_attention: Choice
    prefill_attention: Choice
    dummy_rows: Choice
    layer_kernel: Choice
    threads: Choice  # "follow load" (engine/threads.py: fewer threads while other processes keep cores busy) | "fixed"
    kernels: KernelLibrary | None = field(default=None, compare=False, repr=False)
    head: nn.Module | None = field(default=None, compare=False, repr=False)  # the LM head module (lm_head q8 / q8k)
    # the kernels the model's lean layers are built with, where they take them (a runner of another setup of the same
    # model shares its layers): the attention kernel where it fits, the layer kernel where the linears are on q4
    attention_kernel: object | None = field(default=None, compare=False, repr=False)
    layer: object | None = field(default=None, compare=False, repr=False)

    @property
    def on_attention_kernel(self) -> bool:
        return self.decode_attention.value == "kernel"

    @property
    def on_layer_kernel(self) -> bool:
        return self.layer_kernel.value == "on"

    def attention(self, rows: int) -> AttentionKind | None:
        """A lean forward of `rows` real rows: its attention (None: the model's own, the setup's)."""
        if self.forward != "lean":
            return None
        if rows > DECODE_MAX_ROWS:
            return "kernel" if self.prefill_attention.value == "kernel" and rows <= PREFILL_KERNEL_MAX_ROWS else "sdpa"
        return "kernel" if self.on_attention_kernel else None

    def rows_as_plain(self, rows: int) -> bool:
        """Whether a decode / verify forward of `rows` rows computes each row's attention in plain shapes."""
        return self.setup.rows_as_plain and self.forward == "lean" and rows <= DECODE_MAX_ROWS

    def summary(self) -> str:
        """One line, e.g. 'exact-kernels: lean forward, linears q4, head q8, attention kernel, 1-row decode'."""
        kinds = sorted({choice.value for _, choice in self.linears}) or ["dense"]
        parts = [f"{self.forward} forward", f"linears {'+'.join(kinds)}", f"head {self.lm_head.value}"]
        layer = " (layer kernel)" if self.on_layer_kernel else ""
        parts.append(f"decode/verify {self.decode_attention.value}{layer}")
        parts.append(self.dummy_rows.value)
        if self.compile != "off":
            parts.append(f"compile {self.compile}")
        return f"{self.setup_id}: " + ", ".join(parts)

    def to_dict(self) -> dict:
        """Each choice with its reason (what `localspec generate --json` prints as `plan`)."""
        choices = {
            "library": self.library,
            "lm_head": self.lm_head,
            "decode_attention": self.decode_attention,
            "prefill_attention": self.prefill_attention,
            "dummy_rows": self.dummy_rows,
            "layer_kernel": self.layer_kernel,
            "threads": self.threads,
        }
        out = {name: {"value": c.value, "reason": c.reason} for name, c in choices.items()}
        out["linears"] = {name: {"value": c.value, "reason": c.reason} for name, c in self.linears}
        out["tensor_types"] = {name: {"value": c.value, "reason": c.reason} for name, c in self.tensor_types}
        out["forward"] = {"value": self.forward, "reason": self.forward_reason}
        out |= {"setup": self.setup_id, "cache": self.cache, "compile": self.compile}
        return {"summary": self.summary(), **out}


def _linear_choices(model: nn.Module, record: LoadRecord) -> tuple[tuple[str, Choice], ...]:
    """Per tensor class (q_proj, …): the loader's choice where it made one, else the dense layer's dtype."""
    if record.tensors:
        return record.tensors
    linears = _decoder_linears(model) or []
    dtypes = sorted({str(m.weight.dtype).replace("torch.", "") for m in linears if isinstance(m, nn.Linear)})
    return (("decoder", Choice("dense", f"{'/'.join(dtypes) or 'no'} weights: torch's matmul")),) if linears else ()


def plan_forward(
    model: nn.Module,
    exact: bool = False,
    setup: ForwardSetup | None = None,
    forward: ForwardKind | None = None,
    cache: CacheKind = "static",
    compile: CompileMode | None = None,
    env: Environment | None = None,
) -> ForwardPlan:
    """The plan of a runner of `model`: exact or fast forwards (or an explicit `setup`, for measurements and tests),
    under the environment's switches (forward, compile, packing) unless given."""
    from .static_cache import cache_supported

    env = env or Environment.read()
    record = load_record(model)
    library = offered_library(model, env)
    if setup is None:
        setup = exact_setup_for(model, library, env) if exact else FAST
    cache = cache if cache == "dynamic" or cache_supported(model.config) else "dynamic"
    compile = env.compile if compile is None else compile
    wanted = env.forward if forward is None else forward
    preallocated = cache == "static" and compile != "reduce-overhead"
    lean = wanted == "lean" and preallocated and lean_supported(model)
    fits, why_kernel = _attention_kernel_fits(model, library)
    row_invariant = row_invariant_layers(model)
    on_kernels = row_invariant and kernel_layout_layers(model)

    if not lean:
        why = "asked for" if wanted != "lean" else "not a plain llama / qwen2 / qwen3, or not on the preallocated cache"
        why_forward = f"transformers' forward ({why})"
    else:
        why_forward = f"the lean forward ({model.config.model_type})"
    if setup.attention_kernel and lean and fits:
        decode = Choice("kernel", f"attention kernel: {why_kernel}")
    elif setup.rows_as_plain and lean:
        decode = Choice("eager, rows as plain", "each row's eager attention in plain decoding's shapes")
    else:
        decode = Choice(setup.attention, "the fast setup" if setup == FAST else f"exact setup ({why_kernel})")
    if setup.min_rows == 1 and setup.row_multiple == 1:
        rows_why = "every decoder linear is row-invariant" if row_invariant and setup != FAST else "the fast setup"
        dummy = Choice("no dummy rows", rows_why)
    else:
        dummy = Choice(setup.rows, "torch's matmuls round a row by the row count (EXACT_ROWS)")
    layer_on = decode.value == "kernel" and on_kernels and library is not None and library.layer is not None
    if layer_on:
        layer = Choice("on", "whole layers in one C call (bf16 layers, each linear on its block type's kernel)")
    elif library is None or decode.value != "kernel":
        layer = Choice("off", "decode / verify attention is not on the attention kernel")
    elif not on_kernels:
        layer = Choice(
            "off", "it runs only where every linear of a layer is on a block-type kernel (q4, q4f, q4k, q8, q8k, q6k)"
        )
    else:
        layer = Choice("off", "; ".join(library.notes))
    if not lean:
        prefill = Choice(setup.attention, "the setup's attention")
    elif layer_on:
        prefill = Choice(
            "kernel",
            f"the layer kernel up to {PREFILL_KERNEL_MAX_ROWS} rows, sdpa over: a prompt, run alike in every setup",
        )
    else:
        prefill = Choice("sdpa", f"over {DECODE_MAX_ROWS} rows: a prompt, run alike in every setup")
    if not layer_on:
        threads = Choice("fixed", "not every forward on the kernels: torch's may round by the thread count")
    elif env.threads_follow_load:
        threads = Choice("follow load", "every forward on the kernels, the same bits at any thread count")
    else:
        threads = Choice("fixed", "LOCALSPEC_THREADS_FOLLOW_LOAD is off")
    if record.head is not None:
        kind = record.head.kernel.KIND  # one block type a kernel serves as the head (KERNELS' lm_head role)
        row = next(r for r in KERNELS.values() if r.kernel == kind and "lm_head" in r.roles)
        head = Choice(kind, f"the file's {row.block_type} token embedding, tied: {row.why}")
    else:
        head = packing(env)
    return ForwardPlan(
        setup=setup,
        setup_id=setup_id(dataclasses.replace(setup, attention_kernel=decode.value == "kernel"), row_invariant),
        forward="lean" if lean else "transformers",
        forward_reason=why_forward,
        cache=cache,
        compile=compile,
        library=Choice(
            library.isa if library is not None else "none",
            "offered by the loader" if library else "none offered (not a CPU target, or the library cannot run here)",
        ),  # fmt: skip
        linears=_linear_choices(model, record),
        tensor_types=record.types,
        lm_head=head,
        decode_attention=decode,
        prefill_attention=prefill,
        dummy_rows=dummy,
        layer_kernel=layer,
        threads=threads,
        kernels=library,
        head=record.head,
        attention_kernel=library.attention if lean and fits else None,
        layer=library.layer if lean and fits and on_kernels else None,
    )
