"""A GGUF target built from the file itself (quant gguf): no dequantized copy anywhere.

Words:
  block linear   a linear whose GGUF tensor's block type has a kernel in the plan's table (runtime/plan.py KERNELS):
                 its blocks are read from the file once, taken apart and packed into that kernel's layout
                 (gguf_linear.py); the layout is the kernel's, so the file's bytes are repacked, never copied whole
  dense tensor   everything else (the token embedding, norms, an untied LM head, a linear of a type with no kernel
                 here): the file's own dequantization, rounded to the model's dtype

Phases of build_from_file:
  1. the modules from the config made of the file's header (gguf_meta.py), on the meta device (no weight allocated;
     buffers real)
  2. every decoder linear from its tensor's blocks (block linear, then its bias where qwen2 has one:
     runtime/biased_linear.py) or dequantized (dense), one tensor in memory at a time
  3. the tied LM head on the q8 / q6k kernel where the plan's table gives its type one (gguf_linear.q8_head)
  4. every other parameter (norms, qwen3's q and k norms, an untied head, the embedding) from its tensor,
     dequantized, the head tied to the embedding where the file has no output.weight; a parameter left unfilled is
     an error. Where 3. built the head, the embedding is that head's rows (q8_head.HeadRowsEmbedding, no dense copy)
     and the model's lm_head a TiedHead on it. What was built is recorded for the forward plan (plan.record_load)

Each tensor is read with pread into a buffer of its own size, so the resident memory is the packed layers plus one
tensor being packed; the file's pages are never all mapped at once. transformers' own GGUF loader (the dequantized
folder quant none reads) is the reference: tests/test_gguf_model.py checks the model built here against it bitwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from localspec.config import ConfigError
from localspec.runtime.biased_linear import BiasedLinear
from localspec.runtime.library import KernelLibrary, LibraryLoad
from localspec.runtime.memory import load_allocations, release_free_memory
from localspec.runtime.plan import Choice, LoadRecord, record_load, tensor_kernel
from localspec.runtime.q8_head import HeadRowsEmbedding, Q8Head, TiedHead

from . import gguf_linear as blocks
from .gguf_header import GGUFHeader, TensorInfo, read_header
from .untrusted import open_regular, shown

ARCHITECTURES = ("llama", "qwen2", "qwen3")  # llama.cpp's names; a mistral file says llama
# the parameters other than the linears' weights: GGUF tensor name (block i's with {i}) → the transformers parameter
# (the same module paths in transformers' llama, qwen2 and qwen3); those a file does not hold are not looked for
TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",  # qwen3
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",  # qwen3
}
ROW_CHUNK = 4096  # rows dequantized at a time: a 152k-row embedding never exists in float32 whole


class FileTensors:
    """A GGUF file's tensors by name, each read from the file when asked for (pread: no mapping outlives a call).
    Inside `with` the file is opened once for every read; outside it, once per read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = None
        try:
            self.header: GGUFHeader = read_header(path, frozenset())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{shown(path)} is not a readable GGUF file: {exc}") from None
        truncated = self.header.truncated()
        if truncated is not None:
            raise ConfigError(f"{shown(path)}: {truncated}; the file is damaged or still downloading")
        self.info = {tensor.name: tensor for tensor in self.header.tensors}

    def __enter__(self) -> FileTensors:
        self._file = open_regular(self.path)
        return self

    def __exit__(self, *exc) -> None:
        self._file, opened = None, self._file
        opened.close()

    @property
    def architecture(self) -> str:
        return str(self.header.fields.get("general.architecture", "?"))

    def __contains__(self, name: str) -> bool:
        return name in self.info

    def kind(self, name: str) -> str:
        return _type_name(self.info[name])

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor `name`'s shape as torch gives it (GGUF lists the fastest-moving dimension first)."""
        return tuple(reversed(self.info[name].shape))

    def get(self, name: str, default=("missing", None)) -> tuple[str, torch.Tensor | None]:
        """(block type, its bytes [rows, bytes a row] uint8) of tensor `name`, or `default`."""
        info = self.info.get(name)
        if info is None:
            return default
        return _type_name(info), self.read(info)

    def rows(self, name: str) -> int:
        """Tensor `name`'s row count (its bytes' first dimension in `get` and `chunks`)."""
        info = self.info[name]
        return info.n_elements // info.shape[0] if info.shape else 1

    def chunks(self, name: str, rows: int):
        """Tensor `name`'s bytes `rows` rows at a time: (first row, [rows, bytes a row] uint8), each read when the
        one before is done with, so a large tensor (a 152k-row embedding) is never in memory whole."""
        info = self.info[name]
        for start in range(0, self.rows(name), rows):
            yield start, self.read(info, start, rows)

    def read(self, info: TensorInfo, first: int = 0, most: int | None = None) -> torch.Tensor:
        """Rows first .. first + most of the tensor's bytes (all of them by default), [rows, bytes a row] uint8."""
        import gguf

        try:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(info.type_id)]
        except (KeyError, ValueError):
            raise ConfigError(f"tensor {shown(info.name)}: unknown block type {info.type_id}") from None
        rows = info.n_elements // info.shape[0] if info.shape else 1
        row_bytes = info.n_elements // block * size // rows
        take = rows - first if most is None else min(most, rows - first)
        count = take * row_bytes
        data = bytearray(count)
        at = self.header.data_start + info.offset + first * row_bytes
        if self._file is not None:
            got = os.preadv(self._file.fileno(), [data], at)
        else:
            with open_regular(self.path) as fh:
                got = os.preadv(fh.fileno(), [data], at)
        if got != count:
            raise ConfigError(f"tensor {shown(info.name)}: {got} of its {count} bytes read; the file changed")
        return torch.frombuffer(data, dtype=torch.uint8).reshape(take, row_bytes)


