"""Small GGUF files made on the spot (localspec/bench/shaped_gguf.py: random llama weights, the embedded SmolLM2's
real tokenizer), in the layouts LM Studio, Ollama, llama.cpp and the Hugging Face cache keep them in."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from localspec.bench.shaped_gguf import embedded_tokenizer, quantized, random_k_blocks, write_gguf  # noqa: F401


def lmstudio_model(home: Path, publisher: str, repo: str, filename: str, **kwargs) -> Path:
    return write_gguf(home / ".lmstudio" / "models" / publisher / repo / filename, **kwargs)


def llamacpp_model(home: Path, filename: str, **kwargs) -> Path:
    return write_gguf(home / ".cache" / "llama.cpp" / filename, **kwargs)


def ollama_model(home: Path, model: str, tag: str, **kwargs) -> Path:
    """manifests/registry.ollama.ai/library/<model>/<tag> naming blobs/sha256-<hex> (the GGUF, no suffix)."""
    root = home / ".ollama" / "models"
    staging = write_gguf(root / "staging.gguf", **kwargs)
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(blob)
    manifest = {
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64},
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": f"sha256:{digest}",
                "size": blob.stat().st_size,
            },
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 10},
        ],
    }
    path = root / "manifests" / "registry.ollama.ai" / "library" / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def huggingface_gguf(home: Path, repo_id: str, filename: str, **kwargs) -> Path:
    """models--owner--name/snapshots/<rev>/<file> as a symlink into blobs/, as huggingface_hub stores it."""
    repo = home / ".cache" / "huggingface" / "hub" / ("models--" + repo_id.replace("/", "--"))
    blob = write_gguf(repo / "blobs" / "tmp", **kwargs)
    digest = hashlib.sha256(blob.read_bytes()).hexdigest()
    blob = blob.rename(blob.with_name(digest))
    link = repo / "snapshots" / "0123abcd" / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("..") / ".." / "blobs" / digest)
    return link
