"""GPU memory around a model switch: whether the old pair must go before the new one loads, and freeing it."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from localspec.config import PairSpec

# bytes in memory per byte on disk, by quantization (weights stored in 16 bits: nf4 keeps ~0.3 of them, int8 ~0.55)
_QUANT_SHARE = {"none": 1.0, "nf4": 0.3, "int8": 0.55}
HEADROOM = 1.2  # activations, KV cache and the allocator's slack on top of the weights


def weights_on_disk(source: str) -> int:
    """Bytes of a local model folder's weight files (0 when the source is not a local folder)."""
    folder = Path(source)
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern))


def estimated_bytes(pair: PairSpec) -> int:
    """What loading `pair` will take on the GPU, from its files; 0 when unknown (a hub id)."""
    total = weights_on_disk(pair.target.source) * _QUANT_SHARE.get(pair.target.quant, 1.0)
    if pair.draft is not None:
        total += weights_on_disk(pair.draft.source)
    return int(total * HEADROOM)


def must_free_first(new: PairSpec) -> bool:
    """True on a CUDA machine when the free memory cannot hold the new pair next to the old one. An unknown size
    (a hub id) is taken to be as large as what is allocated now (the old pair)."""
    if not torch.cuda.is_available():
        return False
    free, _total = torch.cuda.mem_get_info()
    need = estimated_bytes(new) or int(torch.cuda.memory_allocated() * HEADROOM)
    return free < need


def release_models() -> None:
    """After the last reference to a pair is dropped: caches keyed by the model, the garbage, the CUDA cache."""
    from localspec.proposers.head import clear_head_cache

    clear_head_cache()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
