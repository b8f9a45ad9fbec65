"""models.yaml → PairSpec list, with errors that name the entry and the field."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localspec.config import (
    DEFAULT_K,
    DTYPES,
    K_MAX,
    K_MIN,
    NGRAM_MAX_N,
    NGRAM_MIN_N,
    NGRAM_N_MAX,
    QUANTS,
    ConfigError,
    ModelSpec,
    NgramSpec,
    PairSpec,
    check_ngram_sizes,
    check_tree_nodes,
    shown,
    whole_number,
)

PAIR_KEYS = {"name", "target", "proposers", "default_proposer", "k", "adaptive", "tree_nodes", "exact", "description"}
MODEL_KEYS = {"source", "quant", "dtype", "trust_remote_code", "device_map"}
DRAFT_KEYS = {"source", "dtype", "trust_remote_code", "device_map"}
NGRAM_KEYS = {"min_n", "max_n"}
PROPOSER_KEYS = {"ngram", "draft", "head"}
GGUF_PREFIX = "gguf-package:"
MAX_EXPANDED_NODES = 100_000  # YAML nodes the file may stand for once every alias is expanded (models.yaml: ~20 each)


def _where(index: int, name: str | None) -> str:
    return f"models.yaml entry {index + 1}" + (f" ({name!r})" if name else "")


def _check_keys(mapping: Any, allowed: set[str], where: str, field: str) -> dict:
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: field '{field}' must be a mapping, got {type(mapping).__name__}")
    unknown = sorted(set(mapping) - allowed, key=repr)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))} in '{field}'; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    return mapping


def _resolve_source(source: Any, base_dir: Path, where: str, field: str) -> str:
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(
            f"{where}: field '{field}.source' must be a non-empty string (a local path, a hub id, "
            f"or {GGUF_PREFIX}<package>/<file.gguf>)"
        )
    source = source.strip()
    if source.startswith(GGUF_PREFIX):
        return source
    try:
        os.fsencode(source)  # a path may hold bytes that are not UTF-8 (as surrogate escapes, the way os reads it)
        path = Path(source).expanduser()
        if path.is_absolute():
            return str(path)
        candidate = base_dir / path
        if candidate.exists() or looks_like_path(source):
            return str(candidate.resolve())
        source.encode("utf-8")  # a hub id is text
        return source
    except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, lone surrogates, ~nosuchuser, names too long
        raise ConfigError(f"{where}: field '{field}.source' is not a usable path or hub id ({exc})") from None


def looks_like_path(source: str) -> bool:
    """A hub id is 'owner/name'; anything else with a slash, or starting with . / ~, is a path."""
    if source.startswith((".", "/", "~")):
        return True
    return source.count("/") != 1


def _model(raw: Any, base_dir: Path, where: str, field: str, allowed: set[str], default_dtype: str) -> ModelSpec:
    raw = _check_keys(raw, allowed, where, field)
    if "source" not in raw:
        raise ConfigError(f"{where}: field '{field}.source' is missing")
    quant = raw.get("quant", "auto")  # auto: a GGUF's blocks on the kernels where they run them, else none
    if quant not in QUANTS:
        raise ConfigError(f"{where}: field '{field}.quant' is {shown(quant)}; choose one of {', '.join(QUANTS)}")
    dtype = raw.get("dtype", default_dtype)
    if dtype not in DTYPES:
        raise ConfigError(f"{where}: field '{field}.dtype' is {shown(dtype)}; choose one of {', '.join(DTYPES)}")
    trust = raw.get("trust_remote_code", False)
    if not isinstance(trust, bool):
        raise ConfigError(f"{where}: field '{field}.trust_remote_code' must be true or false")
    device_map = raw.get("device_map")
    if device_map is not None and (not isinstance(device_map, str) or not device_map.strip()):
        raise ConfigError(f"{where}: field '{field}.device_map' must be a string such as auto or balanced")
    return ModelSpec(
        source=_resolve_source(raw["source"], base_dir, where, field),
        quant=quant,
        dtype=dtype,
        trust_remote_code=trust,
        device_map=device_map,
    )


def _int(raw: Any, where: str, field: str, low: int, high: int) -> int:
    return whole_number(raw, f"{where}: field '{field}'", low, high)


def _text(raw: Any, where: str, field: str) -> str:
    if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
        raise ConfigError(f"{where}: field '{field}' must be text (got {shown(raw)})")
    return str(raw)


def parse_pair(raw: Any, index: int, base_dir: Path, where: str | None = None) -> PairSpec:
    """One entry; errors start with `where` (default: "models.yaml entry N (name)")."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{_where(index, None)}: each entry must be a mapping with at least 'name' and 'target'")
    name = raw.get("name")
    where = where or _where(index, name if isinstance(name, str) else None)
    _check_keys(raw, PAIR_KEYS, where, "entry")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: field 'name' is missing or empty")
    if "target" not in raw:
        raise ConfigError(f"{where}: field 'target' is missing")
    target = _model(raw["target"], base_dir, where, "target", MODEL_KEYS, "auto")
    proposers = _check_keys(raw.get("proposers") or {}, PROPOSER_KEYS, where, "proposers")
    ngram = None
    if "ngram" in proposers:
        ngram_raw = _check_keys(proposers["ngram"] or {}, NGRAM_KEYS, where, "proposers.ngram")
        min_n = _int(ngram_raw.get("min_n", NGRAM_MIN_N), where, "proposers.ngram.min_n", 1, NGRAM_N_MAX)
        max_n = _int(ngram_raw.get("max_n", NGRAM_MAX_N), where, "proposers.ngram.max_n", 1, NGRAM_N_MAX)
        check_ngram_sizes(min_n, max_n, f"{where}: field 'proposers.ngram' sizes")
        ngram = NgramSpec(min_n=min_n, max_n=max_n)
    draft = None
    if proposers.get("draft") is not None:
        draft = _model(proposers["draft"], base_dir, where, "proposers.draft", DRAFT_KEYS, "auto")
    head = None
    if proposers.get("head") is not None:
        head = _resolve_source(
            proposers["head"] if isinstance(proposers["head"], str) else None, base_dir, where, "proposers.head"
        )
    adaptive = raw.get("adaptive", False)
    if not isinstance(adaptive, bool):
        raise ConfigError(f"{where}: field 'adaptive' must be true or false")
    exact = raw.get("exact", "auto")
    if exact not in (True, False, "auto"):
        raise ConfigError(f"{where}: field 'exact' must be true, false or auto (got {shown(exact)})")
    k = _int(raw.get("k", DEFAULT_K), where, "k", K_MIN, K_MAX)
    tree_nodes = check_tree_nodes(raw.get("tree_nodes", 0), f"{where}: field 'tree_nodes'")
    pair = PairSpec(
        name=name.strip(),
        target=target,
        k=k,
        adaptive=adaptive,
        tree_nodes=tree_nodes,
        exact={True: "on", False: "off"}.get(exact, "auto"),
        ngram=ngram,
        draft=draft,
        head=head,
        description=_text(raw.get("description", ""), where, "description"),
        default_proposer=raw.get("default_proposer", "ngram" if ngram else "none"),
    )
    if pair.default_proposer not in pair.proposers:
        raise ConfigError(
            f"{where}: field 'default_proposer' is {shown(pair.default_proposer)}, but this entry only "
            f"has {', '.join(pair.proposers)}"
        )
    return pair


