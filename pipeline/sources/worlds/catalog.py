"""World ``catalog``: a churning catalogue whose items' quality wanders; heavy users; CTR ~7-8%.

Written after the quality suite's defaults were chosen, to check them on mechanisms no other world
has (``benchmarks/README.md`` says what it measured first, before it joined the suite):

- **Catalogue churn with decaying popularity**: new items arrive all the time (a Poisson process,
  one every ``item_every_s``); an item's share of traffic is its own popularity (Pareto) times
  ``exp(-age / popularity_decay_s)``, so the traffic moves to new items within a day.
- **Quality in a random walk**: every hour, each item's quality takes a step of its own volatility
  (``quality_walk`` times a half-normal draw per item): what an item earned yesterday drifts.
- **Advertisers carry over**: items share an advertiser (``advertisers``), whose effect on the
  logit a new item inherits; the only thing that transfers to an item nobody has seen, with its
  category and the user's tastes.
- **An upstream quality score as a dense input** (``quality``: the item's current quality plus
  noise, ``quality_noise``), and a per-impression price with an elasticity (``price``): dense
  inputs that carry real signal.
- **Heavy users**: user activity is Zipf(``user_zipf`` 1.3): a few users make a large share of the
  traffic, most are seen a few times.
- Relevance: user bias + user topics · item topics + item quality + advertiser + site + device +
  slot + a daily cycle (peak at 14:00 UTC) - elasticity x log(price). Clicks come a lognormal
  delay later (median 90 s, sigma 1.3, ~6% past a 15-minute window, capped at 6 h).

>>> w = CatalogWorld(seed=1)
>>> kind, event = next(iter(w.stream(3)))
>>> kind, sorted(event["dense"]), event["features"]["advertiser"][:3]
('impression', ['price', 'quality'], 'adv')
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.sources.worlds.base import Columns, LogitWorld, arrivals, lognormal_ms, zipf_cdf

__all__ = ["CatalogParams", "CatalogWorld"]

STEP_S = 600.0  # items' traffic shares are re-weighed every 10 minutes of event time
_ITEM_BATCH = 1_000  # items are drawn this many at a time, each batch from its own generator
_DEVICES = ("ios", "android", "desktop")
_DEVICE_EFFECT = np.array([0.15, 0.0, -0.3])
_SLOT_EFFECT = np.array([0.5, 0.1, -0.2, -0.5])


@dataclass(frozen=True)
class CatalogParams:
    """The world's knobs; the defaults are the quality suite's ``catalog`` world."""

    start_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    events_per_s: float = 2.3  # mean impressions per second
    base_ctr: float = 0.075
    users: int = 60_000
    user_zipf: float = 1.3
    items_at_start: int = 3_000
    item_every_s: float = 43.0  # mean time between new items
    popularity_decay_s: float = 72_000.0  # an item's traffic share falls by e every 20 h of age
    advertisers: int = 400
    categories: int = 40
    sites: int = 800
    site_zipf: float = 1.4
    topics: int = 6
    interest_strength: float = 1.0  # logit weight of user topics · item topics (each N(0, 0.5))
    quality_walk: float = 0.04  # scale of the items' hourly quality steps
    quality_noise: float = 0.5  # noise of the dense quality score around the item's quality
    price_elasticity: float = 0.2
    daily_swing: float = 0.35  # logit amplitude of the daily cycle
    delay_median_s: float = 90.0
    delay_sigma: float = 1.3
    delay_max_s: float = 21_600.0


class _Items:
    """The catalogue: items drawn in batches as time needs them, and their quality's random walk."""

    def __init__(self, p: CatalogParams, seed: int) -> None:
        self.p, self.seed = p, seed
        self.birth_s = np.zeros(0)
        self.cat = np.zeros(0, np.int64)
        self.adv = np.zeros(0, np.int64)
        self.vec = np.zeros((0, p.topics))
        self.quality = np.zeros(0)
        self.walk = np.zeros(0)
        self.pop = np.zeros(0)
        self.hour = 0  # quality has walked up to the start of this hour
        self._births = np.random.default_rng([seed, 4])
        self._last_birth = 0.0

    def _grow(self) -> None:
        p, b = self.p, self.birth_s.size // _ITEM_BATCH
        rng = np.random.default_rng([self.seed, 5, b])
        if b * _ITEM_BATCH < p.items_at_start:
            births = np.zeros(_ITEM_BATCH)
        else:
            births = self._last_birth + np.cumsum(self._births.exponential(p.item_every_s, _ITEM_BATCH))
            self._last_birth = float(births[-1])
        self.birth_s = np.concatenate([self.birth_s, births])
        self.cat = np.concatenate([self.cat, rng.integers(0, p.categories, _ITEM_BATCH)])
        self.adv = np.concatenate([self.adv, rng.integers(0, p.advertisers, _ITEM_BATCH)])
        self.vec = np.concatenate([self.vec, rng.normal(0.0, 0.5, (_ITEM_BATCH, p.topics))])
        self.quality = np.concatenate([self.quality, rng.normal(0.0, 0.5, _ITEM_BATCH)])
        self.walk = np.concatenate([self.walk, p.quality_walk * np.abs(rng.standard_normal(_ITEM_BATCH))])
        self.pop = np.concatenate([self.pop, rng.pareto(1.2, _ITEM_BATCH) + 0.05])

    def at(self, t_s: float) -> np.ndarray:
        """The items' traffic shares at ``t_s`` (0 for those not born yet), their quality walked to it."""
        while self.birth_s.size < self.p.items_at_start or self.birth_s[-1] <= t_s:
            self._grow()
        while self.hour <= int(t_s // 3_600):
            step = np.random.default_rng([self.seed, 3, self.hour]).standard_normal(self.quality.size)
            self.quality += self.walk * step
            self.hour += 1
        age = t_s - self.birth_s
        share = np.where(age >= 0, self.pop * np.exp(-np.maximum(age, 0.0) / self.p.popularity_decay_s), 0.0)
        return share / share.sum()


class CatalogWorld(LogitWorld):
    """Catalogue churn, wandering item quality, advertisers, heavy users; see the module docstring."""

    name = "catalog"

    def __init__(self, seed: int, params: CatalogParams | None = None) -> None:
        p = params or CatalogParams()
        super().__init__(seed, p.start_ms)
        self.p = p
        rng = np.random.default_rng([seed, 0])
        self.user_cdf = zipf_cdf(p.users, p.user_zipf, rng)
        self.site_cdf = zipf_cdf(p.sites, p.site_zipf, rng)
        self.user_vec = rng.normal(0.0, 0.5, (p.users, p.topics))
        self.user_bias = rng.normal(0.0, 0.4, p.users)
        self.user_device = rng.integers(0, len(_DEVICES), p.users)
        self.site_effect = rng.normal(0.0, 0.5, p.sites)
        self.site_cat = rng.integers(0, 25, p.sites)
        self.adv_effect = rng.normal(0.0, 0.4, p.advertisers)
        self._fit_intercept(p.base_ctr)

    def _draw(self) -> Iterator[tuple[Columns, np.random.Generator, np.ndarray]]:
        p, items, t = self.p, _Items(self.p, self.seed), 0.0
        for ci in itertools.count():
            rng = np.random.default_rng([self.seed, 2, ci])
            t_s = arrivals(rng, t, self.chunk, lambda s: np.full(s.size, p.events_per_s), p.events_per_s)
            t = float(t_s[-1])
            n = t_s.size
            item, quality = np.empty(n, np.int64), np.empty(n)
            step = (t_s // STEP_S).astype(np.int64)
            for s in np.unique(step).tolist():
                at = step == s
                cdf = np.cumsum(items.at(s * STEP_S))
                item[at] = np.minimum(
                    np.searchsorted(cdf, rng.random(int(at.sum())), side="right"), cdf.size - 1
                )
                quality[at] = items.quality[item[at]]
            users = np.searchsorted(self.user_cdf, rng.random(n), side="right")
            sites = np.searchsorted(self.site_cdf, rng.random(n), side="right")
            slot = rng.integers(0, len(_SLOT_EFFECT), n)
            dev = self.user_device[users]
            price = np.exp(rng.normal(0.0, 0.6, n))
            ts = self.start_ms + np.round(t_s * 1000).astype(np.int64)
            hour_f = (ts / 3_600_000) % 24
            z = (
                self.user_bias[users]
                + p.interest_strength * np.einsum("nk,nk->n", self.user_vec[users], items.vec[item])
                + quality
                + self.adv_effect[items.adv[item]]
                + self.site_effect[sites]
                + _DEVICE_EFFECT[dev]
                + _SLOT_EFFECT[slot]
                + p.daily_swing * np.sin(2 * np.pi * (hour_f - 8) / 24)
                - p.price_elasticity * np.log(price)
            )
            cols = Columns(
                ts=ts,
                users=[f"u{u}" for u in users.tolist()],
                items=[f"it{i}" for i in item.tolist()],
                features={
                    "site": [f"s{k}" for k in sites.tolist()],
                    "site_category": [f"sc{self.site_cat[k]}" for k in sites.tolist()],
                    "device": [_DEVICES[d] for d in dev.tolist()],
                    "slot": [str(s) for s in slot.tolist()],
                    "hour": self.hours(ts),
                    "advertiser": [f"adv{a}" for a in items.adv[item].tolist()],
                    "ad_category": [f"c{c}" for c in items.cat[item].tolist()],
                },
                dense={"price": price, "quality": quality + p.quality_noise * rng.standard_normal(n)},
                p=np.zeros(n),
                delay_ms=np.full(n, -1, np.int64),
            )
            yield cols, rng, z

    def _delays(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.p
        return lognormal_ms(rng, n, p.delay_median_s, p.delay_sigma, p.delay_max_s)
