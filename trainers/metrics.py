"""Offline/online evaluation of CTR predictions: AUC, logloss, normalized entropy, calibration.

Metrics that a block's labels leave undefined (AUC, NE and calibration when the block has a single
class) are ``nan``; :func:`block_metrics` reports ``count`` and ``positives`` so that a reader (and
the gate) can tell "undefined by the data" from "broken model".

>>> round(auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])), 4)
0.75
>>> round(calibration(np.array([0, 1]), np.array([0.25, 0.25])), 4)
0.5
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "EPS",
    "UNDEFINED_ON_ONE_CLASS",
    "auc",
    "base_rate_entropy",
    "block_metrics",
    "calibration",
    "example_loglosses",
    "logloss",
    "normalized_entropy",
]

EPS = 1e-7  # probabilities are clipped to [EPS, 1 - EPS] so one confident mistake is finite
UNDEFINED_ON_ONE_CLASS = ("auc", "ne", "calibration")  # nan by definition when a block has one class


def _arrays(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=np.float64).ravel()
    p = np.asarray(p, dtype=np.float64).ravel()
    if y.shape != p.shape:
        raise ValueError(f"metrics: {y.size} labels but {p.size} predictions")
    return y, p


def auc(y: np.ndarray, p: np.ndarray) -> float:
    """ROC AUC via the Mann-Whitney rank sum; ties get their average rank. nan with one class."""
    y, p = _arrays(y, p)
    pos = int((y > 0.5).sum())
    neg = y.size - pos
    if pos == 0 or neg == 0 or not np.isfinite(p).all():
        return math.nan
    order = np.argsort(p, kind="mergesort")
    sorted_p = p[order]
    # Average rank per tie group: groups start where the sorted value changes.
    starts = np.flatnonzero(np.r_[True, sorted_p[1:] != sorted_p[:-1]])
    ends = np.r_[starts[1:], sorted_p.size]
    avg_rank = (starts + ends + 1) / 2.0  # 1-based ranks starts+1 .. ends, averaged
    ranks = np.empty(p.size, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    rank_sum = ranks[y > 0.5].sum()
    return float((rank_sum - pos * (pos + 1) / 2.0) / (pos * neg))


def example_loglosses(y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Each example's binary cross-entropy, predictions clipped to [EPS, 1 - EPS] (nan where p is)."""
    y, p = _arrays(y, p)
    q = np.clip(p, EPS, 1.0 - EPS)
    out: np.ndarray = -(y * np.log(q) + (1.0 - y) * np.log1p(-q))
    return out


def logloss(y: np.ndarray, p: np.ndarray) -> float:
    """Mean binary cross-entropy with predictions clipped to [EPS, 1 - EPS]; nan if p has nan."""
    losses = example_loglosses(y, p)
    return float(np.mean(losses)) if losses.size else math.nan


def base_rate_entropy(rate: float) -> float:
    """Entropy (nats) of always predicting ``rate``: normalized entropy's denominator; 0 at 0 or 1."""
    if rate <= 0.0 or rate >= 1.0:
        return 0.0
    return -(rate * math.log(rate) + (1.0 - rate) * math.log1p(-rate))


def normalized_entropy(y: np.ndarray, p: np.ndarray) -> float:
    """Logloss divided by the entropy of the block's base rate (He et al. 2014); < 1 beats the prior."""
    y, _ = _arrays(y, p)
    h = base_rate_entropy(float(y.mean())) if y.size else 0.0
    return logloss(y, p) / h if h > 0.0 else math.nan


def calibration(y: np.ndarray, p: np.ndarray) -> float:
    """Mean prediction / observed click rate (1 is calibrated); nan when there is no click."""
    y, p = _arrays(y, p)
    rate = float(y.mean()) if y.size else 0.0
    return float(p.mean()) / rate if rate > 0.0 else math.nan


def block_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """Every metric of one block, as plain floats (JSON/MLflow friendly)."""
    y, p = _arrays(y, p)
    return {
        "count": float(y.size),
        "positives": float((y > 0.5).sum()),
        "ctr": float(y.mean()) if y.size else math.nan,
        "mean_prediction": float(p.mean()) if p.size else math.nan,
        "auc": auc(y, p),
        "logloss": logloss(y, p),
        "ne": normalized_entropy(y, p),
        "calibration": calibration(y, p),
    }
