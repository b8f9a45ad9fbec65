"""A bfloat16 linear layer on the CPU whose weight oneDNN has reordered once into its own blocked layout.

`F.linear` on bf16 CPU tensors calls oneDNN with the weight in torch's plain [N, K] layout, and oneDNN reorders it
into its blocked layout inside every call: for the embedded model's LM head (49,152 × 576, 57 MB) that reorder is
most of the call (scripts/forward_costs.py --head measures both per machine). `torch.ops.mkldnn._reorder_linear_weight`
does the reorder once and `_linear_pointwise` runs on the result: the same oneDNN kernel on the same weights, so the
outputs are bitwise `F.linear`'s. Each layer checks that on its own weights at build time (1 and 3 rows) and stays
as it was where it is not (another dtype, a torch built without oneDNN, a kernel that rounds differently), so the
swap changes the time a forward takes and never its numbers.

The packed copy is opaque (no views, no `.to`), so it lives beside the module, never in its state: the module keeps
its weight for everything else (a tied LM head's weight is the token embedding, gathered one row per token, and a
head proposer reads the LM head's weight). So a packed layer costs its weight's bytes a second time, and a layer
over PACK_MAX_BYTES stays as it is: the LM head of a model up to ~1.5B parameters (its 49k–152k × 576–1,536 bf16
head is a large share of what a step reads) is packed, a 7B's (1 GB, a few % of its step) is not.
Whether layers are packed at all is the forward plan's choice (plan.packing: LOCALSPEC_PACKED=off keeps every layer
as it is, for timing the two against each other).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

PACKED_DTYPES = (torch.bfloat16,)  # float16 / float32: oneDNN's packed path rounds differently from F.linear's
PACK_MAX_BYTES = 512 * 2**20  # the second copy a packed layer costs, at most
_CHECK_ROWS = (1, 3)  # row counts the build-time check compares against F.linear

_packed: weakref.WeakKeyDictionary[nn.Linear, PackedLinear] = weakref.WeakKeyDictionary()


class PackedLinear(nn.Module):
    """y = x · Wᵀ (+ b) through oneDNN's prepacked weight; W and b stay the wrapped nn.Linear's."""

    def __init__(self, linear: nn.Linear, packed: torch.Tensor) -> None:  # linear is not kept: it stays in its model
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._weight = linear.weight  # [N, K], the layer's own (for F.linear, and to see it change)
        self._bias = linear.bias  # [N] or None
        self._packed = packed  # oneDNN's blocked copy of the weight (an opaque mkldnn tensor)
        self._packed_from = _identity(linear.weight)

    @classmethod
    def of(cls, linear: nn.Module) -> nn.Module:
        """The packed layer for `linear` (built once per layer, shared by every runner of its model), or `linear`
        itself where packing does not apply or would change a single bit of its output."""
        if not isinstance(linear, nn.Linear):
            return linear
        if linear in _packed:
            return _packed[linear]
        packed = _pack(linear)
        if packed is None:
            return linear
        layer = cls(linear, packed)
        _packed[linear] = layer
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] → [..., N]
        if _identity(self._weight) != self._packed_from:  # written in place or moved since: the copy is stale
            return torch.nn.functional.linear(x, self._weight, self._bias)
        return _run(x, self._packed, self._bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN prepacked bf16"


def _identity(weight: torch.Tensor) -> tuple:
    """What changes when a weight's values may have: its storage, dtype, or in-place version counter."""
    return weight.data_ptr(), weight.dtype, weight._version


def _run(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _pack(linear: nn.Linear) -> torch.Tensor | None:
    """oneDNN's blocked copy of linear.weight, or None where it is unavailable or not bitwise F.linear's."""
    weight, bias = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
    if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return None
    if weight.numel() * weight.element_size() > PACK_MAX_BYTES:
        return None
    try:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
            generator = torch.Generator().manual_seed(0)
            for rows in _CHECK_ROWS:
                probe = torch.randn(rows, linear.in_features, generator=generator).to(weight.dtype)  # [rows, K]
                if not torch.equal(_run(probe, packed, bias), torch.nn.functional.linear(probe, weight, bias)):
                    return None
    except (RuntimeError, AttributeError, NotImplementedError):  # no such op, or a layout oneDNN refuses
        return None
    return packed
