"""The models already on this machine: GGUF files of LM Studio, Ollama and llama.cpp, and Hugging Face snapshots.

Words: a *root* is a folder another app keeps its models in (`Root`: its layout and path); a *found model* is one
model file or snapshot folder read from a root, with what its header says (`FoundModel`); a *proposed pair* is a
found target with, where one fits, a smaller found draft whose tokenizer maps every one of its token ids to the same
token as the target's (`ProposedPair`).

Discovery only reads: it never moves, copies or writes a file it finds. It reads headers, never weights: a GGUF's
key-value section and tensor table (gguf.GGUFReader memory-maps the file and parses only those), a snapshot's
config.json and tokenizer.json. Every file is hostile input (untrusted.py): only regular files are opened, every
read is bounded in bytes, depth and count before it allocates, and a name that is not UTF-8 is shown escaped while its
path stays usable. Every failure (a corrupt file, a FIFO, an unreadable folder, a symlink loop, a manifest that names
a missing blob) becomes a `Skipped` record with its reason; one model failing never stops the others, and nothing
raises out of `discover`.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

from .gguf_header import GGUFHeader, read_header
from .untrusted import (
    CONFIG_BYTES,
    MANIFEST_BYTES,
    MAX_VOCAB,
    TOKENIZER_BYTES,
    HostileFile,
    kind_of,
    label,
    read_json,
    shown,
)

Layout = Literal["lmstudio", "ollama", "llama.cpp", "huggingface"]
Format = Literal["gguf", "transformers"]

MAX_DEPTH = 6  # folders below a root that are searched (LM Studio: publisher/repo/file; HF: models--x/snapshots/rev)
MAX_FILES = 20_000  # entries looked at per root, so a huge or looping tree ends quickly
OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"


@dataclass(frozen=True)
class Root:
    layout: Layout
    path: Path


@dataclass(frozen=True)
class FoundModel:
    """One model on disk, as its header describes it."""

    name: str  # what the user would call it: the file's stem, the Ollama name:tag, the hub id
    path: Path  # the GGUF file, or the snapshot folder (transformers format)
    layout: Layout
    format: Format
    size_bytes: int
    architecture: str  # general.architecture / config.json model_type
    quantization: str  # the GGUF file type (e.g. MOSTLY_Q4_1 → Q4_1), or the snapshot's dtype / quantization method
    parameters: int  # weights counted from the tensor table (GGUF) or estimated from the file sizes (snapshot)
    tokens: tuple[str, ...] = field(repr=False)  # the vocabulary by id; empty when it could not be read
    loadable: Optional[str] = None  # None: localspec can load it; else why not, in words

    @property
    def source(self) -> str:
        """What a models.yaml entry's `source` says for it."""
        return str(self.path)


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


@dataclass(frozen=True)
class Discovery:
    models: tuple[FoundModel, ...]
    skipped: tuple[Skipped, ...]
    roots: tuple[Root, ...]


@dataclass(frozen=True)
class ProposedPair:
    target: FoundModel
    draft: Optional[FoundModel]  # None: the pair speculates with the n-gram lookup only

    @property
    def name(self) -> str:
        return self.target.name if self.draft is None else f"{self.target.name} + {self.draft.name}"