@dataclass(frozen=True)
class BrokenEntry:
    """A models.yaml entry that could not be read: shown as unavailable, with its error, next to the good ones."""

    index: int  # 0-based position in models.yaml
    name: str | None
    error: str

    @property
    def value(self) -> str:
        """The dropdown value standing for this entry (never a pair name)."""
        return f"unavailable:{self.index + 1}"

    @property
    def label(self) -> str:
        return f"{self.name or f'entry {self.index + 1}'}  ✗ unavailable: {self.error}"


def parse_registry(text: str, base_dir: Path, origin: str = "models.yaml") -> list[PairSpec]:
    """Every entry, or a ConfigError naming the first broken one."""
    pairs, broken = parse_registry_lenient(text, base_dir, origin)
    if broken:
        raise ConfigError(broken[0].error)
    return pairs


def parse_registry_lenient(
    text: str, base_dir: Path, origin: str = "models.yaml"
) -> tuple[list[PairSpec], list[BrokenEntry]]:
    """The entries that parse, and (entry, error) for those that do not. Raises ConfigError only when the file as a
    whole is unusable (not YAML, not a list) or no entry at all is valid."""
    data = _entries(text, origin)
    pairs: list[PairSpec] = []
    broken: list[BrokenEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(data):
        name = raw.get("name") if isinstance(raw, dict) and isinstance(raw.get("name"), str) else None
        try:
            pair = parse_pair(raw, i, base_dir)
            if pair.name in seen:
                raise ConfigError(f"{origin}: two entries are named {pair.name!r}; names must be unique")
        except ConfigError as exc:
            broken.append(BrokenEntry(i, name, str(exc)))
            continue
        seen.add(pair.name)
        pairs.append(pair)
    if not pairs:
        raise ConfigError(
            broken[0].error
            if len(broken) == 1
            else f"{origin} has no usable entry: " + "; ".join(b.error for b in broken)
        )
    return pairs, broken


class _BoundedLoader(yaml.SafeLoader):
    """safe_load that refuses a document whose aliases expand beyond MAX_EXPANDED_NODES (an "anchor bomb")."""

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None and expanded_size(node) > MAX_EXPANDED_NODES:
            raise ConfigError(
                f"{self.name} refers to its anchors (&name / *name) so often that it stands for more than "
                f"{MAX_EXPANDED_NODES} values; write the entries out instead"
            )
        return node


def expanded_size(root: yaml.Node) -> int:
    """How many nodes the document stands for with every alias written out (each shared node counted once per use;
    computed once per node, so an anchor bomb costs its size in the file, not its expansion). A node that contains
    itself counts once."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]

    def children(node: yaml.Node) -> list:
        if isinstance(node, yaml.MappingNode):
            return [part for pair in node.value for part in pair]
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []

    while stack:
        node, ready = stack.pop()
        key = id(node)
        if ready:
            sizes[key] = min(1 + sum(sizes.get(id(c), 1) for c in children(node)), MAX_EXPANDED_NODES + 1)
            continue
        if key in sizes or key in visiting:
            continue
        visiting.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in sizes)
    return sizes[id(root)]


def _entries(text: str, origin: str) -> list:
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader with a size bound)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("<unicode string>", origin)) from None
    except RecursionError:
        raise ConfigError(f"{origin} nests too deeply to be read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{origin} is not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{origin} must be a non-empty list of model pairs (entries starting with '- name:')")
    return data


def load_registry(path: str | Path) -> list[PairSpec]:
    """Strict: every entry must be valid (the CLI)."""
    pairs, broken = load_registry_lenient(path)
    if broken:
        raise ConfigError(broken[0].error)
    return pairs


def load_registry_lenient(path: str | Path) -> tuple[list[PairSpec], list[BrokenEntry]]:
    """The valid entries and the broken ones (the app: one bad entry never blocks the others)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")  # may be a pipe on purpose: --models <(...)
        base = path.parent.resolve()
    except FileNotFoundError:
        raise ConfigError(f"model list {path} not found") from None
    except (OSError, RuntimeError) as exc:  # a folder, unreadable, a symlink loop
        raise ConfigError(f"model list {path} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_registry_lenient(text, base, str(path))


def find_pair(pairs: list[PairSpec], name: str | None) -> PairSpec:
    if name is None:
        return pairs[0]
    for pair in pairs:
        if pair.name == name:
            return pair
    raise ConfigError(f"no model pair named {name!r}; models.yaml has: {', '.join(p.name for p in pairs)}")
