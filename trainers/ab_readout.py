"""Live A/B readout: online CTR, AUC, NE and calibration per served model version, with 95% CIs.

Fed by the joined examples: each impression names the ``model_version`` that served it and,
optionally, the ``score`` (probability) that version returned. Every arm keeps bounded state,
whatever the traffic:

- counts: examples and clicks (all examples of the arm: the CTR), examples and clicks that carried a
  score, the sum of scores, of logloss terms and of their squares (the scored ones: NE, calibration);
- a histogram of scores per label, :data:`BINS` bins uniform in logit over [-10, 10] (a bin spans
  0.02 in logit, i.e. about 2% of the probability near the usual CTRs; scores beyond the range land
  in the end bins): the AUC.

Examples without a ``model_version`` are counted as ``unattributed`` and go in no arm; without a
score an example counts toward the CTR only (AUC, NE and calibration are then ``nan``: the
serving replicas did not log what they predicted). At most ``max_versions`` arms are kept; the one
updated least recently is dropped first.

Estimates and intervals (95%, :data:`Z`):

- CTR: Wilson's score interval (Wilson 1927); a difference of two arms' CTRs: Newcombe's hybrid
  score interval (Newcombe 1998, method 10) from the two Wilson intervals.
- AUC: the Mann-Whitney statistic over the binned scores, ties within a bin counted one half. Its
  distance from the exact AUC is at most ``auc_bin_error`` = ½ Σ_b P_b N_b / (P N) (only pairs in
  the same bin are unordered), reported with it. Standard error: Hanley & McNeil (1982), from the
  AUC and the two class counts; arms see different users, so a difference has the two variances
  summed.
- NE: mean logloss over the entropy of the arm's own click rate; the interval is the mean logloss's
  normal interval (from the sum of squares) over that entropy, which it takes as known.
- calibration: mean score over the observed CTR (1 is calibrated); the interval divides the mean
  score by the ends of the scored examples' Wilson interval (the clicks are what is uncertain).

>>> r = ABReadout()
>>> for i in range(200):
...     r.add("7", int(i % 4 == 0), 0.6 if i % 4 == 0 else 0.2)
>>> s = r.summary()["7"]
>>> s["examples"], s["clicks"], s["ctr"], s["auc"], round(s["calibration"], 3)
(200, 50, 0.25, 1.0, 1.2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainers.metrics import EPS, base_rate_entropy

__all__ = ["BINS", "ABReadout", "ArmStats", "Z", "compare", "hanley_mcneil_se", "wilson"]

BINS = 1000  # score histogram bins per label
_LOGIT_RANGE = 10.0  # bins cover logit in [-10, 10]
Z = 1.959964  # two-sided 95%
_FLUSH_AT = 4096  # buffered examples folded into the arrays in one vectorised step


def wilson(successes: float, n: float, z: float = Z) -> tuple[float, float]:
    """Wilson's score interval for a proportion; (nan, nan) when ``n`` is 0.

    >>> [round(x, 4) for x in wilson(5, 10)]
    [0.2366, 0.7634]
    """
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def hanley_mcneil_se(auc: float, positives: float, negatives: float) -> float:
    """Standard error of an AUC (Hanley & McNeil 1982, eq. 2); nan without both classes."""
    if positives <= 0 or negatives <= 0 or math.isnan(auc):
        return math.nan
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    a2 = auc * auc
    var = (auc * (1 - auc) + (positives - 1) * (q1 - a2) + (negatives - 1) * (q2 - a2)) / (
        positives * negatives
    )
    return math.sqrt(max(var, 0.0))


def _bins(scores: np.ndarray) -> np.ndarray:
    q = np.clip(scores, EPS, 1.0 - EPS)
    logit = np.log(q) - np.log1p(-q)
    idx = np.floor((logit + _LOGIT_RANGE) / (2 * _LOGIT_RANGE) * BINS)
    return np.clip(idx, 0, BINS - 1).astype(np.int64)


class ArmStats:
    """The bounded state of one arm (one model version)."""

    __slots__ = ("clicks", "examples", "hist", "scored", "scored_clicks", "sum_ll", "sum_ll_sq", "sum_score")

    def __init__(self) -> None:
        self.examples = 0
        self.clicks = 0
        self.scored = 0
        self.scored_clicks = 0
        self.sum_score = 0.0
        self.sum_ll = 0.0
        self.sum_ll_sq = 0.0
        self.hist = np.zeros((2, BINS), dtype=np.int64)  # [label, bin]

    def add_many(self, labels: np.ndarray, scores: np.ndarray) -> None:
        """Labels (0/1) and scores (nan where the impression carried none) of this arm's examples."""
        y = np.asarray(labels, dtype=np.int64)
        s = np.asarray(scores, dtype=np.float64)
        self.examples += int(y.size)
        self.clicks += int(y.sum())
        has = ~np.isnan(s)
        y, s = y[has], s[has]
        if not y.size:
            return
        self.scored += int(y.size)
        self.scored_clicks += int(y.sum())
        self.sum_score += float(s.sum())
        q = np.clip(s, EPS, 1.0 - EPS)
        ll = -np.where(y == 1, np.log(q), np.log1p(-q))
        self.sum_ll += float(ll.sum())
        self.sum_ll_sq += float((ll * ll).sum())
        np.add.at(self.hist, (y, _bins(s)), 1)

    def auc(self) -> tuple[float, float]:
        """(binned AUC, its largest distance from the exact AUC); nan without both classes."""
        neg, pos = self.hist[0].astype(np.float64), self.hist[1].astype(np.float64)
        n_neg, n_pos = neg.sum(), pos.sum()
        if n_neg == 0 or n_pos == 0:
            return math.nan, math.nan
        below = np.cumsum(neg) - neg  # negatives in lower bins
        wins = float((pos * (below + 0.5 * neg)).sum())
        ties = float((pos * neg).sum())
        return float(wins / (n_pos * n_neg)), float(0.5 * ties / (n_pos * n_neg))

    def summary(self) -> dict[str, float]:
        """Every estimate with its interval, as plain numbers (nan where undefined)."""
        nan = math.nan
        ctr = self.clicks / self.examples if self.examples else nan
        ctr_lo, ctr_hi = wilson(self.clicks, self.examples)
        auc, auc_err = self.auc()
        se = hanley_mcneil_se(auc, self.scored_clicks, self.scored - self.scored_clicks)
        out = {
            "examples": self.examples,
            "clicks": self.clicks,
            "ctr": ctr,
            "ctr_lo": ctr_lo,
            "ctr_hi": ctr_hi,
            "scored": self.scored,
            "auc": auc,
            "auc_se": se,
            "auc_lo": max(0.0, auc - Z * se) if not math.isnan(se) else nan,
            "auc_hi": min(1.0, auc + Z * se) if not math.isnan(se) else nan,
            "auc_bin_error": auc_err,
        }
        n = self.scored
        rate = self.scored_clicks / n if n else nan
        h = base_rate_entropy(rate) if n else 0.0
        mean_ll = self.sum_ll / n if n else nan
        ll_se = math.sqrt(max(self.sum_ll_sq / n - mean_ll * mean_ll, 0.0) / n) if n else nan
        mean_score = self.sum_score / n if n else nan
        lo, hi = wilson(self.scored_clicks, n)
        out |= {
            "mean_score": mean_score,
            "logloss": mean_ll,
            "ne": mean_ll / h if h > 0 else nan,
            "ne_lo": (mean_ll - Z * ll_se) / h if h > 0 else nan,
            "ne_hi": (mean_ll + Z * ll_se) / h if h > 0 else nan,
            "calibration": mean_score / rate if n and rate > 0 else nan,
            "calibration_lo": mean_score / hi if n and rate > 0 else nan,
            "calibration_hi": mean_score / lo if n and lo > 0 else nan,
        }
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable; the histograms sparse (bin -> count)."""
        return {
            "examples": self.examples,
            "clicks": self.clicks,
            "scored": self.scored,
            "scored_clicks": self.scored_clicks,
            "sum_score": self.sum_score,
            "sum_ll": self.sum_ll,
            "sum_ll_sq": self.sum_ll_sq,
            "hist": [{str(int(b)): int(row[b]) for b in np.flatnonzero(row)} for row in self.hist],
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ArmStats:
        arm = ArmStats()
        for key in ("examples", "clicks", "scored", "scored_clicks"):
            setattr(arm, key, int(d[key]))
        for key in ("sum_score", "sum_ll", "sum_ll_sq"):
            setattr(arm, key, float(d[key]))
        for label, row in enumerate(d["hist"]):
            for b, count in row.items():
                arm.hist[label, int(b)] = int(count)
        return arm


class ABReadout:
    """Per-version :class:`ArmStats`; :meth:`add` buffers, the arrays are updated in batches."""

    def __init__(self, max_versions: int = 32) -> None:
        self.max_versions = max_versions
        self.arms: dict[str, ArmStats] = {}  # insertion order = least recently updated first
        self.unattributed = 0  # examples whose impression named no model version
        self.updated: set[str] = set()  # arms changed since a publisher last cleared them
        self._buf: list[tuple[str, int, float]] = []

    def add(self, version: str | None, label: int, score: float | None) -> None:
        """One joined example: the version that served it, its label and the served score."""
        if version is None:
            self.unattributed += 1
            return
        self._buf.append((version, label, math.nan if score is None else score))
        if len(self._buf) >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Fold the buffered examples into their arms (every reader calls it first)."""
        if not self._buf:
            return
        buf, self._buf = self._buf, []
        versions = np.array([v for v, _, _ in buf], dtype=object)
        labels = np.array([y for _, y, _ in buf], dtype=np.int64)
        scores = np.array([s for _, _, s in buf], dtype=np.float64)
        for version in dict.fromkeys(v for v, _, _ in buf):  # in order of first appearance
            mask = versions == version
            arm = self.arms.pop(version, None) or ArmStats()
            arm.add_many(labels[mask], scores[mask])
            self.arms[version] = arm  # now the most recently updated
            self.updated.add(version)
        while len(self.arms) > self.max_versions:
            self.updated.discard(dropped := next(iter(self.arms)))
            del self.arms[dropped]

    def summary(self) -> dict[str, dict[str, float]]:
        """Version -> :meth:`ArmStats.summary`."""
        self.flush()
        return {v: arm.summary() for v, arm in self.arms.items()}

    def to_dict(self) -> dict[str, Any]:
        self.flush()
        return {"unattributed": self.unattributed, "arms": {v: a.to_dict() for v, a in self.arms.items()}}

    @staticmethod
    def from_dict(d: Mapping[str, Any], max_versions: int = 32) -> ABReadout:
        r = ABReadout(max_versions)
        r.unattributed = int(d.get("unattributed", 0))
        r.arms = {v: ArmStats.from_dict(a) for v, a in d.get("arms", {}).items()}
        r.updated = set(r.arms)  # a publish may have failed before the checkpoint: publish them all again
        return r


