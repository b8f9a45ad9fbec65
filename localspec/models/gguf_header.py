"""A GGUF file's header read without its weights: the key-value section and the tensor table.

gguf.GGUFReader builds an array view for every element of every field (SmolLM2's 49k tokens and 49k merges take
seconds); discovery needs a few scalars, the token list and the tensor types, so this reads the header in one pass
with struct over a memory map, decoding only the strings it is asked for. Every size is checked against the file,
so a truncated or garbage file raises ValueError instead of reading past its end.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_COUNT = 1 << 28  # no real header holds more elements in one array or tensors in one file


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int  # gguf.GGMLQuantizationType value

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    fields: dict[str, Any]  # scalars and strings as values; arrays of strings only for the keys asked for
    tensors: tuple[TensorInfo, ...]


class _Cursor:
    """Reads forward through the mapped file; slices are copies, so no view outlives the map."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"the header runs past the end of the file (at byte {self.pos})")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self) -> int:
        n = self.unpack("<Q")
        if n > MAX_COUNT:
            raise ValueError(f"implausible element count {n} at byte {self.pos}")
        return n

    def string(self, decode: bool = True) -> str | None:
        raw = self.take(self.count())
        return raw.decode("utf-8", errors="replace") if decode else None

    def value(self, type_id: int, keep: bool) -> Any:
        if type_id in _SCALARS:
            return self.unpack(_SCALARS[type_id])
        if type_id == _STRING:
            return self.string(keep)
        if type_id == _ARRAY:
            elem, n = self.unpack("<I"), self.count()
            if elem in _SCALARS and not keep:  # skipped whole
                self.take(n * struct.calcsize(_SCALARS[elem]))
                return None
            values = [self.value(elem, keep) for _ in range(n)]
            return values if keep else None
        raise ValueError(f"unknown GGUF value type {type_id} at byte {self.pos}")


def read_header(path: Path, arrays: frozenset[str] = frozenset({"tokenizer.ggml.tokens"})) -> GGUFHeader:
    """The header of the GGUF file at `path`; array fields other than `arrays` are skipped (not decoded)."""
    with path.open("rb") as fh:
        if fh.read(4) != MAGIC:
            raise ValueError("not a GGUF file (no 'GGUF' magic)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return _parse(_Cursor(mapped), arrays)


def _parse(cur: _Cursor, arrays: frozenset[str]) -> GGUFHeader:
    cur.take(4)
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not one this reader knows (2, 3)")
    n_tensors, n_fields = cur.count(), cur.count()
    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        key = cur.string()
        type_id = cur.unpack("<I")
        keep = type_id != _ARRAY or key in arrays
        value = cur.value(type_id, keep)
        if keep:
            fields[key] = value
    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = cur.unpack("<I")
        if dims > 8:
            raise ValueError(f"tensor {name!r} claims {dims} dimensions")
        shape = tuple(cur.unpack("<Q") for _ in range(dims))
        type_id = cur.unpack("<I")
        cur.unpack("<Q")  # offset into the data section
        tensors.append(TensorInfo(name, shape, type_id))
    return GGUFHeader(version, fields, tuple(tensors))
