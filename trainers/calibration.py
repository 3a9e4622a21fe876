"""Platt scaling of a model's logit, fitted on predictions it made before it saw the labels.

A model trained on block ``k`` serves block ``k + 1``: by then users and items have moved, and its
logits are too confident (or not confident enough) in a way that depends on the stream, not on
the model. :func:`fit_platt` measures that from the champion's own progressive scores (logits
made before the block was learned, i.e. at serving's staleness) on the older part of the block:
``p = sigmoid(a * logit + b)``, maximum likelihood with a ridge pull towards the identity
``(a, b) = (1, 0)``, so a block with few clicks moves it little. The candidate trained on that block
carries the fit into serving; the gate's holdout is never part of it.

>>> rng = np.random.default_rng(0)
>>> z = rng.normal(-2, 1, 20_000)
>>> y = (rng.random(20_000) < 1 / (1 + np.exp(-(0.5 * z - 1)))).astype(np.float32)
>>> a, b = fit_platt(z, y)
>>> round(a, 1), round(b, 1)
(0.5, -1.0)
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["IDENTITY", "apply_platt", "cross_fitted_shift", "fit_platt", "fit_shift", "logits_of"]

IDENTITY = (1.0, 0.0)
_RIDGE = 5.0  # pseudo-observations pulling (a, b) to (1, 0): ~1 click's worth of evidence each


def fit_platt(logits: np.ndarray, labels: np.ndarray, *, iterations: int = 25) -> tuple[float, float]:
    """Newton's method for ``(a, b)`` maximising the log-likelihood of ``labels`` under
    ``sigmoid(a * logits + b)`` minus ``_RIDGE / 2 * ((a - 1)^2 + b^2)``; identity if degenerate."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if z.size == 0 or not np.isfinite(z).all():
        return IDENTITY
    a, b = IDENTITY
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(a * z + b)))
        r = p - y
        w = p * (1.0 - p)
        ga = float(r @ z) + _RIDGE * (a - 1.0)
        gb = float(r.sum()) + _RIDGE * b
        haa = float(w @ (z * z)) + _RIDGE
        hab = float(w @ z)
        hbb = float(w.sum()) + _RIDGE
        det = haa * hbb - hab * hab
        if det <= 0.0 or not math.isfinite(det):
            return IDENTITY
        da = (hbb * ga - hab * gb) / det
        db = (haa * gb - hab * ga) / det
        a, b = a - da, b - db
        if abs(da) < 1e-7 and abs(db) < 1e-7:
            break
    return (a, b) if math.isfinite(a) and math.isfinite(b) else IDENTITY


def fit_shift(logits: np.ndarray, labels: np.ndarray, *, iterations: int = 25) -> float:
    """The intercept ``b`` maximising the log-likelihood of ``labels`` under ``sigmoid(logits + b)``
    minus ``_RIDGE / 2 * b^2`` (Newton): how far the logits sit from the observed click rate.

    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(-2, 1, 20_000)
    >>> y = (rng.random(20_000) < 1 / (1 + np.exp(-(z - 0.5)))).astype(np.float32)
    >>> round(fit_shift(z, y), 1)
    -0.5
    """
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if z.size == 0 or not np.isfinite(z).all():
        return 0.0
    b = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(z + b)))
        step = (float((p - y).sum()) + _RIDGE * b) / (float((p * (1.0 - p)).sum()) + _RIDGE)
        b -= step
        if abs(step) < 1e-7:
            break
    return b if math.isfinite(b) else 0.0


def cross_fitted_shift(probabilities: np.ndarray, labels: np.ndarray, *, folds: int = 10) -> np.ndarray:
    """``probabilities`` with their intercept refitted (:func:`fit_shift`) on ``labels``,
    cross-fitted: the rows are dealt into ``folds`` folds (row ``i`` into fold ``i % folds``) and
    each fold is shifted by the fit on the other folds, so no row is scored by a fit it took part in.

    What a model's scores on a slice would be once its intercept is refitted there, judged honestly
    on that slice: the promotion gate scores a candidate this way when the trainer refits each
    accepted version's intercept (``trainer.refit_intercept``), so a candidate that ranks better is
    not refused for an intercept the refit is about to move (:mod:`trainers.incremental`). Each fit
    sees nine tenths of the slice, so its noise is about the refit's own; two halves made it
    twice the refit's and, at 45 clicks a holdout, refused good candidates for it.

    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(-2, 1, 20_000)
    >>> y = (rng.random(20_000) < 1 / (1 + np.exp(-z))).astype(np.float32)
    >>> p = 1 / (1 + np.exp(-(z + 1.0)))  # the right ranking, one logit too high
    >>> round(float(p.mean() / y.mean()), 1), round(float(cross_fitted_shift(p, y).mean() / y.mean()), 2)
    (1.9, 1.0)
    """
    z = logits_of(probabilities)
    y = np.asarray(labels, dtype=np.float64)
    fold = np.arange(z.size) % folds
    shift = np.zeros_like(z)
    for k in range(min(folds, z.size)):
        rows = fold == k
        shift[rows] = fit_shift(z[~rows], y[~rows])
    return 1.0 / (1.0 + np.exp(-(z + shift)))


def logits_of(probabilities: np.ndarray) -> np.ndarray:
    """``log(p / (1 - p))`` as float64, ``p`` and ``1 - p`` kept at 1e-12 or above."""
    p = np.asarray(probabilities, dtype=np.float64)
    return np.log(np.clip(p, 1e-12, 1.0)) - np.log(np.clip(1.0 - p, 1e-12, 1.0))


def apply_platt(logits: np.ndarray, ab: tuple[float, float]) -> np.ndarray:
    """``sigmoid(a * logits + b)`` as float64."""
    a, b = ab
    return 1.0 / (1.0 + np.exp(-(a * np.asarray(logits, dtype=np.float64) + b)))
