"""`quant: gguf`: a GGUF's linears kept in their own blocks and run by the kernels' library (or torch's int4 kernel).

Which kernel runs a tensor of each block type is the forward plan's table (runtime/plan.py KERNELS, tensor_kernel);
this module takes each type's blocks apart into the layout that kernel reads (BLOCK_BYTES names the types it knows):

  Q4_1  32 weights as 4-bit codes q ∈ [0, 15], fp16 d and m: w = q·d + m (20 bytes: d, m, then 16 bytes whose low
        nibbles are weights 0..15 and high nibbles 16..31) → the q4 layout as they are
  Q4_0  the same nibbles and an fp16 d: w = d·(q − 8) (18 bytes) → the q4 layout with m = −8·d, exact in float16
        (a power-of-2 multiple) unless |8·d| overflows it: that tensor then stays dense, with the reason
  Q8_0  32 int8 codes and an fp16 d: w = q·d (34 bytes) → the q8 layout as they are
  Q5_0  an fp16 d, 4 bytes of fifth bits and Q4_0's nibbles: w = d·(q − 16), q ∈ [0, 31] (22 bytes) → the q8
        layout with codes q − 16 ∈ [−16, 15]
  Q5_1  fp16 d and m, Q5_0's fifth bits and nibbles: w = d·q + m (24 bytes) → the q8k layout, d and m per 16

The K-quants come in super-blocks of 256 weights (so K is a multiple of 256) with an fp16 super-scale; each sub-block's
scale is that times a small integer, which float32 holds exactly (and float16 may not):

  Q4_K  fp16 d and dmin, 12 bytes of 6-bit (sc, mn) pairs for 8 sub-blocks of 32, 128 bytes of nibbles (byte l of
        chunk c: weight l of sub-block 2c low, of 2c + 1 high): w = (d·sc)·q − dmin·mn (144 bytes) → the q4 layout
        with d, dmin, sc and mn as stored (the q4k kernel, which makes q4f's float32 d·sc and −dmin·mn from them)
  Q5_K  Q4_K's fields and 32 bytes of fifth bits (bit i of byte l: weight l of sub-block i) (176 bytes) → the q8k
        layout, d·sc and −dmin·mn per 16
  Q6_K  128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, fp16 d: w = (d·sc)·(q − 32) per 16 (210 bytes)
        → the q8k layout's codes q − 32 ∈ [−32, 31], kept in 6 bits (q4_kernel.six_planes), with d and sc as
        stored (the q6k kernel, which makes q8k's float32 d·sc from them)

The q4 kernel (runtime/q4_kernel.py) runs the q4 layout as an Int4Linear (q4f: its float32 scales), the q8 kernel
the q8 layout as a Q8Linear (runtime/q8_head.py; q8k: the q8k layout), wherever the kernels' library loads.
Elsewhere torch's `_weight_int4pack_mm_for_cpu` takes the Q4_0 / Q4_1 q4 layout as w = (q − 8)·scale + zero, so
scale = d and zero = m + 8d, rounded to bfloat16 (its fast path wants bfloat16 scales and zeros: docs/kernels.md
states what that changes), and the other layouts stay dense.

gguf_model.py builds a model from the file with these; on the library, a Q8_0 or Q6_K token embedding that is also the
tied LM head gets a Q8Head (on the q8, q8k or q6k kernel) for the logits, and on q8 or q6k the embedding's rows are
read from that head's blocks (runtime/q8_head.py HeadRowsEmbedding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from localspec.config import ConfigError
from localspec.runtime.int4_linear import ROW_MULTIPLE, Int4Linear
from localspec.runtime.library import KernelLibrary, LibraryLoad
from localspec.runtime.plan import KERNEL_NAMES, KERNELS, Choice, library_here, tensor_kernel
from localspec.runtime.q4_kernel import GROUP, K_GROUP, SUPER, Q4Matmul, pack_q6k, pack_q8, pack_q8k
from localspec.runtime.q8_head import Q8Head, Q8Linear

from .paths import cache_dir
from .untrusted import shown

__all__ = [
    "GROUP",
    "Int4Linear",
    "dequantize",
    "int4_from_q4_1",
    "int4_kernel_note",
    "q4_fields",
    "q8_fields",
    "q8k_fields",
    "auto_quant",
    "library_here_now",
    "linear_types",
    "q8_head",
]

# (weights, bytes) of a block, per type
BLOCK_BYTES = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
# GGUF tensor name within block i → the transformers llama module path within model.model.layers[i]
LLAMA_LINEARS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass(frozen=True)
class Q4Fields:
    """A q4-layout tensor's blocks taken apart: codes [N, K] uint8 in 0..15, d and m [N, K/32] float16 (Q4_K:
    float32) (w = q·d + m)."""

    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor


@dataclass(frozen=True)
class Q8KFields:
    """A q8k-layout tensor's blocks taken apart: codes [N, K] int8, d and m [N, K/16] float32 (w = d·q + m)."""

    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor


def _split(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """blocks [N, K/weights · bytes] uint8 (one row of blocks per output row) → [N, blocks, bytes]."""
    rows, width = blocks.shape
    size = BLOCK_BYTES[kind][1]
    if width % size:
        raise ConfigError(f"a {kind} row is a whole number of {size}-byte blocks; got {width} bytes")
    return blocks.reshape(rows, width // size, size)


def _half(split: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 at byte `at` of each block: [N, G]."""
    return split[..., at : at + 2].contiguous().view(torch.float16)[..., 0]


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """16 bytes a block → its 32 4-bit codes: the low nibbles are weights 0..15, the high ones 16..31."""
    return torch.cat([packed & 0xF, packed >> 4], dim=-1)  # [N, G, 32]


def _fifth_bits(split: torch.Tensor, at: int) -> torch.Tensor:
    """Bit j of the little-endian uint32 at byte `at` of each block: weight j's fifth bit, [N, G, 32] int64."""
    high = split[..., at : at + 4].to(torch.int64)
    bits = high[..., 0] | high[..., 1] << 8 | high[..., 2] << 16 | high[..., 3] << 24  # [N, G]
    return (bits[..., None] >> torch.arange(GROUP)) & 1


def _k_small(split: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: each super-block's 8 sub-block 6-bit (sc, mn), [N, B, 8] int32: those of sub-blocks 0..3 are the
    low bits of bytes 4..7 and 8..11, those of 4..7 the nibbles of bytes 12..15 with the top two bits of bytes 4..7
    and 8..11 above them."""
    packed = split[..., 4:16].to(torch.int32)
    low, mins, high = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([low & 63, (high & 0xF) | ((low >> 2) & 0x30)], dim=-1)
    mn = torch.cat([mins & 63, (high >> 4) | ((mins >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_scales(split: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: each super-block's 8 sub-block (d·sc, −dmin·mn), [N, B, 8] float32, exact."""
    sc, mn = _k_small(split)
    d, dmin = _half(split, 0).float()[..., None], _half(split, 2).float()[..., None]
    return d * sc.float(), -(dmin * mn.float())


def _q4_k_codes(qs: torch.Tensor) -> torch.Tensor:
    """Q4_K / Q5_K's 128 bytes of nibbles [N, B, 128] → the 256 low nibbles in weight order, [N, B, 256]."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 1, 32)  # byte l of chunk c: sub-block 2c low, 2c + 1 high
    return torch.cat([chunks & 0xF, chunks >> 4], dim=-2).reshape(*qs.shape[:-1], 256)


def q4_fields(blocks: torch.Tensor, kind: str = "Q4_1") -> Q4Fields:
    """A Q4_1, Q4_0 or Q4_K tensor's blocks [N, K/weights · bytes] uint8 → codes, d, m (Q4_0: m = −8·d, ±inf where
    it overflows float16; Q4_K: float32 d = d·sc and m = −dmin·mn per 32)."""
    split = _split(blocks, kind)
    if kind == "Q4_K":
        rows, supers = split.shape[:2]
        d, m = _k_scales(split)
        codes = _q4_k_codes(split[..., 16:]).reshape(rows, supers * 256)
        return Q4Fields(codes, d.reshape(rows, supers * 8), m.reshape(rows, supers * 8))
    rows, groups = split.shape[:2]
    d = _half(split, 0)
    m = _half(split, 2) if kind == "Q4_1" else (d.float() * -8.0).half()  # exact: a power of 2 times d
    codes = _nibbles(split[..., 4:] if kind == "Q4_1" else split[..., 2:])
    return Q4Fields(codes.reshape(rows, groups * GROUP), d, m)


@dataclass(frozen=True)
class Q4KFields:
    """A Q4_K tensor's blocks as stored: codes [N, K] uint8 in 0..15, d and dmin [N, K/256] float16, sc and mn
    [N, K/32] int32 in 0..63 (w = (d·sc)·q − dmin·mn)."""

    codes: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor
    sc: torch.Tensor
    mn: torch.Tensor


def q4k_fields(blocks: torch.Tensor) -> Q4KFields:
    """A Q4_K tensor's blocks [N, K/256 · 144] uint8 → its fields as stored, for the q4k kernel."""
    split = _split(blocks, "Q4_K")
    rows, supers = split.shape[:2]
    sc, mn = _k_small(split)
    codes = _q4_k_codes(split[..., 16:]).reshape(rows, supers * 256)
    return Q4KFields(codes, _half(split, 0), _half(split, 2), sc.reshape(rows, -1), mn.reshape(rows, -1))


@dataclass(frozen=True)
class Q6KFields:
    """A Q6_K tensor's blocks as stored: codes [N, K] int8 (q − 32), d [N, K/256] float16, sc [N, K/16] int8
    (w = (d·sc)·(q − 32))."""

    codes: torch.Tensor
    d: torch.Tensor
    sc: torch.Tensor


def q6k_fields(blocks: torch.Tensor) -> Q6KFields:
    """A Q6_K tensor's blocks [N, K/256 · 210] uint8 → its fields as stored, for the q6k kernel."""
    split = _split(blocks, "Q6_K")
    rows = split.shape[0]
    codes = q8k_fields(blocks, "Q6_K").codes
    return Q6KFields(codes, _half(split, 208), split[..., 192:208].contiguous().view(torch.int8).reshape(rows, -1))


def q8_fields(blocks: torch.Tensor, kind: str = "Q8_0") -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 or Q5_0 tensor's blocks → (codes [N, K] int8, d [N, K/32] float16): w = q·d (Q5_0: its q − 16)."""
    split = _split(blocks, kind)
    rows, groups = split.shape[:2]
    d = _half(split, 0)
    if kind == "Q8_0":
        codes = split[..., 2:].contiguous().view(torch.int8)  # [N, G, 32]
    else:  # Q5_0: bit j of the little-endian uint32 at bytes 2..5 is weight j's fifth bit
        codes = (_nibbles(split[..., 6:]).to(torch.int64) | _fifth_bits(split, 2) << 4) - 16
    return codes.reshape(rows, groups * GROUP).to(torch.int8), d


def q8k_fields(blocks: torch.Tensor, kind: str) -> Q8KFields:
    """A Q6_K, Q5_K or Q5_1 tensor's blocks → codes [N, K] int8, d and m [N, K/16] float32: w = d·q + m."""
    split = _split(blocks, kind)
    rows, count = split.shape[:2]
    if kind == "Q5_1":
        codes = _nibbles(split[..., 8:]).to(torch.int64) | _fifth_bits(split, 4) << 4  # [N, G, 32]
        d, m = _half(split, 0).float()[..., None], _half(split, 2).float()[..., None]  # [N, G, 1]
    elif kind == "Q5_K":
        fifth = (split[..., 16:48, None].to(torch.int64) >> torch.arange(8)) & 1  # [N, B, 32 (l), 8 (sub-block)]
        codes = _q4_k_codes(split[..., 48:]).to(torch.int64) | fifth.transpose(-1, -2).reshape(rows, count, 256) << 4
        d, m = _k_scales(split)  # [N, B, 8]
    elif kind == "Q6_K":
        low = split[..., 0:128].reshape(rows, count, 2, 1, 64)  # half h: weights 128h + 0..63 low, + 64..127 high
        low = torch.cat([low & 0xF, low >> 4], dim=-2).reshape(rows, count, 256)
        high = split[..., 128:192].reshape(rows, count, 2, 1, 32)  # 2 bits each, 4 per byte
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]
        high = ((high >> shifts) & 3).reshape(rows, count, 256)
        codes = (low | high << 4).view(torch.int8) - 32  # in uint8 throughout: q < 64, so the view is exact
        d = _half(split, 208).float()[..., None] * split[..., 192:208].contiguous().view(torch.int8).float()
        return Q8KFields(
            codes.reshape(rows, -1).to(torch.int8), d.reshape(rows, -1), torch.zeros_like(d).reshape(rows, -1)
        )
    else:
        raise ConfigError(f"no q8k layout for {kind}")
    per = codes.shape[-1] // d.shape[-1] // K_GROUP  # groups of 16 per scale: each scale twice
    d, m = (t.reshape(rows, -1).repeat_interleave(per, dim=1) for t in (d, m))
    return Q8KFields(codes.reshape(rows, -1).to(torch.int8), d, m)


def dequantize(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """The file's own dequantization in float32, as gguf.quants computes it (and transformers with it): [N, K]."""
    if kind in ("Q6_K", "Q5_K", "Q5_1"):
        fields = q8k_fields(blocks, kind)
        rows, k = fields.codes.shape
        codes = fields.codes.reshape(rows, -1, K_GROUP).float()  # [N, G, 16]
        return (codes * fields.d[..., None] + fields.m[..., None]).reshape(rows, k)  # Q6_K: + 0 changes nothing
    if kind in ("Q8_0", "Q5_0"):
        codes, d = q8_fields(blocks, kind)
        rows, k = codes.shape
        return (codes.reshape(rows, -1, GROUP).float() * d.float()[..., None]).reshape(rows, k)
    fields = q4_fields(blocks, kind)
    rows, k = fields.codes.shape
    codes = fields.codes.reshape(rows, k // GROUP, GROUP).float()  # [N, G, 32]
    offset = -8.0 * fields.d.float() if kind == "Q4_0" else fields.m.float()  # Q4_0: d·q − 8d = d·(q − 8), exact
    return (codes * fields.d.float()[..., None] + offset[..., None]).reshape(rows, k)


def library_here_now() -> LibraryLoad:
    """This machine's kernels' library (built into the data folder's cache at first use), or why there is none."""
    return library_here(cache_dir() / "kernels")


def int4_kernel_note() -> str:
    """Which kernel a gguf target's int4 linears run on here, and why: for the CLI and the bench reports."""
    load = library_here_now()
    if load.library is not None:
        also = "the q8 LM head and the attention kernel" if load.library.attention else "the q8 LM head"
        return f"int4 kernel: q4 ({load.reason}), with {also}"
    return f"int4 kernel: torch's _weight_int4pack_mm_for_cpu (the q4 kernel: {load.reason})"


def int4_from_q4_1(blocks: torch.Tensor, kernel: Q4Matmul | None = None, kind: str = "Q4_1") -> Int4Linear:
    """An Int4Linear from a GGUF Q4_1 (or Q4_0) tensor's blocks [N, K/32 · bytes] uint8, on `kernel` (None:
    torch's)."""
    fields = q4_fields(blocks, kind)
    if fields.codes.shape[0] % ROW_MULTIPLE:
        raise ConfigError(f"the int4 kernel packs {ROW_MULTIPLE}·n output rows; this layer has {fields.codes.shape[0]}")
    return Int4Linear.from_q4_1(fields.codes, fields.d, fields.m, kernel)


def unpermute_rows(blocks: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves the rotary halves of each head of attn_q / attn_k; transformers' GGUF loader
    undoes it on the rows (modeling_gguf_pytorch_utils.LlamaTensorProcessor). Whole rows move, so the same reshape
    applies to rows of blocks: [N, bytes] → [N, bytes]."""
    rows = blocks.shape[0]
    return blocks.reshape(heads, rows // heads // 2, 2, -1).transpose(1, 2).reshape(blocks.shape)


def linear_types(path: Path) -> dict[str, tuple[str, ...]]:
    """{block type: the decoder linears' tensor names stored in it} of a GGUF file, from its header alone."""
    from .gguf_header import read_header

    return _linear_types(read_header(path, frozenset()))


def _linear_types(header) -> dict[str, tuple[str, ...]]:
    from .discovery import _type_name

    found: dict[str, list[str]] = {}
    for tensor in header.tensors:
        parts = tensor.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in LLAMA_LINEARS and parts[3] == "weight":
            found.setdefault(_type_name(tensor.type_id), []).append(shown(tensor.name))
    return {kind: tuple(names) for kind, names in sorted(found.items())}


def type_choices(types: dict[str, tuple[str, ...]], library: KernelLibrary | None, why_not: str):
    """Per block type of the decoder linears: what the plan's table runs it on, naming its tensors."""
    return tuple(
        (kind, _named(tensor_kernel(kind, "linear", library, why_not), found)) for kind, found in types.items()
    )


def _named(choice: Choice, names) -> Choice:
    """`choice` with the tensors it applies to in its reason (the first three, and how many in all)."""
    names = list(names)
    listed = ", ".join(names[:3]) + (f", … ({len(names)} in all)" if len(names) > 3 else "")
    return Choice(choice.value, f"{choice.reason} [{listed}]")


@dataclass(frozen=True)
class FileQuant:
    """What `quant: auto` runs a GGUF file as here, and why."""

    quant: str  # gguf: its blocks on the kernels; auto: timed against the dequantized weights; none: dequantized
    reason: str


def auto_quant(path: Path) -> FileQuant:
    """`quant: auto` for a GGUF file on the CPU, from its header's linear types: gguf where the library's kernels
    run some of them (the kernels are the fast path: nothing to time), auto (timed) where only torch's int4 kernel
    would, none where no type has a kernel. Linears left dense are named, with why."""
    from .gguf_meta import load_header
    from .gguf_model import ARCHITECTURES

    try:
        header = load_header(path)  # the first of a load's reads: with the arrays the load's tokenizer reads
    except (OSError, ValueError) as exc:  # the loader's own check says what is wrong with the file
        return FileQuant("none", f"its header does not read: {exc}")
    architecture = header.fields.get("general.architecture")
    if architecture not in ARCHITECTURES:
        return FileQuant("none", f"quant gguf builds {', '.join(ARCHITECTURES)} models; this file is {architecture!r}")
    types = _linear_types(header)
    if not any("linear" in getattr(KERNELS.get(kind), "roles", ()) for kind in types):  # no library to build
        choices = type_choices(types, None, "not loaded")
        return FileQuant("none", "; ".join(f"{kind}: {c.reason}" for kind, c in choices) or "no linears")
    load = library_here_now()
    choices = dict(type_choices(types, load.library, load.reason))
    dense = "".join(f"; {kind} stays dense: {c.reason}" for kind, c in choices.items() if c.value == "dense")
    fast = [kind for kind, choice in choices.items() if choice.value in KERNEL_NAMES]
    if fast:
        return FileQuant("gguf", f"its {', '.join(fast)} linears run on the kernels as stored{dense}")
    return FileQuant("auto", f"no kernels' library here ({load.reason}){dense}")


def _member(library: KernelLibrary | None, choice: Choice):
    """The library's kernel a choice names (None: torch's, or no kernel)."""
    return getattr(library, choice.value, None) if library is not None else None


def _merged(choices: dict[str, Choice], name: str, choice: Choice) -> None:
    """Record a tensor class's kernel; layers of one class with different kernels are listed together."""
    seen = choices.get(name)
    if seen is None or seen.value == choice.value:
        choices[name] = choice
    elif choice.value not in seen.value.split("+"):
        choices[name] = Choice(f"{seen.value}+{choice.value}", f"{seen.reason}; {choice.reason}")


HEAD_CHUNK = 1024  # token embedding rows packed at a time for the head: its fields never exist whole (their tens of MB
# would sit on top of every weight already packed, at the load's peak)


def q8_head(model: nn.Module, tensors, library: KernelLibrary | None, why_not: str) -> Q8Head | None:
    """A Q8Head from the GGUF's token_embd where the plan's table gives its block type as a tied LM head (no
    output.weight) a kernel of the library, or None. `tensors`: the file's (gguf_model.FileTensors). The blocks are
    read and packed HEAD_CHUNK rows at a time into the head's buffers (each pack keeps blocks of 16 rows whole and
    in order, so the chunks' packs side by side are the whole tensor's)."""
    if "token_embd.weight" not in tensors:
        return None
    kind = tensors.kind("token_embd.weight")
    choice = tensor_kernel(kind, "lm_head", library, why_not)
    kernel = _member(library, choice)
    if kernel is None or "output.weight" in tensors:  # no output.weight: the head is tied to the embedding
        return None
    rows, k = tensors.shape("token_embd.weight")
    group = {"q6k": SUPER, "q8": GROUP}.get(choice.value, K_GROUP)
    if rows % ROW_MULTIPLE or k % group:
        return None
    codes = scales = None
    for start, raw in tensors.chunks("token_embd.weight", HEAD_CHUNK):
        part_codes, part_scales = _head_pack(choice.value, kind, raw, start)
        if codes is None:  # the whole head's buffers, filled chunk by chunk
            codes = part_codes.new_empty((rows // ROW_MULTIPLE, *part_codes.shape[1:]))
            scales = part_scales.new_empty((rows // ROW_MULTIPLE, *part_scales.shape[1:]))
        first = start // ROW_MULTIPLE
        codes[first : first + part_codes.shape[0]] = part_codes
        scales[first : first + part_scales.shape[0]] = part_scales
    return Q8Head(codes, scales, k, kernel)


def _head_pack(value: str, kind: str, raw: torch.Tensor, first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of a token embedding's blocks packed for the head's kernel `value` (q6k, q8, q8k): (codes, scales)."""
    if value == "q6k":
        fields = q6k_fields(raw)
        _finite("token_embd.weight", fields.d, first_row=first_row)
        return pack_q6k(fields.codes, fields.d, fields.sc)
    if value == "q8":
        codes, d = q8_fields(raw, kind)
        _finite("token_embd.weight", d, first_row=first_row)
        return pack_q8(codes, d)
    k_fields = q8k_fields(raw, kind)
    _finite("token_embd.weight", k_fields.d, k_fields.m, first_row=first_row)
    return pack_q8k(k_fields.codes, k_fields.d, k_fields.m)


def _finite(tensor: str, *scales: torch.Tensor, first_row: int = 0) -> None:
    """A ConfigError naming the tensor where a block's scale is not a finite number (a damaged file); `first_row`:
    the tensor's row the scales' first row is."""
    for scale in scales:
        bad = ~torch.isfinite(scale)
        if bool(bad.any()):
            row, group = (int(i) for i in bad.nonzero()[0])
            value = float(scale[row, group])
            raise ConfigError(
                f"tensor {tensor}: block {group} of row {first_row + row} has the scale {value}; the file is damaged"
            )


def _block_linear(kind: str, blocks: torch.Tensor, choice: Choice, library: KernelLibrary | None, tensor: str):
    """The module `choice` (the plan's) runs a tensor's blocks as, or the Choice it falls back to and why."""
    if choice.value == "q8":
        codes, d = q8_fields(blocks, kind)
        _finite(tensor, d)
        return Q8Linear.from_q8_0(codes, d, library.q8)
    if choice.value == "q8k":
        fields = q8k_fields(blocks, kind)
        _finite(tensor, fields.d, fields.m)
        return Q8Linear.from_q8k(fields.codes, fields.d, fields.m, library.q8k)
    if choice.value == "q6k":
        six = q6k_fields(blocks)
        _finite(tensor, six.d)
        return Q8Linear.from_q6k(six, library.q6k)
    if choice.value == "q4k":
        k_fields = q4k_fields(blocks)
        _finite(tensor, k_fields.d, k_fields.dmin)
        return Int4Linear.from_q4k(k_fields, library.q4k)
    fields = q4_fields(blocks, kind)
    _finite(tensor, fields.d, *([] if kind == "Q4_0" else [fields.m]))
    if not bool(torch.isfinite(fields.m).all()):  # Q4_0 only: its d is finite
        return Choice("dense", f"{tensor}: a scale d past ±8188 makes m = −8·d overflow float16: the dense weight")
    return Int4Linear.from_q4_1(fields.codes, fields.d, fields.m, _member(library, choice))
