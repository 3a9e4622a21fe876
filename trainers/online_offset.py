"""The served version's intercept, following the labels joined for it during its block.

A version trained on block ``k - 1`` serves block ``k``; where the click rate moved since (a daily
cycle, an item's life cycle, a shift of interest) its intercept is off for the whole block, and
the per-block correction (``trainer.intercept_gain``) only reaches the next version. The labels of
the block's first impressions, though, are joined within the block: an impression's label is final
``label_delay_ms`` (the attribution window plus the watermark lag) after it. The **online offset**
is :func:`~trainers.calibration.fit_shift` of the served logits over the newest
``trainer.online_offset_recent`` examples of the block whose label is final, refitted every
``trainer.online_offset_every`` examples, added to every served logit; a new block (and so a new
version) starts at 0, and no fit is made on fewer than :data:`MIN_LABELLED` examples.

Two forms of one definition, so that ``ctr backtest`` measures what the daemons serve:

- :func:`block_offsets`: every example of a closed block, from the examples of the same block
  labelled before its impression (the progressive metrics, in a replay and in ``ctr trainer``
  alike: the shared engine, :mod:`trainers.incremental`);
- :func:`live_offset`: what the trainer publishes while the block fills, from the examples
  received so far (all of them labelled: the merge hands over an impression's example once its
  window closed); replicas add it to the logit of the version it was fitted on
  (:mod:`serving_bridge.online_offset`). At wall time *W* both use the labels of the impressions
  before *W* minus the delay.

The gate compares models, not what serving adds to them: its champion scores are the raw ones.
Measured on the quality suite before it was built: ``benchmarks/online_offset.py``.

>>> t = np.arange(0, 10_000, 10)  # 1,000 impressions, one every 10 ms
>>> z, y = np.full(1_000, -2.0), (np.arange(1_000) % 4 == 0).astype(np.float32)  # 25% click, ~12% scored
>>> o = block_offsets(z, y, t, delay_ms=3_000, every=100, recent=500)
>>> float(o[0]), float(o[399])  # before 100 labels are final (impressions older than 3 s)
(0.0, 0.0)
>>> round(float(o[400]), 2), round(float(o[-1]), 2)  # towards log(0.25 / 0.75) + 2 = 0.90 (ridge)
(0.74, 0.86)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from trainers.base_rate_blend import BaseRateBlend
from trainers.calibration import fit_shift
from trainers.online_residual import SparseResidual

__all__ = ["MIN_LABELLED", "LiveServing", "block_offsets", "live_offset"]

MIN_LABELLED = 100  # examples a fit needs; fewer: offset 0


class LiveServing(NamedTuple):
    """What the trainer publishes for its champion while a block fills; replicas serve with it
    (:mod:`serving_bridge.online_offset`)."""

    version: str
    offset: float
    residual: SparseResidual | None = None  # trainers.online_residual (trainer.online_residual)
    blend: BaseRateBlend | None = None  # trainers.base_rate_blend (trainer.base_rate_blend_clamp)


def block_offsets(
    logits: np.ndarray, labels: np.ndarray, times: np.ndarray, *, delay_ms: int, every: int, recent: int
) -> np.ndarray:
    """Each example's offset (``times``: impression ms, ascending): the fit over the newest
    ``recent`` examples with ``time + delay_ms <= `` the time of the ``every``-th example that
    starts its stretch; 0 where fewer than :data:`MIN_LABELLED` are."""
    out = np.zeros(len(logits))
    for s in range(0, len(logits), every):
        known = min(s, int(np.searchsorted(times, times[s] - delay_ms, side="right")))
        lo = max(0, known - recent)
        if known - lo >= MIN_LABELLED:
            out[s : s + every] = fit_shift(logits[lo:known], labels[lo:known])
    return out


def live_offset(logits: np.ndarray, labels: np.ndarray, *, recent: int) -> float:
    """The offset to serve now: the fit over the newest ``recent`` of the block's examples received
    so far (all labelled); 0 under :data:`MIN_LABELLED`."""
    if len(logits) < MIN_LABELLED:
        return 0.0
    return fit_shift(logits[-recent:], labels[-recent:])
