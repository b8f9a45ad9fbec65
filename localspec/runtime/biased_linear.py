"""A block linear followed by its bias (Qwen2's q, k and v projections): y = linear(x) + b.

The block linears (Int4Linear, Q8Linear) take no bias: their kernels, and the layer kernel that reads them, know none.
The bias is added after the kernel's output is rounded to the model's dtype, a second rounding a dense addmm would
not make; each output element is its own row's sum plus its own bias, so a row stays bitwise the row alone.
"""

from __future__ import annotations

import torch
from torch import nn


class BiasedLinear(nn.Module):
    """`linear` (a block linear) then `bias` [N] in the model's dtype."""

    def __init__(self, linear: nn.Module, bias: torch.Tensor) -> None:
        super().__init__()
        self.linear = linear
        self.bias = nn.Parameter(bias, requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] → [..., N]
        return self.linear(x) + self.bias
