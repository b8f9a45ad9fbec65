"""Files and names that other apps left on this machine, read as hostile input.

A file is opened only when `os.stat` says it is a regular file (opening a FIFO blocks until a writer comes; a
device may have effects or never end), and it is opened non-blocking and checked again, so a file swapped between
the two checks cannot block either. Every read is bounded in bytes before it allocates, and JSON is parsed only
when its nesting is within MAX_JSON_DEPTH (Python's parser recurses once per bracket). A name on disk need not be
UTF-8: `shown` writes it with its undecodable bytes escaped (\\xff), so it can be printed, rendered and sent as JSON,
while the path itself keeps the original bytes and stays usable.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO, Optional

import numpy as np

MAX_JSON_DEPTH = 64  # config.json and tokenizer.json nest ~5 levels, an Ollama manifest 3
MANIFEST_BYTES = 1 << 20  # an Ollama manifest: ~1 KB
CONFIG_BYTES = 4 << 20  # a snapshot's config.json: a few KB
TOKENIZER_BYTES = 64 << 20  # a tokenizer.json: Gemma 3's, among the largest, is 33 MB
MAX_VOCAB = 1 << 20  # token ids a vocabulary may hold (the largest real ones: ~262k)

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


class HostileFile(ValueError):
    """A file discovery will not read, with the reason in words."""


def shown(text: str | os.PathLike) -> str:
    """A name from the disk as printable text: bytes that are not UTF-8 as \\xNN, control characters escaped."""
    text = os.fspath(text)
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that no byte stands for (e.g. from a JSON "\\ud800")
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def label(*candidates: str) -> Optional[str]:
    """The first candidate that still says something once shown and stripped (a model's name); None if none does."""
    for candidate in candidates:
        text = shown(candidate).strip()
        if text:
            return text
    return None


def kind_of(mode: int) -> str:
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def regular_size(path: Path) -> int:
    """The size of the regular file at `path` (links followed); HostileFile for anything else, never opened."""
    mode = os.stat(path)
    if not stat.S_ISREG(mode.st_mode):
        raise HostileFile(f"{shown(path)} is {kind_of(mode.st_mode)}, not a regular file; not opened")
    return mode.st_size


def open_regular(path: Path) -> BinaryIO:
    """The regular file at `path`, opened for reading without ever blocking on it."""
    regular_size(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise HostileFile(f"{shown(path)} is {kind_of(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: Path, limit: int) -> bytes:
    """The whole regular file, refused when it holds more than `limit` bytes (checked before reading)."""
    size = regular_size(path)
    if size > limit:
        raise HostileFile(f"{shown(path)} is {size} bytes, more than the {limit} such a file may hold; not read")
    with open_regular(path) as fh:
        data = fh.read(size + 1)  # read(n) reserves n bytes: the size the stat gave, not the limit
    if len(data) > size:  # it grew since the stat
        raise HostileFile(f"{shown(path)} grew while it was read; not read")
    return data


def json_depth(data: bytes) -> int:
    """How deeply the JSON text's arrays and objects nest (brackets inside strings do not count)."""
    structure = np.frombuffer(_JSON_STRING.sub(b"", data), dtype=np.uint8)
    opens = (structure == ord("[")) | (structure == ord("{"))
    closes = (structure == ord("]")) | (structure == ord("}"))
    return int(np.cumsum(opens.astype(np.int64) - closes, dtype=np.int64).max(initial=0))


def read_json(path: Path, limit: int) -> Any:
    """A JSON file bounded in bytes and depth before it is parsed; HostileFile (a ValueError) with the reason."""
    data = read_bounded(path, limit)
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise HostileFile(f"{shown(path)} nests {depth} levels deep, more than {MAX_JSON_DEPTH}; not parsed")
    try:
        return json.loads(data)
    except ValueError as exc:  # not JSON, not UTF-8
        raise HostileFile(f"{shown(path)} is not valid JSON: {exc}"[:300]) from None
