"""The served click probability as a mixture of the model and the running base rate, weighted by
how well each has predicted so far: a model never serves much worse than knowing only the rate.

On a stream whose features carry almost no signal (the Open Bandit logs: ~40 clicks in 8,000 rows)
a deep model fits noise, and its progressive NE lands above what the click rate alone scores
(benchmarks/README.md, "What the real logs allow"). Prediction with expert advice (Vovk's
aggregating algorithm for log loss; Cesa-Bianchi & Lugosi, ch. 3) bounds that: two experts, the
served model ``p`` (with the online offset and residual) and the base rate ``r``, serve
``w p + (1 - w) r`` with ``w = sigmoid(L)``, ``L`` the sum over the labelled rows so far of
``log p(y) - log r(y)``. Updated after every row, the mixture's cumulative log loss is at most the
better expert's plus ``log 2``. ``L`` is clamped to ``[-clamp, clamp]`` after each row
(``trainer.base_rate_blend_clamp``), so that a change of which expert is better costs at most
``clamp`` nats to follow (a fixed-share bound), and a model far better than the rate serves scores
within ``e^-clamp`` of its own.

``L`` follows the labels the way the online offset does (:mod:`trainers.online_offset`), so that
``ctr backtest`` measures what the daemons serve:

- :meth:`BaseRateBlend.block_weights`: each row of a closed block gets the weight of the labels
  final before its stretch of ``trainer.online_offset_every`` rows (the backtests' and the
  trainer's progressive metrics, :mod:`trainers.incremental`);
- :meth:`BaseRateBlend.learn`: what the trainer publishes while the block fills, over the examples
  received so far (each scored before the residual learned it); replicas apply it
  (:mod:`serving_bridge.online_offset`).

Each published version carries the state its block starts from (its ``spec.json``): the first
version the log odds its own holdout gives it, if positive (else even odds), and the click rate of
the block it learned (:meth:`BaseRateBlend.first`); each later one its champion's ``L``
at the end of the block the champion served (how the model, with its offset and residual, fared
against the rate) and the click rate of every block so far. A version without a live state (a
replica that cannot read it, ``mlflow models serve``) serves with that start. Measured on the
quality suite: ``benchmarks/README.md``.

>>> b = BaseRateBlend(0.0, 1.0, 99.0)  # even odds; 1 click in 99 rows: rate (1 + 0.5) / (99 + 1)
>>> round(b.base_rate, 4), b.weight
(0.015, 0.5)
>>> [round(float(p), 4) for p in b.apply(np.array([0.02, 0.5]))]
[0.0175, 0.2575]
>>> worse = b.learn(np.full(50, 0.5), np.zeros(50), clamp=10)  # the model said 0.5; no click came
>>> worse.log_odds, round(worse.weight, 5)
(-10.0, 5e-05)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

__all__ = ["BaseRateBlend"]

_EPS = 1e-7  # probabilities clipped as trainers.metrics does


def _gains(p_model: np.ndarray, rate: float, y: np.ndarray) -> np.ndarray:
    """Per row, ``log p(y) - log r(y)``: how much better the model predicted it than the rate."""
    q = np.clip(np.asarray(p_model, dtype=np.float64), _EPS, 1.0 - _EPS)
    r = min(max(rate, _EPS), 1.0 - _EPS)
    y = np.asarray(y, dtype=np.float64)
    return np.asarray(y * (np.log(q) - math.log(r)) + (1.0 - y) * (np.log1p(-q) - math.log1p(-r)))


def _running(start: float, gains: np.ndarray, clamp: float) -> np.ndarray:
    """``L`` before each row and after the last (``len(gains) + 1`` values), clamped to
    ``[-clamp, clamp]`` after every row: ``L_i = min(clamp, max(-clamp, L_{i-1} + g_i))``.

    Vectorised, not a loop: against one barrier the clamped walk is the free one minus its running
    excess over the barrier (Skorokhod's reflection); so each stretch is reflected at the barrier it
    leans on until it crosses the other one, where the next stretch starts (a few stretches: a
    crossing takes ``2 clamp`` nats of evidence)."""
    n = len(gains)
    out = np.empty(n + 1)
    out[0] = level = min(clamp, max(-clamp, start))
    i, upper = 0, True  # reflected at +clamp (crossing -clamp ends the stretch), or the reverse
    while i < n:
        free = level + np.cumsum(gains[i:])
        if upper:
            path = free - np.maximum.accumulate(np.maximum(free - clamp, 0.0))
            crossed = np.flatnonzero(path < -clamp)
        else:
            path = free - np.minimum.accumulate(np.minimum(free + clamp, 0.0))
            crossed = np.flatnonzero(path > clamp)
        if not crossed.size:
            out[i + 1 :] = path
            break
        j = int(crossed[0])
        out[i + 1 : i + 1 + j] = path[:j]
        level = out[i + 1 + j] = -clamp if upper else clamp
        i, upper = i + j + 1, not upper
    return out


@dataclass(frozen=True)
class BaseRateBlend:
    """``log_odds``: ``L``, the model's log weight minus the base rate's; ``clicks`` and ``rows``:
    the labels behind the base rate, ``(clicks + 0.5) / (rows + 1)`` (Krichevsky-Trofimov)."""

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

    def apply(self, p: np.ndarray, weight: float | np.ndarray | None = None) -> np.ndarray:
        """The served probabilities for the model's ``p`` (float64), at :attr:`weight` or the
        ``weight`` given (one, or one per row)."""
        w = self.weight if weight is None else weight
        return np.asarray(w * np.asarray(p, dtype=np.float64) + (1.0 - w) * self.base_rate, dtype=np.float64)

    def learn(self, p_model: np.ndarray, labels: np.ndarray, *, clamp: float) -> BaseRateBlend:
        """The state after rows the model scored ``p_model`` (the base rate stays: a block's rate
        is the blocks' before it)."""
        if not np.size(labels):
            return self
        end = _running(self.log_odds, _gains(p_model, self.base_rate, labels), clamp)[-1]
        return replace(self, log_odds=float(end))

    def block_weights(
        self,
        p_model: np.ndarray,
        labels: np.ndarray,
        times: np.ndarray,
        *,
        delay_ms: int | None,
        every: int,
        clamp: float,
    ) -> tuple[np.ndarray, float]:
        """Each row's weight over a closed block (``times``: impression ms, ascending), from the
        rows whose label was final (``time + delay_ms <=``) when its stretch of ``every`` began
        (``delay_ms`` None: the start's weight throughout); and ``L`` after the whole block."""
        L = _running(self.log_odds, _gains(p_model, self.base_rate, labels), clamp)
        weights = np.full(len(L) - 1, self.weight)
        if delay_ms is not None:
            for s in range(0, len(weights), every):
                known = min(s, int(np.searchsorted(times, times[s] - delay_ms, side="right")))
                weights[s : s + every] = 1.0 / (1.0 + math.exp(-L[known]))
        return weights, float(L[-1])

    def next_version(self, log_odds: float, labels: np.ndarray) -> BaseRateBlend:
        """The state the next version starts from: ``log_odds`` (this one's at the end of its
        block) and the rate with the block's ``labels`` added."""
        y = np.asarray(labels, dtype=np.float64)
        return BaseRateBlend(log_odds, self.clicks + float(y.sum()), self.rows + float(y.size))

    @classmethod
    def first(
        cls, train_labels: np.ndarray, p_holdout: np.ndarray, holdout_labels: np.ndarray, *, clamp: float
    ) -> BaseRateBlend:
        """The state of a version whose champion had none (the first): the log odds its holdout
        gives it (scored before it learned it, against the training rows' rate), if they favour
        it, else even odds; and the rate of the whole block. The holdout scores lack the online
        offset and residual serving adds, so they understate the served model: for it, they are
        evidence; against it, they are not (a holdout just after a shift of interest)."""
        train, hold = (np.asarray(v, dtype=np.float64) for v in (train_labels, holdout_labels))
        start = cls(0.0, float(train.sum()), float(train.size))
        log_odds = max(0.0, start.learn(p_holdout, hold, clamp=clamp).log_odds)
        return cls(log_odds, start.clicks + float(hold.sum()), start.rows + float(hold.size))

    def to_list(self) -> list[float]:
        return [self.log_odds, self.clicks, self.rows]

    @classmethod
    def from_spec(cls, value: Any) -> BaseRateBlend | None:
        """From :meth:`to_list`'s form; None (no mixture) for a version saved without one."""
        if value is None:
            return None
        log_odds, clicks, rows = (float(v) for v in value)
        return cls(log_odds, clicks, rows)