def human_size(n: int) -> str:
    """A file size as people read it: 812 B, 91.4 MB, 4.7 GB (powers of 1000, as file managers show them)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def default_roots(home: Optional[Path] = None) -> tuple[Root, ...]:
    """Where LM Studio, Ollama, llama.cpp and the Hugging Face cache keep models for the user `home` (default: ~).
    OLLAMA_MODELS, LLAMA_CACHE and HF_HUB_CACHE / HF_HOME move theirs, as those apps read them."""
    home = Path.home() if home is None else home
    env = os.environ
    hf_hub = Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else None
    if hf_hub is None:
        hf_hub = (Path(env["HF_HOME"]) if env.get("HF_HOME") else home / ".cache" / "huggingface") / "hub"
    return (
        Root("lmstudio", home / ".lmstudio" / "models"),
        Root("lmstudio", home / ".cache" / "lm-studio" / "models"),
        Root("ollama", Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"),
        Root("llama.cpp", Path(env["LLAMA_CACHE"]) if env.get("LLAMA_CACHE") else home / ".cache" / "llama.cpp"),
        Root("huggingface", hf_hub),
    )


def discover(roots: Optional[tuple[Root, ...]] = None) -> Discovery:
    """Every model found under the roots (default_roots() when None), largest first, each file once."""
    roots = default_roots() if roots is None else roots
    models: list[FoundModel] = []
    skipped: list[Skipped] = []
    seen: set[Path] = set()
    for root in roots:
        if not root.path.is_dir():
            continue
        for layout, path, name in _candidates(root, skipped):
            try:
                real = path.resolve()
            except (OSError, RuntimeError) as exc:  # a symlink loop, a vanished file
                skipped.append(Skipped(path, f"cannot be resolved: {shown(str(exc))}"))
                continue
            if real in seen:
                continue
            seen.add(real)
            try:
                mode = os.stat(path).st_mode
                if stat.S_ISREG(mode):
                    found = read_gguf(path, layout, name)
                elif stat.S_ISDIR(mode):
                    found = read_snapshot(path, layout, name)
                else:
                    raise HostileFile(f"{shown(path)} is {kind_of(mode)}, not a model file; not opened")
            except HostileFile as exc:
                skipped.append(Skipped(path, str(exc)[:300]))
                continue
            except Exception as exc:  # a corrupt header must not end the scan
                skipped.append(Skipped(path, f"not readable as a model: {type(exc).__name__}: {shown(str(exc))}"[:300]))
                continue
            models.append(found)
    models.sort(key=lambda m: (-m.parameters, m.name))
    return Discovery(tuple(models), tuple(skipped), tuple(roots))


def _walk(root: Path, skipped: list[Skipped]) -> Iterator[tuple[Path, list[str], list[str]]]:
    """os.walk without following folder symlinks (no loops), depth- and count-bounded, unreadable folders noted."""
    count = 0

    def noted(exc: OSError) -> None:
        skipped.append(Skipped(Path(exc.filename or root), f"folder not readable: {shown(exc.strerror or str(exc))}"))

    for folder, dirs, files in os.walk(root, followlinks=False, onerror=noted):
        depth = len(Path(folder).relative_to(root).parts)
        if depth >= MAX_DEPTH:
            dirs[:] = []
        count += len(dirs) + len(files)
        yield Path(folder), dirs, files
        if count > MAX_FILES:
            skipped.append(Skipped(root, f"stopped after {MAX_FILES} entries"))
            return


def _candidates(root: Root, skipped: list[Skipped]) -> Iterator[tuple[Layout, Path, str]]:
    if root.layout == "ollama":
        yield from _ollama(root, skipped)
        return
    for folder, _dirs, files in _walk(root.path, skipped):
        if root.layout == "huggingface" and "config.json" in files and folder.parent.name == "snapshots":
            yield root.layout, folder, _hub_id(folder)
        for name in sorted(files):
            if name.lower().endswith(".gguf") and not _is_split_tail(name):
                path = folder / name
                if root.layout == "huggingface":
                    yield root.layout, path, f"{_hub_id(folder)}/{label(name)}"
                else:  # a stem of spaces names the file by its whole name
                    yield root.layout, path, label(Path(name).stem, name)


def _is_split_tail(name: str) -> bool:
    """A split GGUF's later parts (…-00002-of-00003.gguf): the first part names the model."""
    stem = name[: -len(".gguf")]
    parts = stem.rsplit("-", 3)
    return len(parts) == 4 and parts[2] == "of" and parts[1].isdigit() and int(parts[1]) > 1


def _hub_id(folder: Path) -> str:
    """models--owner--name/snapshots/<rev> → owner/name."""
    for part in folder.parts:
        if part.startswith("models--"):
            return label(part[len("models--") :].replace("--", "/"), part)
    return label(folder.name) or "snapshot"


