"""The promotion gate: a candidate replaces the champion only if it is finite and not worse.

Both sides are scored on the same held-out (newest) slice of the block, each as it would be served:
the champion as it is, the candidate with the intercept the trainer refits once it is accepted
(``trainer.refit_intercept``; :func:`trainers.calibration.cross_fitted_shift`, so no holdout row is
scored by a fit it took part in). "Worse" means worse beyond the tolerance *and beyond chance*: the
candidate's holdout logloss may exceed the champion's times ``1 + trainer.gate_tolerance`` by
:func:`paired_allowance`, the one-sided ``trainer.gate_confidence`` bound of the mean of the paired
per-example logloss differences. A refusal keeps the champion, and the next candidate starts from
it, so the refused block is never learned: on a small holdout (200 rows of a 2,000-row block, ~35
clicks) a difference of a few thousandths is noise, and refusing on it threw real blocks away
(Avazu's third block: benchmarks/README.md). On a large holdout the allowance shrinks as
``1 / sqrt(rows)``.

Every value in the
candidate's metric dict must be finite, except the metrics a single-class slice leaves undefined
(:data:`trainers.metrics.UNDEFINED_ON_ONE_CLASS`), which may be nan only when the slice really has
one class. A champion whose own logloss is not finite is replaced by any finite candidate.

>>> gate({"logloss": 0.30}, None, 0.01).reason
'no champion; candidate logloss 0.300000 is finite'
>>> gate({"logloss": 0.31}, {"logloss": 0.30}, 0.01).accepted
False
>>> gate({"logloss": 0.31}, {"logloss": 0.30}, 0.01, allowance=0.02).accepted  # within chance
True
>>> gate({"logloss": float("nan")}, None, 0.01).reason
"candidate metric 'logloss' is nan"

Before any of that, :func:`labels_look_corrupt` checks the block itself: a champion that ranked its
own held-out data well but ranks this block far *below* chance (AUC < ``trainer.min_champion_auc``) means
the labels turned against everything learnt so far (flipped labels, a joiner bug), not drift: the
block is refused whatever the candidate scores on its equally corrupt holdout.

>>> labels_look_corrupt({"auc": 0.31}, 0.45, proven_auc=0.71).kind
'corrupt_labels'
>>> labels_look_corrupt({"auc": 0.62}, 0.45, proven_auc=0.71) is None
True
>>> labels_look_corrupt({"auc": 0.43}, 0.45, proven_auc=0.48) is None  # never good: noise, not flips
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from trainers.metrics import EPS, UNDEFINED_ON_ONE_CLASS, example_loglosses

__all__ = [
    "GateDecision",
    "gate",
    "label_noise_variance",
    "labels_look_corrupt",
    "paired_allowance",
    "within_tolerance",
]


@dataclass(frozen=True, slots=True)
class GateDecision:
    accepted: bool
    reason: str
    kind: str = ""  # refusals: non_finite | worse_than_champion | corrupt_labels (a metric label)


def labels_look_corrupt(
    champion_on_block: Mapping[str, float], min_auc: float, proven_auc: float | None = 1.0
) -> GateDecision | None:
    """A refusal if the champion's progressive AUC on the block is below ``min_auc`` (0: never),
    for a champion that had proven itself (``proven_auc``, its held-out AUC when it was accepted, at
    least ``1 - min_auc``): a barely trained champion ranks near chance and dips below by noise."""
    auc = float(champion_on_block.get("auc", math.nan))
    proven = proven_auc is not None and proven_auc >= 1.0 - min_auc
    if min_auc > 0 and proven and math.isfinite(auc) and auc < min_auc:
        return GateDecision(
            False,
            f"labels look corrupt: the champion's AUC on this block is {auc:.4f} < {min_auc:g} "
            "(flipped labels?); block refused",
            "corrupt_labels",
        )
    return None


def _one_class(metrics: Mapping[str, float]) -> bool:
    count, pos = metrics.get("count"), metrics.get("positives")
    return count is not None and pos is not None and (pos == 0 or pos == count)


def _non_finite(metrics: Mapping[str, float]) -> str | None:
    excused = UNDEFINED_ON_ONE_CLASS if _one_class(metrics) else ()
    for key, value in metrics.items():
        try:
            finite = math.isfinite(float(value))
        except (TypeError, ValueError):
            return f"candidate metric {key!r} is not a number: {value!r}"
        if not finite and key not in excused:
            return f"candidate metric {key!r} is {value}"
    return None


def paired_allowance(
    y: np.ndarray, p_candidate: np.ndarray, p_champion: np.ndarray, confidence: float
) -> float:
    """How much more logloss than the champion's a candidate may show on the holdout by chance:
    ``z * sd / sqrt(n)``, ``z`` the standard normal's ``confidence`` quantile, ``sd`` the larger of
    two estimates of one row's paired difference ``d`` (candidate minus champion logloss):

    - the sample standard deviation of ``d`` over the holdout's rows;
    - what the labels' own chance gives under the two models (:func:`label_noise_variance`): a
      row's ``d`` is one of two values, by its label, and a label is a coin of probability the
      models' mean. On a holdout with few clicks the sample misses this: with no click at all
      every ``d`` is nearly the same, so the sample says "no doubt" while the holdout simply
      favours whichever model predicts less, and a candidate that learned a rising click rate was
      refused on 200 rows without a click (Open Bandit, benchmarks/README.md).

    0 at ``confidence`` 0.5 (the point estimates alone), with fewer than 2 rows, or where a score is
    not finite (the gate then refuses on the metric itself).

    >>> rng = np.random.default_rng(0)
    >>> p = rng.uniform(0.05, 0.3, 400)  # the champion, right; the candidate 20% too high
    >>> y = (rng.random(400) < p).astype(float)
    >>> round(paired_allowance(y, p * 1.2, p, 0.95), 4)
    0.0077
    >>> paired_allowance(y, p, p, 0.95)  # the same scores: no doubt
    0.0
    >>> y0 = np.zeros(200)  # no click: the sample sees no spread, the labels' chance still is one
    >>> round(paired_allowance(y0, np.full(200, 0.0035), np.full(200, 0.0017), 0.95), 4)
    0.0043
    """
    d = example_loglosses(y, p_candidate) - example_loglosses(y, p_champion)
    if confidence <= 0.5 or d.size < 2 or not np.isfinite(d).all():
        return 0.0
    var = max(float(np.var(d, ddof=1)), label_noise_variance(p_candidate, p_champion))
    return float(NormalDist().inv_cdf(confidence) * math.sqrt(var) / math.sqrt(d.size))


def label_noise_variance(p_candidate: np.ndarray, p_champion: np.ndarray) -> float:
    """The variance of one row's paired logloss difference when its label is drawn with the two
    models' mean probability ``q``: the spread of the rows' expected differences, plus the mean of
    ``q (1 - q) (logit champion - logit candidate)^2`` (how far a row's difference moves with its
    label). Clipped as the loglosses are.

    >>> label_noise_variance(np.full(4, 0.3), np.full(4, 0.3))
    0.0
    >>> round(label_noise_variance(np.full(4, 0.02), np.full(4, 0.01)), 4)  # 0.015 * 0.985 * 0.70^2
    0.0073
    """
    c = np.clip(np.asarray(p_candidate, dtype=np.float64), EPS, 1.0 - EPS)
    h = np.clip(np.asarray(p_champion, dtype=np.float64), EPS, 1.0 - EPS)
    if c.size < 2:
        return 0.0
    d1, d0 = np.log(h) - np.log(c), np.log1p(-h) - np.log1p(-c)  # the difference if clicked, if not
    q = (c + h) / 2.0
    expected = q * d1 + (1.0 - q) * d0
    return float(np.var(expected, ddof=1) + np.mean(q * (1.0 - q) * (d1 - d0) ** 2))


def gate(
    candidate: Mapping[str, float],
    champion: Mapping[str, float] | None,
    tolerance: float,
    *,
    allowance: float = 0.0,
) -> GateDecision:
    """Accept ``candidate`` over ``champion`` (held-out metric dicts with a ``logloss`` key)?

    Refused: any non-finite candidate metric or loss (see module doc), or candidate logloss above
    ``champion logloss * (1 + tolerance) + allowance`` (:func:`paired_allowance`: what chance
    explains on this holdout). Accepted: no champion (or a non-finite one) and a finite candidate,
    or a candidate within tolerance.
    """
    if "logloss" not in candidate:
        raise KeyError("gate: candidate metrics have no 'logloss'")
    bad = _non_finite(candidate)
    if bad is not None:
        return GateDecision(False, bad, "non_finite")
    cand = float(candidate["logloss"])
    if champion is None:
        return GateDecision(True, f"no champion; candidate logloss {cand:.6f} is finite")
    champ = float(champion.get("logloss", math.nan))
    if not math.isfinite(champ):
        return GateDecision(True, f"champion logloss is {champ}; candidate logloss {cand:.6f} is finite")
    return within_tolerance(cand, champ, tolerance, allowance=allowance)


def within_tolerance(
    cand: float,
    champ: float,
    tolerance: float,
    metric: str = "logloss",
    kind: str = "worse_than_champion",
    *,
    allowance: float = 0.0,
) -> GateDecision:
    """The comparison itself: refused (``kind``) if the candidate's ``metric`` exceeds the champion's
    times ``1 + tolerance`` plus ``allowance`` (the click gate's, and the conversion gate's in
    :mod:`trainers.multitask`)."""
    bound = f"champion {champ:.6f} * (1 + {tolerance:g})" + (
        f" + {allowance:.6f} (chance)" if allowance else ""
    )
    if cand > champ * (1.0 + tolerance) + allowance:
        return GateDecision(False, f"candidate {metric} {cand:.6f} > {bound}", kind)
    return GateDecision(True, f"candidate {metric} {cand:.6f} <= {bound}")