def _type_name(info: TensorInfo) -> str:
    from .discovery import _type_name as name

    return name(info.type_id)


def dense(raw: torch.Tensor, kind: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor's blocks [rows, bytes] dequantized as the file format defines it (gguf_linear.dequantize where it
    knows the type, else gguf.quants), rounded to `dtype`, in chunks of ROW_CHUNK rows; `shape` is torch's."""
    rows = raw.shape[0]
    return dense_chunks(((start, raw[start : start + ROW_CHUNK]) for start in range(0, rows, ROW_CHUNK)), kind,
                        rows, shape, dtype)  # fmt: skip


def dense_chunks(chunks, kind: str, rows: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """dense() of a tensor given as (first row, its blocks [rows, bytes]) chunks (FileTensors.chunks): only the
    result and one chunk's values are in memory at a time."""
    import gguf

    out = torch.empty(rows, int(np.prod(shape)) // rows, dtype=dtype)
    for start, part in chunks:
        if kind in blocks.BLOCK_BYTES:
            values = blocks.dequantize(part, kind)
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            values = torch.from_numpy(gguf.quants.dequantize(part.numpy(), qtype).astype(np.float32, copy=False))
        out[start : start + part.shape[0]] = values.reshape(part.shape[0], -1).to(dtype)
        del values
    return out.reshape(shape)


def _fits(name: str, tensor: str, tensors: FileTensors, wanted: tuple[int, ...]) -> None:
    """A ConfigError naming both where the file's tensor is not the shape the config gives the parameter."""
    shape = tensors.shape(tensor)
    if shape != tuple(wanted):
        raise ConfigError(f"{name}: the file's tensor {tensor} is {shape}, the config makes it {tuple(wanted)}")


def _set(model: nn.Module, name: str, value: torch.Tensor) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent), leaf, nn.Parameter(value, requires_grad=False))


def _linears(model: nn.Module, tensors: FileTensors, library: KernelLibrary | None, why_not: str, dtype):
    """Phase 2: each decoder linear as a block linear or dense; (choices per tensor class, per block type)."""
    config = model.config
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    if tensors.architecture != "llama":  # llama.cpp interleaves the rotary halves of llama's q and k only
        heads = {}
    choices: dict[str, Choice] = {}
    types: dict[str, Choice] = {}
    names: dict[str, list[str]] = {}
    for index, layer in enumerate(model.model.layers):
        for short, module_path in blocks.LLAMA_LINEARS.items():
            tensor = f"blk.{index}.{short}.weight"
            if tensor not in tensors:
                raise ConfigError(f"{shown(tensors.path.name)}: no tensor {tensor}; not a whole llama model")
            linear = layer.get_submodule(module_path)
            _fits(f"model.layers.{index}.{module_path}.weight", tensor, tensors, tuple(linear.weight.shape))
            kind, raw = tensors.get(tensor)
            raw = blocks.unpermute_rows(raw, heads[short]) if short in heads else raw
            choice = tensor_kernel(kind, "linear", library, why_not)
            if choice.value != "dense" and raw.shape[0] % blocks.ROW_MULTIPLE:
                choice = Choice("dense", f"{raw.shape[0]} outputs: not whole blocks of {blocks.ROW_MULTIPLE}")
            made = blocks._block_linear(kind, raw, choice, library, tensor) if choice.value != "dense" else choice
            bias = None
            if linear.bias is not None:  # qwen2's q, k and v
                bias_name = f"blk.{index}.{short}.bias"
                _fits(f"model.layers.{index}.{module_path}.bias", bias_name, tensors, tuple(linear.bias.shape))
                bias = dense(tensors.get(bias_name)[1], tensors.kind(bias_name), tuple(linear.bias.shape), dtype)
            if isinstance(made, Choice):
                choice = made
                _set(layer, f"{module_path}.weight", dense(raw, kind, tuple(linear.weight.shape), dtype))
                if bias is not None:
                    _set(layer, f"{module_path}.bias", bias)
            else:
                parent, _, leaf = module_path.rpartition(".")
                setattr(layer.get_submodule(parent), leaf, made if bias is None else BiasedLinear(made, bias))
            blocks._merged(choices, module_path.rpartition(".")[2], choice)
            blocks._merged(types, kind, choice)
            names.setdefault(kind, []).append(tensor)
            del raw, made
        release_free_memory()  # the heap's share of the layer's intermediates, before the next layer's
    by_type = tuple((kind, blocks._named(choice, names[kind])) for kind, choice in sorted(types.items()))
    return choices, by_type


