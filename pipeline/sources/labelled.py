"""Labelled logs (Avazu, Criteo, Open Bandit: one row per impression with a click label) as streams
of impressions and clicks: each clicked row gets its click a seeded lognormal delay later."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from pipeline.core.types import EventKind

__all__ = ["labelled_events"]


def labelled_events(
    rows: Iterable[tuple[dict[str, Any] | bytes, int | None, bool]],
    seed: int,
    median_ms: float,
    sigma: float,
    max_ms: int,
) -> Iterator[tuple[EventKind, bytes | dict[str, Any], int | None]]:
    """Labelled log rows ``(impression, ts, clicked)`` -> impression and click events in ``ts`` order.

    A clicked row gets a click a seeded lognormal delay later (median ``median_ms``, shape ``sigma``,
    capped at ``max_ms``). A row without ``ts`` (unreadable) is delivered at once, as it is, for the
    validator to dead-letter.
    """
    rng = np.random.default_rng(seed)
    clicks: list[tuple[int, int, dict[str, Any]]] = []  # heap of (ts, tie-break, click)
    tie = itertools.count()
    for imp, ts, clicked in rows:
        if ts is None or not isinstance(imp, dict):
            yield "impression", imp, None
            continue
        while clicks and clicks[0][0] < ts:
            c_ts, _, click = heapq.heappop(clicks)
            yield "click", click, c_ts
        yield "impression", imp, ts
        if clicked:
            delay = median_ms * math.exp(sigma * float(rng.standard_normal()))
            c_ts = ts + min(max(1, round(delay)), max_ms)
            iid = imp["impression_id"]
            click = {"click_id": f"clk-{iid}", "impression_id": iid, "ts": c_ts, "user_id": imp["user_id"]}
            heapq.heappush(clicks, (c_ts, next(tie), click))
    while clicks:
        c_ts, _, click = heapq.heappop(clicks)
        yield "click", click, c_ts
