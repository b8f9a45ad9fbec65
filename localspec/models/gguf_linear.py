"""`quant: gguf`: a GGUF's Q4_1 linears kept as 4-bit codes and run by a CPU int4 kernel (runtime/int4_linear.py).

A Q4_1 block holds 32 weights of one output row as 4-bit codes q ∈ [0, 15], an fp16 scale d and an fp16 minimum m:
w = q·d + m (20 bytes: d, m, then 16 bytes whose low nibbles are weights 0..15 and high nibbles 16..31). Which kernel
runs a tensor of each block type is the forward plan's table (runtime/plan.py KERNELS, tensor_kernel): the q4
kernel (runtime/q4_kernel.py) takes d and m as they are, wherever the kernels' library loads. Elsewhere torch's
`_weight_int4pack_mm_for_cpu` takes the same asymmetric group-32 layout as w = (q − 8)·scale + zero, so scale = d
and zero = m + 8d, rounded to bfloat16 (its fast path wants bfloat16 scales and zeros): docs/kernels.md states
what that changes.

Only the Q4_1 linears of a llama-architecture GGUF are swapped in, and, on the q4 kernel's library, a Q8_0 token
embedding that is also the tied LM head gets a Q8Head for the logits (runtime/q8_head.py; the embedding itself stays
dense). The F32 norms stay as the cached dequantized folder loaded them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from localspec.config import ConfigError
from localspec.runtime.int4_linear import ROW_MULTIPLE, Int4Linear, layout_tag
from localspec.runtime.library import KernelLibrary, LibraryLoad
from localspec.runtime.plan import Choice, LoadRecord, library_here, record_load, tensor_kernel
from localspec.runtime.q4_kernel import GROUP, Q4Matmul
from localspec.runtime.q8_head import Q8Head

from .paths import cache_dir

__all__ = [
    "GROUP",
    "Int4Linear",
    "dequantize_q4_1",
    "int4_from_q4_1",
    "int4_kernel_note",
    "q4_1_fields",
    "library_here_now",
    "swap_in_q4_1_linears",
]

Q4_1_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles (a block of GROUP weights)
Q8_0_BYTES = 34  # fp16 d, 32 int8 codes (a block of GROUP weights)
HEAD = "lm_head"  # the packed-layer cache's name for the Q8_0 LM head's tensors
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
class Q4_1Fields:
    """A Q4_1 tensor's blocks taken apart: codes [N, K] int32 in 0..15, d and m [N, K/32] float16."""

    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor


def q4_1_fields(blocks: torch.Tensor) -> Q4_1Fields:
    """blocks [N, K/32 · 20] uint8 (one row of blocks per output row) → codes, d, m."""
    rows, width = blocks.shape
    if width % Q4_1_BYTES:
        raise ConfigError(f"a Q4_1 row is a whole number of {Q4_1_BYTES}-byte blocks; got {width} bytes")
    groups = width // Q4_1_BYTES
    split = blocks.reshape(rows, groups, Q4_1_BYTES)  # [N, G, 20]
    d = split[..., 0:2].contiguous().view(torch.float16).reshape(rows, groups)  # [N, G]
    m = split[..., 2:4].contiguous().view(torch.float16).reshape(rows, groups)  # [N, G]
    nibbles = split[..., 4:]  # [N, G, 16]
    codes = torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1)  # [N, G, 32]: weights 0..15, then 16..31
    return Q4_1Fields(codes.reshape(rows, groups * GROUP).to(torch.int32), d, m)


