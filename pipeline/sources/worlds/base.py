"""What every synthetic world shares: arrivals in event time, the intercept, and the ordered stream.

A world draws impressions chunk by chunk (each chunk from its own seeded generator, in order, so the
first ``n`` impressions do not depend on ``n``) as :class:`Columns`: times, ids, features, the hidden
click probability and, for the clicked ones, the delay (and, in a world with conversions, the delay from
click to conversion). :meth:`World.stream` turns them into ``ctr simulate``'s events in arrival order:
impressions at their ``ts``, each click and conversion at its own ``ts`` (one due before a later
impression comes first), however long its delay.

>>> t = arrivals(np.random.default_rng(0), 0.0, 5, lambda s: np.full(s.size, 2.0), 2.0)
>>> bool(np.all(np.diff(t) > 0)), t.size
(True, 5)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.core.types import EventKind
from pipeline.sources.conversions import conversion_event, intercept, lognormal_ms, sigmoid

__all__ = ["Columns", "LogitWorld", "World", "arrivals", "intercept", "lognormal_ms", "sigmoid", "zipf_cdf"]

HOUR_MS = 3_600_000
_HOURS = tuple(f"{h:02d}" for h in range(24))


def arrivals(
    rng: np.random.Generator, t0_s: float, n: int, rate: Callable[[np.ndarray], np.ndarray], max_rate: float
) -> np.ndarray:
    """``n`` arrival times (seconds) after ``t0_s`` of a Poisson process of intensity ``rate(t)``
    (per second, at most ``max_rate``), by thinning: candidates at ``max_rate``, each kept with
    probability ``rate / max_rate``."""
    out: list[np.ndarray] = []
    have, t = 0, t0_s
    while have < n:
        cand = t + np.cumsum(rng.exponential(1.0 / max_rate, 2 * n))
        keep = cand[rng.random(cand.size) * max_rate < rate(cand)]
        out.append(keep)
        have += keep.size
        t = float(cand[-1])
    return np.concatenate(out)[:n]


def zipf_cdf(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """The cumulative shares of ``n`` ids whose popularity is Zipf(``exponent``) in a random order
    (draw an id with ``searchsorted(cdf, u, side="right")``)."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(w[rng.permutation(n)] / w.sum())
    cdf[-1] = 1.0
    return cdf


@dataclass
class Columns:
    """One chunk of impressions, column-wise; ``delay_ms`` is -1 where there is no click."""

    ts: np.ndarray  # int64 epoch ms, non-decreasing
    users: list[str]
    items: list[str]
    features: dict[str, list[str]]  # categorical name -> one value per impression
    dense: dict[str, np.ndarray]  # numeric name -> one value per impression
    p: np.ndarray  # the hidden click probability
    delay_ms: np.ndarray  # int64; >= 1 for a click, -1 for none
    conv_ms: np.ndarray | None = None  # int64 click -> conversion delay; -1 for none (None: no conversions)
    conv_value: np.ndarray | None = None  # the conversion's order value (NaN: none)

    def __len__(self) -> int:
        return int(self.ts.size)