def _ollama(root: Root, skipped: list[Skipped]) -> Iterator[tuple[Layout, Path, str]]:
    """manifests/<registry>/<namespace>/<model>/<tag> are JSON naming layers; the model layer's digest
    sha256:<hex> is the GGUF file blobs/sha256-<hex>."""
    manifests = root.path / "manifests"
    if not manifests.is_dir():
        return
    for folder, _dirs, files in _walk(manifests, skipped):
        for tag in sorted(files):
            manifest = folder / tag
            try:
                digest = _model_digest(read_json(manifest, MANIFEST_BYTES))
            except (OSError, ValueError) as exc:  # not a regular file, too large or deep, not JSON, no model layer
                why = f"not an Ollama manifest with a model layer ({shown(str(exc))})"
                skipped.append(Skipped(manifest, why[:300]))
                continue
            blob = root.path / "blobs" / digest.replace(":", "-")
            if not blob.is_file():
                skipped.append(Skipped(manifest, f"its model layer {shown(digest)} has no blob at {shown(blob)}"))
                continue
            model, namespace, version = (label(part) or "?" for part in (folder.name, folder.parent.name, tag))
            name = f"{model}:{version}" if namespace == "library" else f"{namespace}/{model}:{version}"
            yield "ollama", blob, name


def _model_digest(manifest: object) -> str:
    """The digest of a manifest's model layer (sha256:<hex>); ValueError when it has none."""
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    for layer in layers if isinstance(layers, list) else ():
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_MEDIA:
            digest = layer.get("digest")
            if isinstance(digest, str) and digest and "/" not in digest and "\0" not in digest:
                return digest
    raise ValueError("no model layer")


def read_gguf(path: Path, layout: Layout, name: str) -> FoundModel:
    """A GGUF file's header: architecture, file type, vocabulary, weight count (the weights are not read)."""
    header = read_header(path)
    fields = header.fields
    architecture = shown(str(fields.get("general.architecture", "unknown")))[:100]
    file_type = fields.get("general.file_type")
    quantization = _file_type_name(file_type) if isinstance(file_type, int) else _majority_type(header)
    tokens = tuple(fields.get("tokenizer.ggml.tokens") or ())
    return FoundModel(
        name=name,
        path=path,
        layout=layout,
        format="gguf",
        size_bytes=path.stat().st_size,
        architecture=architecture,
        quantization=quantization,
        parameters=sum(t.n_elements for t in header.tensors),
        tokens=tokens,
        loadable=gguf_loadable(architecture, header, tokens),
    )


