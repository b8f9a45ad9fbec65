"""Measured-once decisions kept in the data folder's cache (dtype: auto, exact: auto): one JSON file per kind,
{"version": N, "decisions": {key: decision dict}}. A file that is missing, unreadable or of another version reads
as empty (the decision is measured again and the file rewritten); a read-only folder only means measuring again."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .paths import cache_dir


def cache_path(file_name: str) -> Path:
    return cache_dir() / file_name


def read_decisions(file_name: str, version: int) -> dict:
    """{key: decision dict}; {} when there is no usable file."""
    try:
        data = json.loads(cache_path(file_name).read_text(encoding="utf-8"))
        if data.get("version") != version or not isinstance(data.get("decisions"), dict):
            return {}
        return data["decisions"]
    except (OSError, ValueError, AttributeError):
        return {}


def write_decision(file_name: str, version: int, key: str, decision: dict) -> None:
    decisions = read_decisions(file_name, version)
    decisions[key] = decision
    path = cache_path(file_name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": version, "decisions": decisions}, indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a read-only data folder: the next load measures again