def compare(champion: Mapping[str, float], challenger: Mapping[str, float]) -> dict[str, Any]:
    """Challenger minus champion for CTR, AUC and NE, each with its 95% interval and a verdict.

    Takes two :meth:`ArmStats.summary` dicts (or the same keys read back from MLflow). A verdict is
    ``"challenger better"`` or ``"champion better"`` when the interval excludes 0 (NE: lower is
    better), else ``"no clear difference"``; ``"undefined"`` where either arm lacks the metric.
    """
    out: dict[str, Any] = {}
    p1, p2 = champion["ctr"], challenger["ctr"]
    d = p2 - p1
    lo = d - math.sqrt((p2 - challenger["ctr_lo"]) ** 2 + (champion["ctr_hi"] - p1) ** 2)
    hi = d + math.sqrt((challenger["ctr_hi"] - p2) ** 2 + (p1 - champion["ctr_lo"]) ** 2)
    out["ctr"] = (d, lo, hi)
    d = challenger["auc"] - champion["auc"]
    se = math.sqrt(challenger["auc_se"] ** 2 + champion["auc_se"] ** 2)
    out["auc"] = (d, d - Z * se, d + Z * se)
    d = challenger["ne"] - champion["ne"]
    # each arm's NE half-width is Z * its se: the two se's combine in quadrature
    half = math.hypot(
        (challenger["ne_hi"] - challenger["ne_lo"]) / 2, (champion["ne_hi"] - champion["ne_lo"]) / 2
    )
    out["ne"] = (d, d - half, d + half)
    verdicts = {}
    for key, (d, lo, hi) in out.items():
        better = 1 if key != "ne" else -1  # NE: lower is better
        if any(math.isnan(x) for x in (d, lo, hi)):
            verdicts[key] = "undefined"
        elif lo > 0 or hi < 0:
            verdicts[key] = "challenger better" if (d * better) > 0 else "champion better"
        else:
            verdicts[key] = "no clear difference"
    return {"diff": out, "verdict": verdicts}
