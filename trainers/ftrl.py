"""Online logistic regression with FTRL-Proximal (McMahan et al. 2013): the classic online CTR baseline.

Per-coordinate learning rates over hashed features, in numpy. It reads the same inputs as the torch
models (an :class:`~trainers.encoding.EncodedBatch` from the shared :class:`~trainers.encoding.Encoder`):

- each hashed categorical id is a coordinate with value 1 (``[0, hash_buckets)``);
- each dense input ``j`` is coordinate ``hash_buckets + j`` with its (already log-compressed) value;
- one bias coordinate after them.

For each coordinate it keeps ``z`` and ``n`` (sum of squared gradients); the weight is computed
lazily: ``w = 0`` if ``|z| <= l1`` else ``-(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)``.
Updates are applied every ``batch_size`` rows (gradients of a mini-batch summed per coordinate):
with ``batch_size=1`` this is the textbook per-example algorithm; larger batches trade a little
accuracy for numpy speed (one vectorised step instead of a Python loop per row).

>>> from trainers.encoding import EncodedBatch
>>> ids = np.array([[0, 5], [1, 5]] * 200)
>>> y = np.array([1.0, 0.0] * 200, dtype=np.float32)
>>> m = FtrlLearner(hash_buckets=8, batch_size=1)
>>> batch = EncodedBatch(ids, np.zeros((400, 0), np.float32), y)
>>> _ = m.learn(batch)
>>> p = m.predict(batch[:2])
>>> bool(p[0] > 0.6 and p[1] < 0.4)  # regularised: confident, not certain, after 400 examples
True
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainers.encoding import EncodedBatch, Encoder
from trainers.metrics import EPS

__all__ = ["FtrlLearner", "FtrlParams", "coordinates"]


@dataclass(frozen=True)
class FtrlParams:
    """FTRL-Proximal hyper-parameters (McMahan et al. 2013, Algorithm 1)."""

    alpha: float = 0.05  # learning-rate scale: per-coordinate rate alpha / (beta + sqrt(n))
    beta: float = 1.0  # smooths the rate while n is small
    l1: float = 1.0  # L1: coordinates with |z| <= l1 stay exactly 0 (sparse model)
    l2: float = 1.0  # L2 on the weights


class FtrlLearner:
    """Hashed-feature logistic regression trained online with FTRL-Proximal; numpy, CPU.

    Implements :class:`pipeline.core.types.Learner` (``learn``/``predict``). Inputs are an
    ``EncodedBatch``, or labelled examples / rows when an ``encoder`` is given.
    """

    def __init__(
        self,
        hash_buckets: int,
        params: FtrlParams | None = None,
        *,
        batch_size: int = 32,
        encoder: Encoder | None = None,
    ) -> None:
        if hash_buckets < 2:
            raise ValueError(f"FtrlLearner: hash_buckets must be >= 2, got {hash_buckets}")
        if batch_size < 1:
            raise ValueError(f"FtrlLearner: batch_size must be >= 1, got {batch_size}")
        self.hash_buckets = hash_buckets
        self.params = params or FtrlParams()
        if self.params.alpha <= 0 or self.params.beta < 0 or self.params.l1 < 0 or self.params.l2 < 0:
            raise ValueError(f"FtrlLearner: invalid parameters {self.params}")
        self.batch_size = batch_size
        self.encoder = encoder
        self.n_dense: int | None = None  # fixed by the first batch seen
        self._z = np.zeros(0)
        self._n = np.zeros(0)
        self._g = np.zeros(0)  # a step's summed gradient per coordinate; 0 between steps
        self.examples_learned = 0
        self.version: str | None = None  # for symmetry with TorchLearner in reports

    # -- Learner protocol --------------------------------------------------------------------------
    def learn(self, examples: Any, margin: np.ndarray | None = None) -> float:
        """Update on every row in order (``batch_size`` at a time); mean logloss of the rows, each
        scored just before the update that uses it (progressive). ``margin``: a logit per row the
        model's is added to (it then learns what the margin misses: a residual)."""
        batch = self.encode(examples)
        if batch.labels is None:
            raise ValueError("FtrlLearner.learn: examples carry no labels")
        n = len(batch)
        if n == 0:
            return float("nan")
        self._ensure(batch)
        coords, vals = self._coords(batch)
        y = batch.labels.astype(np.float64)
        base = np.zeros(n) if margin is None else np.asarray(margin, dtype=np.float64)
        a, b, l1, l2 = self.params.alpha, self.params.beta, self.params.l1, self.params.l2
        total = 0.0
        for s in range(0, n, self.batch_size):
            c, v, yy, m = (
                coords[s : s + self.batch_size],
                vals[s : s + self.batch_size],
                y[s : s + self.batch_size],
                base[s : s + self.batch_size],
            )
            # Per entry of the step's (rows, coordinates), no np.unique (a sort per step): a
            # coordinate's gradients are summed in place in ``_g``, and a coordinate that occurs
            # twice writes the same new z and n twice.
            z, nn = self._z[c], self._n[c]
            w = _weights(z, nn, a, b, l1, l2)
            p = _sigmoid(m + (w * v).sum(1))
            q = np.clip(p, EPS, 1.0 - EPS)
            total += float(-(yy * np.log(q) + (1.0 - yy) * np.log1p(-q)).sum())
            np.add.at(self._g, c.ravel(), ((p - yy)[:, None] * v).ravel())
            g = self._g[c]
            self._g[c] = 0.0
            sigma = (np.sqrt(nn + g * g) - np.sqrt(nn)) / a
            self._z[c] = z + g - sigma * w
            self._n[c] = nn + g * g
        self.examples_learned += n
        return total / n

    def predict(self, examples: Any) -> np.ndarray:
        """Click probabilities (float64); 0.5 everywhere before any learning."""
        batch = self.encode(examples)
        if len(batch) == 0:
            return np.zeros(0)
        self._ensure(batch)
        p = self.params
        coords, vals = self._coords(batch)
        w = _weights(self._z, self._n, p.alpha, p.beta, p.l1, p.l2)  # all at once: O(table), vectorised
        return _sigmoid((w[coords] * vals).sum(1))

    def logits(self, batch: EncodedBatch) -> np.ndarray:
        """The model's logit per row of ``batch``, from the weights of its coordinates only (cheap
        on a small batch: no pass over the table)."""
        if len(batch) == 0:
            return np.zeros(0)
        self._ensure(batch)
        p = self.params
        coords, vals = self._coords(batch)
        return (_weights(self._z[coords], self._n[coords], p.alpha, p.beta, p.l1, p.l2) * vals).sum(1)

    def sparse_weights(self) -> tuple[np.ndarray, np.ndarray]:
        """``(coordinates, weights)`` of the non-zero weights (L1 keeps the rest at exactly 0), the
        coordinates ascending."""
        p = self.params
        nz = np.flatnonzero(np.abs(self._z) > p.l1)
        return nz.astype(np.int64), _weights(self._z[nz], self._n[nz], p.alpha, p.beta, p.l1, p.l2)

    # -- helpers -----------------------------------------------------------------------------------
    def encode(self, examples: Any) -> EncodedBatch:
        if isinstance(examples, EncodedBatch):
            return examples
        if self.encoder is None:
            raise TypeError("FtrlLearner: pass an EncodedBatch, or build the learner with an encoder")
        return self.encoder.encode(examples)

    def clone(self) -> FtrlLearner:
        """An independent copy (weights and counters; the encoder is shared)."""
        return copy.deepcopy(self)

    @property
    def nonzero_weights(self) -> int:
        """Coordinates with a non-zero weight (L1 keeps the rest at exactly 0)."""
        return int((np.abs(self._z) > self.params.l1).sum())

    def _ensure(self, batch: EncodedBatch) -> None:
        d = int(batch.dense.shape[1])
        if self.n_dense is None:
            self.n_dense = d
            size = self.hash_buckets + d + 1
            self._z, self._n, self._g = np.zeros(size), np.zeros(size), np.zeros(size)
        elif d != self.n_dense:
            raise ValueError(
                f"FtrlLearner: batch has {d} dense inputs, the model was built with {self.n_dense}"
            )
        if batch.ids.size and (batch.ids.min() < 0 or batch.ids.max() >= self.hash_buckets):
            raise ValueError(f"FtrlLearner: ids outside [0, {self.hash_buckets})")

    def _coords(self, batch: EncodedBatch) -> tuple[np.ndarray, np.ndarray]:
        return coordinates(batch, self.hash_buckets)


def coordinates(batch: EncodedBatch, hash_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, k)`` FTRL coordinates and values of each row of ``batch``: its ids, its dense inputs
    (``hash_buckets + j``), the bias (``hash_buckets + n_dense``)."""
    n, d = len(batch), int(batch.dense.shape[1])
    extra = hash_buckets + np.arange(d + 1, dtype=np.int64)
    coords = np.concatenate([batch.ids, np.broadcast_to(extra, (n, d + 1))], axis=1)
    vals = np.concatenate(
        [np.ones(batch.ids.shape, np.float64), batch.dense.astype(np.float64), np.ones((n, 1))], axis=1
    )
    return coords, vals


def _weights(z: np.ndarray, n: np.ndarray, alpha: float, beta: float, l1: float, l2: float) -> np.ndarray:
    w = -(z - np.sign(z) * l1) / ((beta + np.sqrt(n)) / alpha + l2)
    return np.where(np.abs(z) <= l1, 0.0, w)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow warning for large |x|
    return out