def _others(model: nn.Module, tensors: FileTensors, dtype: torch.dtype, head: Q8Head | None) -> None:
    """Phase 4: the norms, an untied head and the embedding, dequantized (the embedding the rows of the q8 / q6k
    `head` where there is one); nothing left on the meta device."""
    from_head = head is not None and head.kernel.KIND in ("q8", "q6k")
    if from_head:
        wanted = tuple(model.get_input_embeddings().weight.shape)
        _fits("model.embed_tokens.weight", "token_embd.weight", tensors, wanted)
        embedding = HeadRowsEmbedding(head, dtype)
        model.set_input_embeddings(embedding)
        model.set_output_embeddings(TiedHead(embedding))
    for index in range(model.config.num_hidden_layers):
        for gguf_name, torch_name in TENSORS.items():
            if "{i}" not in gguf_name and index:
                continue
            gguf_name, torch_name = gguf_name.format(i=index), torch_name.format(i=index)
            if gguf_name not in tensors or (from_head and gguf_name == "token_embd.weight"):
                continue
            shape = tuple(model.get_parameter(torch_name).shape)
            _fits(torch_name, gguf_name, tensors, shape)
            chunks, rows = tensors.chunks(gguf_name, ROW_CHUNK), tensors.rows(gguf_name)
            _set(model, torch_name, dense_chunks(chunks, tensors.kind(gguf_name), rows, shape, dtype))
    if not from_head and (model.config.tie_word_embeddings or "output.weight" not in tensors):
        model.lm_head.weight = model.model.embed_tokens.weight
    left = [name for name, param in model.named_parameters() if param.is_meta]
    if left:
        listed = ", ".join(left[:3]) + (f", … ({len(left)} in all)" if len(left) > 3 else "")
        raise ConfigError(f"{shown(tensors.path.name)}: the file holds no tensor for {listed}")


def build_from_file(path: Path, folder: str, dtype: torch.dtype, load: LibraryLoad | None) -> nn.Module:
    """A llama, qwen2 or qwen3 GGUF's model from the config of `folder` (the file itself: its header's;
    loading.load_config) and the file's tensors (phases: the module's doc)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from .loading import load_config

    tensors = FileTensors(path)
    if tensors.architecture not in ARCHITECTURES:
        raise ConfigError(
            f"{path.name}: quant gguf runs {', '.join(ARCHITECTURES)} GGUF files; this one is "
            f"{tensors.architecture!r} (quant none loads it dequantized, through transformers)"
        )
    library = load.library if load is not None else None
    why_not = load.reason if load is not None else "not offered"
    config = load_config(folder)
    with init_empty_weights(include_buffers=False):  # 1. modules without weights
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.name_or_path = folder
    with load_allocations(), tensors:  # each tensor's intermediates returned to the system when freed; one open
        choices, by_type = _linears(model, tensors, library, why_not, dtype)  # 2.
        head = blocks.q8_head(model, tensors, library, why_not)  # 3.
        _others(model, tensors, dtype, head)  # 4.
    linears = tuple(choices.items())
    if all(choice.value == "dense" for _, choice in linears):
        kinds = ", ".join(f"{kind} ({choice.value})" for kind, choice in by_type) or "none"
        raise ConfigError(f"{path.name}: no linear runs on a block kernel here; its linears' types: {kinds}")
    record_load(model, LoadRecord(library, linears, head, by_type))
    return model