def _type_name(type_id: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"


def _file_type_name(file_type: int) -> str:
    import gguf

    try:
        return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"file type {file_type}"


def _majority_type(header: GGUFHeader) -> str:
    counts: dict[str, int] = {}
    for tensor in header.tensors:
        name = _type_name(tensor.type_id)
        counts[name] = counts.get(name, 0) + tensor.n_elements
    return max(counts, key=counts.get) if counts else "unknown"


def gguf_loadable(architecture: str, header: GGUFHeader, tokens: tuple[str, ...]) -> Optional[str]:
    """None when transformers' GGUF loader (what localspec converts with) takes the architecture and gguf can
    dequantize every tensor type; else the reason."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        return f"architecture {architecture!r} is not one transformers' GGUF loader supports"
    if not tokens:
        return "it has no tokenizer (tokenizer.ggml.tokens)"
    plain = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}
    readable = plain | set(gguf.quants._type_traits)  # the block types gguf.quants.dequantize implements
    unreadable = [t for t in header.tensors if t.type_id not in readable]
    if unreadable:
        kinds = ", ".join(sorted({_type_name(t.type_id) for t in unreadable}))
        first = shown(unreadable[0].name)
        return f"tensor type(s) {kinds} cannot be dequantized here (tensor {first}: {len(unreadable)} in all)"
    return header.truncated()


def read_snapshot(folder: Path, layout: Layout, name: str) -> FoundModel:
    """A transformers snapshot folder: config.json's model type and dtype, tokenizer.json's vocabulary."""
    config = read_json(folder / "config.json", CONFIG_BYTES)
    if not isinstance(config, dict):
        raise ValueError("config.json is not an object")
    listed = itertools.islice(folder.iterdir(), MAX_FILES)
    weights = [p for p in listed if p.suffix in (".safetensors", ".bin") and p.is_file()]
    size = sum(p.stat().st_size for p in weights)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    quantization = config.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    bytes_per_weight = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 2)
    declared = config.get("vocab_size")
    tokens, why = _snapshot_tokens(folder, declared if isinstance(declared, int) and declared > 0 else 0)
    loadable = None if weights else "no .safetensors or .bin weights in the snapshot"
    if loadable is None and not tokens:
        loadable = why
    return FoundModel(
        name=name,
        path=folder,
        layout=layout,
        format="transformers",
        size_bytes=size,
        architecture=shown(str(config.get("model_type", "unknown")))[:100],
        quantization=shown(str(method or dtype))[:100],
        parameters=size // bytes_per_weight,
        tokens=tokens,
        loadable=loadable,
    )


def _snapshot_tokens(folder: Path, declared: int) -> tuple[tuple[str, ...], str]:
    """tokenizer.json's tokens by id, or () and why not. Ids are checked against the vocabulary's size (its entries,
    or config.json's vocab_size when larger, at most MAX_VOCAB) before a list of that length is made."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return (), "no readable tokenizer.json"
    try:
        data = read_json(path, TOKENIZER_BYTES)
    except (OSError, ValueError) as exc:
        return (), f"tokenizer.json not read: {shown(str(exc))}"[:300]
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict):
        return (), "tokenizer.json has no token → id vocabulary"
    entries = dict(vocab)
    added = data.get("added_tokens")
    for token in added if isinstance(added, list) else ():
        if isinstance(token, dict) and isinstance(token.get("content"), str):
            entries[token["content"]] = token.get("id")
    if not entries or not all(type(i) is int and i >= 0 for i in entries.values()):
        return (), "tokenizer.json's ids are not all whole numbers ≥ 0"
    size = min(max(len(entries), declared), MAX_VOCAB)
    token, top = max(entries.items(), key=lambda item: item[1])
    if top >= size:
        return (), (
            f"tokenizer.json gives {shown(token)[:40]!r} the id {top}, beyond its vocabulary of {len(entries)} "
            f"tokens (config.json vocab_size {declared or 'absent'}, at most {MAX_VOCAB})"
        )
    by_id = [""] * (top + 1)
    for token, index in entries.items():
        by_id[index] = token
    return tuple(by_id), ""


def same_tokenizer(target: FoundModel, draft: FoundModel) -> bool:
    """The loader's rule (models/loading.py check_same_tokenizer), on the headers: every draft id means the same
    token as in the target; the draft's vocabulary may be a prefix of the target's."""
    if not draft.tokens or len(draft.tokens) > len(target.tokens):
        return False
    return target.tokens[: len(draft.tokens)] == draft.tokens


def vocabulary_fingerprint(model: FoundModel) -> str:
    return hashlib.sha256("\0".join(model.tokens).encode("utf-8", "surrogatepass")).hexdigest()[:12]


def propose_pairs(models: tuple[FoundModel, ...], max_draft_share: float = 0.5) -> list[ProposedPair]:
    """Each loadable model as a target, largest first, with the largest loadable draft of at most `max_draft_share`
    of its weights whose tokenizer matches (a draft that costs more than half the target cannot pay for itself);
    without one, the pair still speculates with the n-gram lookup."""
    usable = [m for m in models if m.loadable is None]
    pairs = []
    for target in sorted(usable, key=lambda m: -m.parameters):
        drafts = [
            m
            for m in usable
            if m is not target and m.parameters <= max_draft_share * target.parameters and same_tokenizer(target, m)
        ]
        pairs.append(ProposedPair(target, max(drafts, key=lambda m: m.parameters) if drafts else None))
    return pairs
