"""The served click probability as a mixture of the model and the running base rate, weighted by
how well each has predicted so far: a model never serves much worse than knowing only the rate.

On a stream whose features carry almost no signal (the Open Bandit logs: ~40 clicks in 8,000 rows)
a deep model fits noise, and its progressive NE lands above what the click rate alone scores
(benchmarks/README.md, "What the real logs allow"). Prediction with expert advice (Vovk's
aggregating algorithm for log loss; Cesa-Bianchi & Lugosi, ch. 3) bounds that: two experts, the
served model ``p`` and the base rate ``r``, serve ``w p + (1 - w) r`` with ``w = sigmoid(L)``, ``L``
the sum over every labelled row so far of ``log p(y) - log r(y)`` (with even odds at the start).
The mixture's cumulative log loss is at most the better expert's plus ``log 2``. ``L`` is clamped to
``[-clamp, clamp]`` (``trainer.base_rate_blend_clamp``), so that a change of which expert is
better costs at most ``clamp`` nats to follow (a fixed-share bound), and a model far better than the
rate leaves its scores' order untouched and their values within ``e^-clamp`` of its own.

The state moves once per block and travels with each published version (its ``spec.json``), so
that replicas, ``mlflow models serve`` and backtests serve the same mixture:

- the first version (trained on block 1) starts from the block's training rows' click rate and its
  own scores on the block's holdout, made before it learned it;
- each later candidate starts from its champion's state plus the block the champion served: its
  served probabilities (with the online offset and residual, before the mixture) against the base
  rate that block was served with. A refused candidate's evidence is not kept (the champion's
  published state cannot change).

Within a block ``w`` and ``r`` are constants, so the mixture never reorders a block's scores.

>>> train = np.zeros(95)
>>> train[0] = 1.0  # 1 click in the training rows; none in the 5 holdout rows the model scored 0.5
>>> b = BaseRateBlend.first(train, np.full(5, 0.5), np.zeros(5), clamp=10)
>>> round(b.base_rate, 4), round(b.weight, 3)
(0.0149, 0.033)
>>> [round(float(p), 4) for p in b.apply(np.array([0.02, 0.5]))]
[0.015, 0.0307]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BaseRateBlend"]

_EPS = 1e-7  # probabilities clipped as trainers.metrics does


def _loglosses(p: np.ndarray | float, y: np.ndarray) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return -(y * np.log(q) + (1.0 - y) * np.log1p(-q))


@dataclass(frozen=True)
class BaseRateBlend:
    """``log_odds``: the model's log weight minus the base rate's; ``clicks`` and ``rows``: the
    labels behind the base rate, ``(clicks + 0.5) / (rows + 1)`` (Krichevsky-Trofimov)."""

    log_odds: float
    clicks: float
    rows: float

    @property
    def weight(self) -> float:
        """The model's share of the served probability."""
        return 1.0 / (1.0 + math.exp(-self.log_odds))

    @property
    def base_rate(self) -> float:
        return (self.clicks + 0.5) / (self.rows + 1.0)

    def apply(self, p: np.ndarray) -> np.ndarray:
        """The served probabilities for the model's ``p`` (float64)."""
        w = self.weight
        return np.asarray(w * np.asarray(p, dtype=np.float64) + (1.0 - w) * self.base_rate, dtype=np.float64)

    def learn(self, p_model: np.ndarray, labels: np.ndarray, *, clamp: float) -> BaseRateBlend:
        """The state after rows scored ``p_model`` by the model and :attr:`base_rate` by the rate."""
        y = np.asarray(labels, dtype=np.float64)
        if not y.size:
            return self
        gain = float(_loglosses(self.base_rate, y).sum() - _loglosses(p_model, y).sum())
        log_odds = min(clamp, max(-clamp, self.log_odds + gain))
        return BaseRateBlend(log_odds, self.clicks + float(y.sum()), self.rows + float(y.size))

    @classmethod
    def first(
        cls, train_labels: np.ndarray, p_holdout: np.ndarray, holdout_labels: np.ndarray, *, clamp: float
    ) -> BaseRateBlend:
        """The first version's state: the training rows' rate, then the holdout, which the version
        scored before it learned it, at even odds."""
        start = cls(0.0, float(np.sum(train_labels)), float(np.size(train_labels)))
        return start.learn(p_holdout, holdout_labels, clamp=clamp)

    def to_list(self) -> list[float]:
        return [self.log_odds, self.clicks, self.rows]

    @classmethod
    def from_spec(cls, value: Any) -> BaseRateBlend | None:
        """From :meth:`to_list`'s form; None (no mixture) for a version saved without one."""
        if value is None:
            return None
        log_odds, clicks, rows = (float(v) for v in value)
        return cls(log_odds, clicks, rows)
