"""Each dense input clamped to the range training has seen: a model never extrapolates on one.

A dense input's weights learn only from the values training showed them. Where serving then sees
values outside that range, the model's answer there is whatever its weights happen to give: an
input that training always saw at 0 (the global item counters of a stream's first block, which stand
the label delay behind the impressions, ``features.item_stage``) keeps its random initial weights,
and when the counters fill up in the next block those weights move every logit. Measured on the
quality suite's sim-sparse world: the first version scored the second block at 0.38 of its click
rate (NE 1.12), where a copy of it that ignores the item counters was calibrated; a 24-hour counter
growing through a stream's first day extrapolates the same way. (The linear part's dense weights
start at 0, the MLP's and the cross layers' first layers do not, nor can they: a layer of zeros
learns nothing.)

So the model holds, per dense input, the smallest and largest value of every block it learned
(buffers, saved with the weights: a served version clamps as its trainer did), widened by
:meth:`DenseRange.observe` before each block is learned, and reads each input clamped to it. An
input training saw only at 0 contributes exactly what it contributed in training; once a block
shows it varying, the next version learns it. 0, the encoder's missing value, is always in range.
Cost: a min and a max per input per block, a clamp per forward pass.

>>> r = DenseRange(2)
>>> r(torch.tensor([[5.0, -1.0]])).tolist()  # nothing learned yet: every input reads 0
[[0.0, 0.0]]
>>> r.observe(torch.tensor([[1.0, 0.0], [3.0, 0.0]]))
>>> r(torch.tensor([[5.0, -1.0], [2.0, 0.5]])).tolist()  # input 0 within [0, 3], input 1 only ever 0
[[3.0, 0.0], [2.0, 0.0]]
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DenseRange"]


class DenseRange(nn.Module):
    """The range of each of ``n`` dense inputs over the blocks learned; ``forward`` clamps to it."""

    lo: torch.Tensor
    hi: torch.Tensor

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("lo", torch.zeros(n))
        self.register_buffer("hi", torch.zeros(n))

    @torch.no_grad()
    def observe(self, dense: torch.Tensor) -> None:
        """Widen the range by a block's ``(rows, n)`` inputs (non-finite values are the encoder's to
        zero; none reach here)."""
        if dense.numel():
            self.lo.copy_(torch.minimum(self.lo, dense.min(0).values.to(self.lo.dtype)))
            self.hi.copy_(torch.maximum(self.hi, dense.max(0).values.to(self.hi.dtype)))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return torch.clamp(dense, self.lo.to(dense.dtype), self.hi.to(dense.dtype))
