"""The user's own model pairs: a models.yaml in the data folder, beside the shipped one, which is never edited.

The app offers the shipped entries first (the first is the default), then the user's file, then the pairs found on
this machine (discovery.py) that neither names. A broken user entry is offered as unavailable, like a broken shipped
one; a user entry whose name a shipped one already has is refused by name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from localspec.config import ConfigError, PairSpec

from .discovery import Discovery, ProposedPair, Skipped, discover, propose_pairs
from .paths import home
from .registry import BrokenEntry, load_registry_lenient, parse_pair
from .untrusted import shown


def user_models_path() -> Path:
    return home() / "models.yaml"


def pair_entry(pair: ProposedPair) -> dict[str, Any]:
    """The models.yaml entry for a proposed pair: the draft model where one fits, the n-gram lookup always."""
    target = pair.target
    entry: dict[str, Any] = {
        "name": pair.name,
        "description": f"found on this machine ({target.layout}: {target.architecture}, {target.quantization})",
        "target": {"source": target.source},
        "proposers": {"ngram": {}},
        "default_proposer": "ngram",
        "adaptive": True,
    }
    if pair.draft is not None:
        entry["proposers"]["draft"] = {"source": pair.draft.source}
        entry["default_proposer"] = "draft"
    return entry


def file_entry(path: Path) -> dict[str, Any]:
    """The entry `--model-file PATH` answers with: that model as the target, the n-gram and history lookups."""
    return {"name": path.name, "target": {"source": str(path)}, "proposers": {"ngram": {}}, "adaptive": True}


def found_pairs(
    proposed: Sequence[ProposedPair], taken: set[str], sources: set[str], skipped: list[Skipped] | None = None
) -> list[PairSpec]:
    """The proposed pairs as PairSpecs, leaving out names already taken and targets an entry already runs. A pair
    that cannot be offered is left out too, with its reason in `skipped`: one found model never stops the others."""
    specs = []
    for i, pair in enumerate(proposed):
        if pair.name in taken or pair.target.source in sources:
            continue
        where = f"found pair {pair.name!r} ({shown(pair.target.path)})"
        try:
            spec = parse_pair(pair_entry(pair), i, pair.target.path.parent, where)
        except (ConfigError, OSError, ValueError) as exc:
            if skipped is not None:
                skipped.append(Skipped(pair.target.path, f"not offered: {shown(str(exc))}"[:300]))
            continue
        specs.append(spec)
        taken.add(spec.name)
    return specs


def user_pair_names(path: Path | None = None) -> set[str]:
    """The names the user's models.yaml gives its pairs (none when it is missing or unreadable)."""
    path = user_models_path() if path is None else path
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return set()
    return (
        {e["name"] for e in data if isinstance(e, dict) and isinstance(e.get("name"), str)}
        if isinstance(data, list)
        else set()
    )


def add_user_pair(pair: ProposedPair, path: Path | None = None) -> Path:
    """Append the pair's entry to the user's models.yaml (created when missing); refuse a name it already has."""
    path = user_models_path() if path is None else path
    entries: list = []
    if path.exists():
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        if not isinstance(data, list):
            raise ConfigError(f"{path} is not a list of model pairs; fix or move it, then add the pair again")
        entries = data
    entry = pair_entry(pair)
    if any(isinstance(e, dict) and e.get("name") == entry["name"] for e in entries):
        raise ConfigError(f"{path} already has a pair named {entry['name']!r}")
    entries.append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(entries, sort_keys=False, allow_unicode=True), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_all(
    shipped: str | Path,
    proposed: Sequence[ProposedPair] = (),
    user: Path | None = None,
    skipped: list[Skipped] | None = None,
) -> tuple[list[PairSpec], list[BrokenEntry]]:
    """Shipped entries, then the user's, then the pairs the found models make (propose_pairs); the found pairs
    that cannot be offered go to `skipped` with their reasons."""
    pairs, broken = load_registry_lenient(shipped)
    user = user_models_path() if user is None else user
    if user.exists() and Path(shipped).resolve() != user.resolve():
        offset = len(pairs) + len(broken)  # the user's entries are numbered after the shipped ones
        try:
            extra, extra_broken = load_registry_lenient(user)
        except ConfigError as exc:  # the whole user file is unusable: the shipped entries still answer
            extra, extra_broken = [], [BrokenEntry(0, None, f"{user}: {exc}")]
        broken = broken + [BrokenEntry(offset + b.index, b.name, b.error) for b in extra_broken]
        names = {p.name for p in pairs}
        duplicate_index = offset + len(extra) + len(extra_broken)  # past every numbered user entry
        for pair in extra:
            if pair.name in names:
                message = f"{user}: the shipped models.yaml already has a pair named {pair.name!r}"
                broken.append(BrokenEntry(duplicate_index, pair.name, message))
                duplicate_index += 1
                continue
            names.add(pair.name)
            pairs.append(pair)
    pairs += found_pairs(proposed, {p.name for p in pairs}, {p.target.source for p in pairs}, skipped)
    return pairs, broken


@dataclass(frozen=True)
class CatalogRead:
    pairs: list[PairSpec]
    broken: list[BrokenEntry]
    found: Discovery | None  # None: not scanned (--no-scan)
    proposed: list[ProposedPair]  # the pairs the found models make, largest first (as `localspec models` numbers)


@dataclass(frozen=True)
class Catalog:
    """Where the app's pairs come from: the shipped models.yaml, the user's, and (scan) the models on this machine.
    Read at start and again on every Rescan."""

    shipped: Path
    scan: bool = True

    def read(self) -> CatalogRead:
        found = discover() if self.scan else None
        proposed = propose_pairs(found.models) if found is not None else []  # tokenizers compared once per read
        not_offered: list[Skipped] = []
        pairs, broken = load_all(self.shipped, proposed, skipped=not_offered)
        if found is not None and not_offered:  # listed where the places that could not be read are
            found = replace(found, skipped=found.skipped + tuple(not_offered))
        return CatalogRead(pairs, broken, found, proposed)
