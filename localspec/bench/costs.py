"""What a forward must read and how fast the machine reads it: weight bytes per token and memory bandwidth, for the
bench's bytes-read bound (docs/performance.md)."""

from __future__ import annotations

import statistics
import time

import torch

BANDWIDTH_BYTES = 512 * 2**20  # a bf16 sum over this many bytes


def bandwidth_gbs(repeats: int = 7) -> float:
    """GB/s of a bf16 sum over BANDWIDTH_BYTES (median of repeats, after one untimed pass)."""
    data = torch.ones(BANDWIDTH_BYTES // 2, dtype=torch.bfloat16)
    data.sum()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - started)
    return BANDWIDTH_BYTES / statistics.median(times) / 1e9


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a 1-token forward reads from weights: every linear's (dense, an Int4Linear's packed codes and
    scales/zeros, a Q8Linear's int8 codes and scales) and the LM head's (an attached Q8Head's codes and scales in
    place of the dense head); the embedding is a one-row gather and is left out."""
    from localspec.runtime.int4_linear import Int4Linear
    from localspec.runtime.plan import load_record
    from localspec.runtime.q8_head import Q8Head

    head = load_record(model).head
    dense_head = model.get_output_embeddings() if head is not None else None
    total = 0 if head is None else _nbytes(head.codes, head.scales)
    for module in model.modules():
        if module is dense_head or module is head:
            continue
        if isinstance(module, Int4Linear):
            total += _nbytes(module.packed, module.scales_zeros)
        elif isinstance(module, Q8Head):  # Q8Linear: a decoder linear on the q8 / q8k kernel
            total += _nbytes(module.codes, module.scales)
        elif isinstance(module, torch.nn.Linear):
            total += _nbytes(module.weight)
    return total


def forward_bound(model: torch.nn.Module) -> dict[str, float]:
    """{"weight_mb", "bandwidth_gbs", "bound_ms"}: the 1-token forward no kernel can beat here."""
    nbytes, gbs = weight_bytes(model), bandwidth_gbs()
    return {"weight_mb": nbytes / 1e6, "bandwidth_gbs": gbs, "bound_ms": nbytes / (gbs * 1e9) * 1e3}