def q8_0_fields(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """blocks [N, K/32 · 34] uint8 → (codes [N, K] int8, d [N, K/32] float16); w = q·d."""
    rows, width = blocks.shape
    if width % Q8_0_BYTES:
        raise ConfigError(f"a Q8_0 row is a whole number of {Q8_0_BYTES}-byte blocks; got {width} bytes")
    groups = width // Q8_0_BYTES
    split = blocks.reshape(rows, groups, Q8_0_BYTES)  # [N, G, 34]
    d = split[..., 0:2].contiguous().view(torch.float16).reshape(rows, groups)  # [N, G]
    codes = split[..., 2:].contiguous().view(torch.int8).reshape(rows, groups * GROUP)  # [N, K]
    return codes, d


def dequantize_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """The file's own dequantization, w = q·d + m in float32 (what gguf.dequantize and transformers compute):
    [N, K] float32."""
    fields = q4_1_fields(blocks)
    rows, k = fields.codes.shape
    codes = fields.codes.reshape(rows, k // GROUP, GROUP).float()  # [N, G, 32]
    return (codes * fields.d.float()[..., None] + fields.m.float()[..., None]).reshape(rows, k)


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


def int4_from_q4_1(blocks: torch.Tensor, kernel: Q4Matmul | None = None) -> Int4Linear:
    """An Int4Linear from a GGUF Q4_1 tensor's blocks [N, K/32 · 20] uint8, on `kernel` (None: torch's)."""
    fields = q4_1_fields(blocks)
    if fields.codes.shape[0] % ROW_MULTIPLE:
        raise ConfigError(f"the int4 kernel packs {ROW_MULTIPLE}·n output rows; this layer has {fields.codes.shape[0]}")
    return Int4Linear.from_q4_1(fields.codes, fields.d, fields.m, kernel)


def unpermute_rows(blocks: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves the rotary halves of each head of attn_q / attn_k; transformers' GGUF loader
    undoes it on the rows (modeling_gguf_pytorch_utils.LlamaTensorProcessor). Whole rows move, so the same reshape
    applies to rows of blocks: [N, bytes] → [N, bytes]."""
    rows = blocks.shape[0]
    return blocks.reshape(heads, rows // heads // 2, 2, -1).transpose(1, 2).reshape(blocks.shape)


def _gguf_tensors(path: Path) -> tuple[str, dict[str, tuple[str, torch.Tensor]]]:
    """(architecture, {tensor name: (type name, raw data)}) of a GGUF file."""
    import gguf

    reader = gguf.GGUFReader(path)
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else "?"
    return arch, {t.name: (t.tensor_type.name, torch.from_numpy(np.array(t.data))) for t in reader.tensors}


@dataclass(frozen=True)
class PackedLayers:
    """What quant gguf swaps into a model: its Q4_1 linears by module name, and the Q8_0 LM head (None: none)."""

    linears: dict[str, Int4Linear]
    head: Q8Head | None
    choices: tuple[tuple[str, Choice], ...] = ()  # per tensor class (q_proj, …): the plan's kernel and why


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


def _q8_head(model: nn.Module, tensors: dict, path: Path, library: KernelLibrary | None, why_not: str):
    """(A Q8Head from the GGUF's token_embd where the plan's table gives its block type as a tied LM head (no
    output.weight) a kernel of the library, or None; the choice). Checked first like the linears (the file's
    dequantization, rounded to the model's dtype, must be the loaded embedding bitwise)."""
    kind, raw = tensors.get("token_embd.weight", ("missing", None))
    choice = tensor_kernel(kind, "lm_head", library, why_not)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    kernel = _member(library, choice)
    if kernel is None or raw is None or not tied or "output.weight" in tensors:
        return None, choice
    codes, d = q8_0_fields(raw)
    if codes.shape[0] % ROW_MULTIPLE or codes.shape[1] % GROUP:
        return None, Choice("dense", f"{codes.shape[0]} × {codes.shape[1]}: not whole blocks of the q8 layout")
    dense = model.get_input_embeddings().weight.detach()
    exact = (codes.reshape(codes.shape[0], -1, GROUP).float() * d.float()[..., None]).reshape(codes.shape)
    if exact.shape != dense.shape or not torch.equal(exact.to(dense.dtype), dense):
        raise ConfigError(f"{path.name}: token_embd does not match the loaded embedding; the GGUF's layout is unknown")
    return Q8Head.from_q8_0(codes, d, kernel), choice


def _built_layers(model: nn.Module, path: Path, library: KernelLibrary | None, why_not: str) -> PackedLayers:
    """The Int4Linear for each linear of `model` whose GGUF tensor's block type has a kernel in the plan's table
    (Q4_1), each checked first: the file's exact dequantization, rounded to the model's dtype, must equal the loaded
    weight bitwise (which catches a wrong name map or row order); and the Q8_0 LM head where it applies (_q8_head)."""
    arch, tensors = _gguf_tensors(path)
    if arch != "llama":
        raise ConfigError(f"{path.name}: quant gguf runs llama-architecture GGUF files; this one is {arch!r}")
    config = model.config
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    built, choices = {}, {}
    for index, layer in enumerate(model.model.layers):
        for short, module_path in LLAMA_LINEARS.items():
            kind, raw = tensors.get(f"blk.{index}.{short}.weight", ("missing", None))
            choice = tensor_kernel(kind, "linear", library, why_not)
            if choice.value != "dense" and raw is not None and raw.shape[0] % ROW_MULTIPLE:
                choice = Choice("dense", f"{raw.shape[0]} outputs: not whole blocks of {ROW_MULTIPLE}")
            _merged(choices, module_path.rpartition(".")[2], choice)
            if choice.value == "dense":
                continue
            blocks = unpermute_rows(raw, heads[short]) if short in heads else raw
            dense = layer.get_submodule(module_path)
            exact = dequantize_q4_1(blocks).to(dense.weight.dtype)
            if exact.shape != dense.weight.shape or not torch.equal(exact, dense.weight.detach()):
                raise ConfigError(
                    f"{path.name}: blk.{index}.{short} does not match the loaded {module_path} weight; "
                    "the GGUF's layout is not the one quant gguf knows"
                )
            built[f"model.layers.{index}.{module_path}"] = int4_from_q4_1(blocks, _member(library, choice))
    head, head_choice = _q8_head(model, tensors, path, library, why_not)
    return PackedLayers(built, head, tuple(choices.items()) + (("lm_head", head_choice),))


def _read_cache(cache: Path, library: KernelLibrary | None, why_not: str) -> PackedLayers | None:
    from safetensors import safe_open

    kernel = library.q4 if library is not None else None
    try:
        with safe_open(cache, "pt") as handle:
            meta = handle.metadata() or {}
            if meta.get("layout", "torch") != layout_tag(kernel):
                return None  # packed for the other kernel: its tensors are not read
            flat = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (a safe_open handle)
    except Exception:  # missing, partial or unreadable: built again from the file
        return None
    head, choices = None, {}
    if f"{HEAD}.codes" in flat and f"{HEAD}.scales" in flat and library is not None:
        codes, scales = flat.pop(f"{HEAD}.codes"), flat.pop(f"{HEAD}.scales")
        head = Q8Head(codes, scales, codes.shape[1] * codes.shape[2], library.q8)
    names = {key.rpartition(".")[0] for key in flat}
    built = {}
    for name in names:
        packed, scales_zeros = flat.get(f"{name}.packed"), flat.get(f"{name}.scales_zeros")
        if packed is None or scales_zeros is None:
            return None
        _merged(choices, name.rpartition(".")[2], tensor_kernel("Q4_1", "linear", library, why_not))
        if kernel is None:  # [N, K/2]
            built[name] = Int4Linear(packed, scales_zeros, packed.shape[1] * 2, packed.shape[0])
        else:  # [N/16, K/32, 16, 16]
            blocks, groups, pairs, lanes = packed.shape
            built[name] = Int4Linear(packed, scales_zeros, groups * pairs * 2, blocks * lanes, kernel)
    head_choice = tensor_kernel("Q8_0", "lm_head", library, why_not) if head is not None else Choice("dense", "")
    return PackedLayers(built, head, tuple(sorted(choices.items())) + (("lm_head", head_choice),))


def _write_cache(cache: Path, layers: PackedLayers, library: KernelLibrary | None) -> None:
    from safetensors.torch import save_file

    flat = {}
    for name, layer in layers.linears.items():
        flat[f"{name}.packed"], flat[f"{name}.scales_zeros"] = layer.packed, layer.scales_zeros
    if layers.head is not None:
        flat[f"{HEAD}.codes"], flat[f"{HEAD}.scales"] = layers.head.codes, layers.head.scales
    tmp = cache.with_name(cache.name + ".tmp")
    try:
        save_file(flat, tmp, metadata={"layout": layout_tag(library.q4 if library is not None else None)})
        tmp.replace(cache)
    except OSError:
        pass  # a read-only data folder: the next start builds them again


def swap_in_q4_1_linears(
    model: nn.Module, path: Path, cache: Path | None = None, load: LibraryLoad | None = None
) -> int:
    """Replace each linear of `model` (a transformers llama loaded in bf16 from the GGUF's dequantized folder) whose
    GGUF tensor's block type has a kernel (runtime/plan.py KERNELS) with an Int4Linear built from the file's blocks,
    and record what was built for the model's forward plan (plan.record_load); returns how many were swapped.
    `cache`: a safetensors file holding the packed layers, written at the first start and read at later ones
    (reading the GGUF's metadata alone takes seconds; a cache packed for the other kernel is rewritten). `load`: the
    kernels' library (None, or one without a library: torch's kernel)."""
    library = load.library if load is not None else None
    why_not = load.reason if load is not None else "not offered"
    layers = _read_cache(cache, library, why_not) if cache is not None and cache.exists() else None
    modules = dict(model.named_modules())
    if layers is not None and any(name not in modules for name in layers.linears):
        layers = None  # another model's layers
    if layers is not None and layers.head is not None and layers.head.out_features != model.config.vocab_size:
        layers = None
    if layers is None:
        layers = _built_layers(model, path, library, why_not)
        if cache is not None and layers.linears:
            _write_cache(cache, layers, library)
    if not layers.linears:
        raise ConfigError(f"{path.name}: no Q4_1 linear layers; quant gguf keeps Q4_1 blocks only")
    for name, layer in layers.linears.items():
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, layer)
    linears = tuple((name, choice) for name, choice in layers.choices if name != "lm_head")  # the head: the plan's
    record_load(model, LoadRecord(library, linears, layers.head))
    return len(layers.linears)
