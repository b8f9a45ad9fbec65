"""A GGUF file's header read without its weights: the key-value section and the tensor table.

gguf.GGUFReader builds an array view for every element of every field (SmolLM2's 49k tokens and 49k merges take
seconds); discovery needs a few scalars, the token list and the tensor types, so this reads the header in one pass
with struct over a memory map, decoding only the strings it is asked for. Every size is checked against the file,
so a truncated or garbage file raises ValueError instead of reading past its end, and every count is checked before
anything is allocated for it: against what the rest of the file can hold (each element takes at least its smallest
encoding) and against what a real model has (a sparse file of zeros holds millions of well-formed empty tensors).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .untrusted import MAX_VOCAB, open_regular, shown

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_TENSORS = 1 << 17  # real files: ~300 (7B) to ~13,000 (a MoE with its experts stored one by one)
MAX_FIELDS = 1 << 16  # real files: ~40 keys
MAX_ARRAY = 1 << 20  # elements in one array: the largest real ones (merges, tokens) hold ~500k
MAX_NESTING = 3  # arrays of arrays: real files have none
# the fewest bytes one element takes: a string is its 8-byte length, an array its 4-byte type and 8-byte count, a
# field its key (8), type (4) and a 1-byte value, a tensor's info its name (8), dims (4), type (4) and offset (8)
_MIN_STRING, _MIN_ARRAY, _MIN_FIELD, _MIN_TENSOR = 8, 12, 13, 24


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int  # gguf.GGMLQuantizationType value
    offset: int = 0  # of its data, from the start of the data section

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
    data_start: int = 0  # the data section's first byte (after the tensor table, aligned)
    file_size: int = 0

    def truncated(self) -> str | None:
        """The first tensor whose data runs past the end of the file, in words (None: all are inside it)."""
        import gguf

        for tensor in self.tensors:
            try:
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor.type_id)]
            except (KeyError, ValueError):
                continue  # an unknown type: gguf_loadable names it
            end = self.data_start + tensor.offset + tensor.n_elements // block * size
            if end > self.file_size:
                return f"tensor {shown(tensor.name)}: its data runs to byte {end}, the file ends at {self.file_size}"
        return None


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

    def count(self, what: str, each: int, most: int) -> int:
        """A count read from the file, refused unless the rest of the file can hold that many elements of at least
        `each` bytes and it is at most `most`."""
        at = self.pos
        n = self.unpack("<Q")
        room = (len(self.buf) - self.pos) // each
        if n > room:
            raise ValueError(f"the header claims {n} {what} at byte {at}, past the end of the file (room for {room})")
        if n > most:
            raise ValueError(f"the header claims {n} {what} at byte {at}, more than the {most} a model has")
        return n

    def string(self, decode: bool = True) -> str | None:
        raw = self.take(self.count("bytes of text", 1, len(self.buf)))
        return raw.decode("utf-8", errors="replace") if decode else None

    def value(self, type_id: int, keep: bool, nesting: int = 0) -> Any:
        if type_id in _SCALARS:
            return self.unpack(_SCALARS[type_id])
        if type_id == _STRING:
            return self.string(keep)
        if type_id == _ARRAY:
            if nesting >= MAX_NESTING:
                raise ValueError(f"arrays nest more than {MAX_NESTING} deep at byte {self.pos}")
            elem = self.unpack("<I")
            each = _MIN_STRING if elem == _STRING else _MIN_ARRAY
            if elem in _SCALARS:
                each = struct.calcsize(_SCALARS[elem])
            n = self.count("array elements", each, MAX_VOCAB if keep else MAX_ARRAY)
            if elem in _SCALARS and not keep:  # skipped whole
                self.take(n * each)
                return None
            if not keep:
                for _ in range(n):
                    self.value(elem, False, nesting + 1)
                return None
            return [self.value(elem, True, nesting + 1) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {type_id} at byte {self.pos}")


_RECENT: dict[tuple, tuple[frozenset[str], GGUFHeader]] = {}  # the last headers read, by the file's identity
RECENT = 4


def read_header(path: Path, arrays: frozenset[str] = frozenset({"tokenizer.ggml.tokens"})) -> GGUFHeader:
    """The header of the GGUF file at `path`; array fields other than `arrays` are skipped (not decoded). A load
    asks for it several times (its quant, its checks, its config, its tensors): the last RECENT files' headers are
    kept by the file's identity (device, inode, size, modification time), so one load parses a header once, and an
    ask for arrays it did not decode parses it again with those added."""
    with open_regular(path) as fh:
        stat = os.fstat(fh.fileno())
        key = (os.fspath(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        kept = _RECENT.get(key)
        if kept is not None and arrays <= kept[0]:
            return kept[1]
        wanted = arrays | kept[0] if kept is not None else arrays
        if fh.read(4) != MAGIC:
            raise ValueError("not a GGUF file (no 'GGUF' magic)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            header = _parse(_Cursor(mapped), wanted)
    _RECENT.pop(key, None)
    _RECENT[key] = (wanted, header)
    while len(_RECENT) > RECENT:
        del _RECENT[next(iter(_RECENT))]
    return header


def forget() -> None:
    """Drop the kept headers: a load calls this when it is done with them (their token and merge lists are MBs of
    Python strings, tens of MB for a 152k-token vocabulary, that the loaded tokenizer holds in its own form)."""
    _RECENT.clear()


def _aligned(position: int, alignment: Any) -> int:
    step = alignment if isinstance(alignment, int) and 0 < alignment <= 1 << 20 else 32  # general.alignment
    return -(-position // step) * step


def _parse(cur: _Cursor, arrays: frozenset[str]) -> GGUFHeader:
    cur.take(4)
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not one this reader knows (2, 3)")
    n_tensors = cur.count("tensors", _MIN_TENSOR, MAX_TENSORS)
    n_fields = cur.count("key-value fields", _MIN_FIELD, MAX_FIELDS)
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
        offset = cur.unpack("<Q")  # into the data section
        tensors.append(TensorInfo(name, shape, type_id, offset))
    start = _aligned(cur.pos, fields.get("general.alignment"))
    return GGUFHeader(version, fields, tuple(tensors), start, len(cur.buf))
