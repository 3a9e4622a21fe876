"""World ``shifts``: abrupt interest shifts, bursts of new users and clicks long after the window; CTR ~2-3%.

The mechanisms of a real feed/app ad log that the project's simulator does not have:

- **Abrupt global interest shifts** (a news event, a sale, a season change): at random times (a
  Poisson process, every ``shift_every_s`` on average) the whole population's trending categories
  are redrawn at once (``trend_strength`` on the logit), and a ``shift_users`` share of known users
  get new tastes. The simulator instead moves every user slowly and redraws a few on a fixed clock.
- **Bursts of new users** (an install campaign, a viral post): at random times, for an hour or two,
  extra traffic (``burst_extra`` x the base rate) comes from brand-new user ids, a few impressions
  each, with their own tastes, lower intent (``burst_offset``), mostly on mobile and mostly tagged
  ``channel=campaign``. No model has seen these users; only shared features transfer.
- **Heavy-tailed click delays**: ``fast_share`` of clicks come within a minute or so (lognormal,
  median 40 s), the rest much later (median 30 min, sigma 1.5, up to a day): ~20% of clicks land
  past a 15-minute attribution window, so the joined labels carry fake negatives, as in production.
- CTR: ``base_ctr`` 2.5% over all delays at the start (~3-3.5% once the trends move, ~2.5-3%
  attributed); relevance = user topics · ad topics + the current trend of the ad's category + ad
  quality + publisher (and its match with the ad) + slot + device + a mild daily cycle.

>>> w = ShiftsWorld(seed=1)
>>> kind, event = next(iter(w.stream(3)))
>>> kind, sorted(event["features"])[:3]
('impression', ['ad_category', 'channel', 'device'])
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.sources.worlds.base import Columns, LogitWorld, arrivals, lognormal_ms, zipf_cdf

__all__ = ["ShiftsParams", "ShiftsWorld"]

_DEVICES = ("mobile", "desktop", "tablet")
_DEVICE_P = np.array([0.55, 0.35, 0.10])
_BURST_DEVICE_P = np.array([0.9, 0.05, 0.05])
_DEVICE_EFFECT = np.array([0.1, -0.2, 0.0])
_SLOT_EFFECT = np.array([0.35, 0.0, -0.35])
_SITE_CATEGORIES = 12


@dataclass(frozen=True)
class ShiftsParams:
    """The world's knobs; the defaults are the quality suite's ``shifts`` world."""

    start_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    events_per_s: float = 1.6  # base impressions per second (bursts add to it)
    base_ctr: float = 0.025  # mean click probability over all delays (outside bursts)
    users: int = 100_000
    user_zipf: float = 0.9
    items: int = 4_000
    item_zipf: float = 0.9
    categories: int = 24
    topics: int = 6
    publishers: int = 300
    publisher_zipf: float = 1.1
    interest_strength: float = 1.0  # logit weight of user topics · ad topics
    trend_strength: float = 0.9  # logit weight of the current regime's trend of the ad's category
    shift_every_s: float = 8 * 3_600.0  # mean time between abrupt shifts
    shift_users: float = 0.25  # share of known users whose tastes are redrawn at a shift
    burst_every_s: float = 10 * 3_600.0  # mean time between bursts of new users
    burst_median_s: float = 5_400.0  # burst duration (lognormal, sigma 0.4)
    burst_extra: float = 1.5  # extra traffic in a burst, times the base rate
    burst_user_impressions: float = 3.0  # mean impressions per new user of a burst
    burst_offset: float = -0.5  # logit offset of burst users (lower intent)
    fast_share: float = 0.7  # clicks that come quickly
    fast_median_s: float = 40.0
    fast_sigma: float = 1.0
    slow_median_s: float = 1_800.0  # the others: much later
    slow_sigma: float = 1.5
    delay_max_s: float = 86_400.0


class _Timeline:
    """Shift times and burst intervals, drawn lazily in order from their own generators."""

    def __init__(self, p: ShiftsParams, seed: int) -> None:
        self.p, self.seed = p, seed
        self._shift_rng = np.random.default_rng([seed, 4])
        self._burst_rng = np.random.default_rng([seed, 6])
        self.shifts: list[float] = [float(self._shift_rng.exponential(p.shift_every_s))]
        first = float(self._burst_rng.exponential(p.burst_every_s))
        self.bursts: list[tuple[float, float]] = [(first, first + self._duration())]

    def _duration(self) -> float:
        return self.p.burst_median_s * math.exp(0.4 * float(self._burst_rng.standard_normal()))

    def cover(self, t_s: float) -> None:
        while self.shifts[-1] <= t_s:
            self.shifts.append(self.shifts[-1] + float(self._shift_rng.exponential(self.p.shift_every_s)))
        while self.bursts[-1][0] <= t_s:
            start = self.bursts[-1][1] + float(self._burst_rng.exponential(self.p.burst_every_s))
            self.bursts.append((start, start + self._duration()))

    def burst_of(self, t_s: np.ndarray) -> np.ndarray:
        """Index of the burst each time falls in, or -1."""
        starts = np.array([b[0] for b in self.bursts])
        ends = np.array([b[1] for b in self.bursts])
        k = np.searchsorted(starts, t_s, side="right") - 1
        inside = (k >= 0) & (t_s < ends[np.maximum(k, 0)])
        return np.where(inside, k, -1)


class ShiftsWorld(LogitWorld):
    """Abrupt shifts, new-user bursts, heavy-tailed click delays; see the module docstring."""

    name = "shifts"

    def __init__(self, seed: int, params: ShiftsParams | None = None) -> None:
        p = params or ShiftsParams()
        super().__init__(seed, p.start_ms)
        self.p = p
        rng = np.random.default_rng([seed, 0])
        self.user_cdf = zipf_cdf(p.users, p.user_zipf, rng)
        self.item_cdf = zipf_cdf(p.items, p.item_zipf, rng)
        self.pub_cdf = zipf_cdf(p.publishers, p.publisher_zipf, rng)
        cat_vec = rng.standard_normal((p.categories, p.topics)) / math.sqrt(p.topics)
        self.item_cat = rng.integers(0, p.categories, p.items)
        self.item_vec = cat_vec[self.item_cat] + 0.3 * rng.standard_normal((p.items, p.topics))
        self.item_quality = rng.normal(0.0, 0.4, p.items)
        self.item_price = rng.lognormal(-1.0, 0.5, p.items)
        self.pub_effect = rng.normal(0.0, 0.4, p.publishers)
        self.pub_cat = rng.integers(0, _SITE_CATEGORIES, p.publishers)
        self.user_device = rng.choice(len(_DEVICES), p.users, p=_DEVICE_P)
        self._fit_intercept(p.base_ctr)

    def _draw(self) -> Iterator[tuple[Columns, np.random.Generator, np.ndarray]]:
        p, line, t = self.p, _Timeline(self.p, self.seed), 0.0
        users_vec = np.random.default_rng([self.seed, 1]).standard_normal((p.users, p.topics))
        regime = 0
        trend = np.random.default_rng([self.seed, 8, 0]).standard_normal(p.categories)
        pools: dict[int, np.ndarray] = {}  # burst -> its new users' topic vectors

        def rate(t_s: np.ndarray) -> np.ndarray:
            line.cover(float(t_s[-1]))
            diurnal = 1 + 0.3 * np.cos(2 * np.pi * ((self.start_ms / 1000 + t_s) / 3_600 - 19) / 24)
            return p.events_per_s * diurnal * (1 + p.burst_extra * (line.burst_of(t_s) >= 0))

        for ci in itertools.count():
            rng = np.random.default_rng([self.seed, 2, ci])
            t_s = arrivals(rng, t, self.chunk, rate, p.events_per_s * 1.3 * (1 + p.burst_extra))
            t = float(t_s[-1])
            line.cover(t)
            n = t_s.size
            burst = line.burst_of(t_s)
            share = p.burst_extra / (1 + p.burst_extra)
            new_user = (burst >= 0) & (rng.random(n) < share)
            users = np.searchsorted(self.user_cdf, rng.random(n), side="right")
            items = np.searchsorted(self.item_cdf, rng.random(n), side="right")
            cat = self.item_cat[items]
            u_vec, trend_now = np.empty((n, p.topics)), np.empty(n)
            user_ids: list[str] = [""] * n
            regime_at = np.searchsorted(np.array(line.shifts), t_s, side="right")
            for r in range(int(regime_at[0]), int(regime_at[-1]) + 1):
                while regime < r:  # apply the shifts up to regime r, in order
                    regime += 1
                    srng = np.random.default_rng([self.seed, 8, regime])
                    trend = srng.standard_normal(p.categories)
                    moved = srng.random(p.users) < p.shift_users
                    users_vec[moved] = srng.standard_normal((int(moved.sum()), p.topics))
                at = regime_at == r
                u_vec[at] = users_vec[users[at]]
                trend_now[at] = trend[cat[at]]
            for k in np.unique(burst[new_user]).tolist():
                if k not in pools:
                    start, end = line.bursts[k]
                    size = max(
                        1, round(p.burst_extra * p.events_per_s * (end - start) / p.burst_user_impressions)
                    )
                    pools[k] = np.random.default_rng([self.seed, 10, k]).standard_normal((size, p.topics))
                at = new_user & (burst == k)
                j = rng.integers(0, pools[k].shape[0], int(at.sum()))
                u_vec[at] = pools[k][j]
                for i, jj in zip(np.flatnonzero(at).tolist(), j.tolist(), strict=True):
                    user_ids[i] = f"b{k}-{jj}"
            for i in np.flatnonzero(~new_user).tolist():
                user_ids[i] = f"u{users[i]}"
            pubs = np.searchsorted(self.pub_cdf, rng.random(n), side="right")
            own = rng.random(n) < 0.85
            dev = np.where(own, self.user_device[users], rng.choice(len(_DEVICES), n, p=_DEVICE_P))
            dev = np.where(new_user, rng.choice(len(_DEVICES), n, p=_BURST_DEVICE_P), dev)
            slot = rng.integers(0, len(_SLOT_EFFECT), n)
            campaign = np.where(new_user, rng.random(n) < 0.8, rng.random(n) < 0.05)
            ts = self.start_ms + np.round(t_s * 1000).astype(np.int64)
            hour_f = ((ts / 3_600_000) % 24).astype(np.float64)
            z = (
                p.interest_strength * np.einsum("nk,nk->n", u_vec, self.item_vec[items])
                + p.trend_strength * trend_now
                + self.item_quality[items]
                + self.pub_effect[pubs]
                + 0.4 * (self.pub_cat[pubs] == cat % _SITE_CATEGORIES)
                + _SLOT_EFFECT[slot]
                + _DEVICE_EFFECT[dev]
                + p.burst_offset * new_user
                + 0.15 * np.cos(2 * np.pi * (hour_f - 21) / 24)
            )
            cols = Columns(
                ts=ts,
                users=user_ids,
                items=[f"it{i}" for i in items.tolist()],
                features={
                    "site": [f"pub{k}" for k in pubs.tolist()],
                    "site_category": [f"sc{self.pub_cat[k]}" for k in pubs.tolist()],
                    "device": [_DEVICES[d] for d in dev.tolist()],
                    "slot": [str(s) for s in slot.tolist()],
                    "hour": self.hours(ts),
                    "channel": ["campaign" if c else "organic" for c in campaign.tolist()],
                    "ad_category": [f"cat{k}" for k in cat.tolist()],
                },
                dense={"price": self.item_price[items] * np.exp(0.2 * rng.standard_normal(n))},
                p=np.zeros(n),
                delay_ms=np.full(n, -1, np.int64),
            )
            yield cols, rng, z

    def _delays(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.p
        fast = lognormal_ms(rng, n, p.fast_median_s, p.fast_sigma, p.delay_max_s)
        slow = lognormal_ms(rng, n, p.slow_median_s, p.slow_sigma, p.delay_max_s)
        return np.where(rng.random(n) < p.fast_share, fast, slow)
