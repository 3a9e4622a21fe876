"""The served version's residual: the FTRL reference learned, during a block, on top of its logit.

A version serves its whole block with the weights it was trained with. The online offset
(:mod:`trainers.online_offset`) moves its intercept with the labels joined for it meanwhile; after
an abrupt change (a shift of interest, a category's trend, an ad wearing out) its *ranking* is off
too, and only the next version learns that. The **online residual** is the classic continuous
learner beside the deep model (Wide & Deep's FTRL-trained wide part, Monolith's continuous
training): an FTRL-Proximal logistic model (:class:`~trainers.ftrl.FtrlLearner` with its default
settings: alpha 0.05, beta 1, L1 1, L2 1, 32 rows a step) over the example's ids and a bias,
starting at 0 with each block and learning, as they are joined, each labelled example with the
served logit (the model's, calibrated, plus the online offset of that moment) as its margin. It
learns only what the served logit misses; its L1 keeps it sparse (the weights that moved), and it
is added to the served logit. It reads no dense input: with them (log-compressed but unscaled, as
the FTRL reference reads them) the ``lifecycle`` world lost 0.006 of AUC; without, it gains 0.002
(benchmarks/README.md).

Two forms of one definition, as for the offset, so that ``ctr backtest`` measures what the daemons
serve:

- :func:`block_residual`: for each stretch of ``every`` examples of a closed block, the residual
  learned on the examples labelled before the stretch's first impression (the progressive metrics,
  in a replay and in ``ctr trainer`` alike: :mod:`trainers.incremental`);
- :meth:`trainers.incremental.IncrementalTrainer.live_residual`: the residual learned on the
  examples received so far (each labelled when it arrives), published with the offset
  (:mod:`serving_bridge.online_offset`) as a :class:`SparseResidual`; replicas add its logit.

Measured before it was built (issue 13, a what-if on the quality suite's progressive scores): the
``shifts`` worlds +0.023 AUC and the block right after an interest shift from NE 1.005 to 0.99;
worlds whose blocks span less than the label delay are untouched (nothing is labelled in time).

>>> from trainers.encoding import EncodedBatch
>>> ids = np.array([[0], [1]] * 500)  # value 0 clicks at 60%, value 1 never; the margin says 10%
>>> y = (np.arange(1_000) % 10 < 5).astype(np.float32) * (ids[:, 0] == 0)
>>> batch = EncodedBatch(ids, np.zeros((1_000, 0), np.float32), y)
>>> z = np.full(1_000, np.log(1 / 9))
>>> r = block_residual(z, y, np.arange(1_000), batch, hash_buckets=4, delay_ms=10, every=100)
>>> early, late = r[:100], r[-100:]
>>> float(early[0]), round(float(late[0]), 2), round(float(late[1]), 2)  # nothing known yet; then 0 up
(0.0, 0.81, 0.04)
>>> sparse = SparseResidual.of(residual_learner(4))
>>> SparseResidual.from_bytes(sparse.to_bytes()).logits(batch[:2]).tolist()
[0.0, 0.0]
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from trainers.encoding import EncodedBatch
from trainers.ftrl import FtrlLearner, coordinates

__all__ = ["SparseResidual", "block_residual", "ids_only", "residual_learner"]


def ids_only(batch: EncodedBatch, labels: np.ndarray | None = None) -> EncodedBatch:
    """What the residual reads of ``batch``: its ids (and ``labels``), no dense input."""
    return EncodedBatch(batch.ids, np.zeros((len(batch.ids), 0), np.float32), labels)


def residual_learner(hash_buckets: int) -> FtrlLearner:
    """A residual that has learned nothing: :class:`~trainers.ftrl.FtrlParams`' defaults, 32 rows a step."""
    return FtrlLearner(hash_buckets)


def block_residual(
    margin: np.ndarray,
    labels: np.ndarray,
    times: np.ndarray,
    batch: EncodedBatch,
    *,
    hash_buckets: int,
    delay_ms: int,
    every: int,
    offsets: np.ndarray | None = None,
) -> np.ndarray:
    """Each example's residual logit (``times``: impression ms, ascending; ``batch``: the rows'
    ids and dense inputs, no sequence): at the start ``s`` of each stretch of ``every``, the
    residual first learns the examples with ``time + delay_ms <= times[s]`` it has not learned (in
    order, margin ``margin + offsets[s]``: the served logit with the offset fitted then), then
    scores the stretch."""
    n = len(margin)
    out = np.zeros(n)
    learner = residual_learner(hash_buckets)
    learned = 0
    for s in range(0, n, every):
        known = min(s, int(np.searchsorted(times, times[s] - delay_ms, side="right")))
        if known > learned:
            shift = 0.0 if offsets is None else float(offsets[s])
            rows = slice(learned, known)
            learner.learn(ids_only(batch[rows], labels[rows]), margin[rows] + shift)
            learned = known
        if learned:
            out[s : s + every] = learner.logits(ids_only(batch[s : s + every]))
    return out


@dataclass(frozen=True)
class SparseResidual:
    """A residual's non-zero weights, as replicas apply them: ``coords`` ascending (FTRL
    coordinates: :func:`trainers.ftrl.coordinates`), ``weights`` theirs."""

    coords: np.ndarray
    weights: np.ndarray
    hash_buckets: int

    @classmethod
    def of(cls, learner: FtrlLearner) -> SparseResidual:
        coords, weights = learner.sparse_weights()
        return cls(coords, weights, learner.hash_buckets)

    def logits(self, batch: EncodedBatch) -> np.ndarray:
        """The residual's logit for each row of ``batch``."""
        if len(self.coords) == 0 or len(batch) == 0:
            return np.zeros(len(batch))
        coords, vals = coordinates(ids_only(batch), self.hash_buckets)
        at = np.minimum(np.searchsorted(self.coords, coords), len(self.coords) - 1)
        w = np.where(self.coords[at] == coords, self.weights[at], 0.0)
        return (w * vals).sum(1)

    def to_bytes(self) -> bytes:
        """``.npz`` bytes (what travels through Redis)."""
        buf = io.BytesIO()
        np.savez(
            buf,
            coords=self.coords.astype(np.int64),
            weights=self.weights.astype(np.float64),
            hash_buckets=np.int64(self.hash_buckets),
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> SparseResidual:
        with np.load(io.BytesIO(data), allow_pickle=False) as f:
            coords, weights = f["coords"].astype(np.int64), f["weights"].astype(np.float64)
            buckets = int(f["hash_buckets"])
        if coords.ndim != 1 or coords.shape != weights.shape or (np.diff(coords) <= 0).any():
            raise ValueError("SparseResidual.from_bytes: coords must ascend and match the weights")
        return cls(coords, weights, buckets)