class World:
    """A seeded generator of impressions and clicks; subclasses implement :meth:`_chunk`.

    ``seed`` and :meth:`stream` are what :class:`pipeline.sources.streams.SimulatorSource` reads.
    """

    name = ""
    chunk = 5_000  # impressions per generated chunk: part of the seed -> stream mapping

    def __init__(self, seed: int, start_ms: int) -> None:
        self.seed, self.start_ms = seed, start_ms

    def _chunks(self) -> Iterator[Columns]:
        """Chunks of ``chunk`` impressions, forever, from a fresh state (so a stream is replayable)."""
        raise NotImplementedError

    def hour(self, ts: np.ndarray) -> np.ndarray:
        return (ts // HOUR_MS) % 24

    def columns(self, n_impressions: int) -> Iterator[tuple[int, Columns]]:
        """``(index of the first impression, chunk)`` covering exactly ``n_impressions``."""
        done = 0
        for c in self._chunks():
            if done >= n_impressions:
                return
            keep = min(len(c), n_impressions - done)
            if keep < len(c):
                c = Columns(
                    c.ts[:keep],
                    c.users[:keep],
                    c.items[:keep],
                    {k: v[:keep] for k, v in c.features.items()},
                    {k: v[:keep] for k, v in c.dense.items()},
                    c.p[:keep],
                    c.delay_ms[:keep],
                    None if c.conv_ms is None else c.conv_ms[:keep],
                    None if c.conv_value is None else c.conv_value[:keep],
                )
            yield done, c
            done += keep

    def stream(self, n_impressions: int) -> Iterator[tuple[EventKind, dict[str, Any]]]:
        """``n_impressions`` impressions, their clicks and conversions, in arrival (event-time) order."""
        # (ts, impression index, 1 click | 2 conversion, impression id, user, conversion value)
        pending: list[tuple[int, int, int, str, str, float]] = []
        prefix = self.name
        for first, c in self.columns(n_impressions):
            names, dnames = list(c.features), list(c.dense)
            fcols = [c.features[k] for k in names]
            dcols = [np.round(c.dense[k], 4).tolist() for k in dnames]
            conv = (c.conv_ms if c.conv_ms is not None else np.full(len(c), -1)).tolist()
            value = (c.conv_value if c.conv_value is not None else np.full(len(c), np.nan)).tolist()
            for j, (ts, user, item, delay) in enumerate(
                zip(c.ts.tolist(), c.users, c.items, c.delay_ms.tolist(), strict=True)
            ):
                while pending and pending[0][0] < ts:
                    yield _due(*heapq.heappop(pending))
                imp_id = f"{prefix}-{first + j}"
                yield (
                    "impression",
                    {
                        "impression_id": imp_id,
                        "ts": ts,
                        "user_id": user,
                        "item_id": item,
                        "features": {k: col[j] for k, col in zip(names, fcols, strict=True)},
                        "dense": {k: col[j] for k, col in zip(dnames, dcols, strict=True)},
                    },
                )
                if delay > 0:
                    heapq.heappush(pending, (ts + delay, first + j, 1, imp_id, user, np.nan))
                    if conv[j] > 0:  # one per clicked impression, some time after its click
                        heapq.heappush(pending, (ts + delay + conv[j], first + j, 2, imp_id, user, value[j]))
        while pending:
            yield _due(*heapq.heappop(pending))

    def true_probabilities(self, n_impressions: int) -> dict[str, float]:
        """The hidden click probability of each impression (an oracle, for benchmarks and tests)."""
        prefix = self.name
        return {
            f"{prefix}-{first + j}": p
            for first, c in self.columns(n_impressions)
            for j, p in enumerate(c.p.tolist())
        }

    def hours(self, ts: np.ndarray) -> list[str]:
        return [_HOURS[h] for h in self.hour(ts).tolist()]


class LogitWorld(World):
    """A world that draws each chunk's columns and click logit (:meth:`_draw`), then its clicks:
    probability ``sigmoid(logit + b0)``, ``b0`` fitted (:meth:`_fit_intercept`) so that the first
    20k impressions click at a given rate, and each click's delay from :meth:`_delays`."""

    b0 = 0.0

    def _draw(self) -> Iterator[tuple[Columns, np.random.Generator, np.ndarray]]:
        """Chunks without clicks: the columns, the chunk's generator (clicks and delays are drawn
        from it next) and the logit."""
        raise NotImplementedError

    def _delays(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """A click delay (ms) for each of ``n`` impressions; only the clicked ones' are kept."""
        raise NotImplementedError

    def _fit_intercept(self, ctr: float) -> None:
        self.b0 = 0.0
        z = [zi for _, _, zi in itertools.islice(self._draw(), 4)]  # 20k impressions fix the intercept
        self.b0 = intercept(np.concatenate(z), ctr)

    def _chunks(self) -> Iterator[Columns]:
        for cols, rng, z in self._draw():
            n = len(cols)
            cols.p = sigmoid(z + self.b0)
            clicked = rng.random(n) < cols.p
            cols.delay_ms = np.where(clicked, self._delays(rng, n), -1)
            yield cols


def _due(
    ts: int, _idx: int, kind: int, imp_id: str, user: str, value: float
) -> tuple[EventKind, dict[str, Any]]:
    """The click (``kind`` 1) or conversion (2) of ``imp_id`` due at ``ts``."""
    if kind == 2:
        return conversion_event(imp_id, ts, user, value)
    return "click", {"click_id": f"c{imp_id}", "impression_id": imp_id, "ts": ts, "user_id": user}
