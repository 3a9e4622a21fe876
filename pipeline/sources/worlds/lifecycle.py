"""World ``lifecycle``: display ads that are born, peak and wear out, shown in ranked slots; CTR ~0.5%.

The mechanisms of a real display-ad log that the project's simulator does not have:

- **Item life cycles and cold start**: new ads arrive all the time (a Poisson process, one every
  ``item_every_s`` on average), each with its own exposure half-life (lognormal across ads, median
  ``half_life_median_s``). A new ad gets extra exploration traffic that fades over ``launch_s``;
  then its traffic decays, and so does its click logit (creative wear-out, ``fatigue`` per
  half-life of age). So most traffic at any hour goes to ads that a model frozen a day ago never saw.
- **Position bias** (the position-based model of Craswell et al. 2008 / Joachims et al. 2017):
  ``P(click) = examine[position] * sigmoid(relevance)``, and the ranker puts ads it likes (a noisy
  view of their quality) in the top slots, so position and ad quality are confounded.
- **Daily seasonality** of both traffic (peak at 20:00 UTC) and click propensity (peak at 21:00).
- **Low CTR** (``base_ctr`` 0.5%) and a long tail of users seen once (a Zipf(1) pool of 300k).
- Relevance: the ad's quality (advertiser + own), the user's segment (age band, gender: observed
  features) x the ad's category, an individual taste per user and category (not observed), device.

Clicks follow a lognormal delay (median 45 s; ~1% past a 15-minute window). Everything is seeded.

Conversions (off by default: ``conversions.rate`` 0) follow some clicks, later
(:mod:`pipeline.sources.conversions`), with a hidden model that is not the click model: logit ``c0 +
0.8 * shop[advertiser]`` (its landing page and prices, N(0, 1), unrelated to its ad quality) ``+ a
device effect`` (desktop converts best) ``+ 0.5 * segment affinity`` (half its click weight).

>>> w = LifecycleWorld(seed=1)
>>> kind, event = next(iter(w.stream(3)))
>>> kind, event["impression_id"], event["features"]["position"] in {"1", "2", "3", "4", "5"}
('impression', 'lifecycle-0', True)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from pipeline.sources.conversions import ConversionModel, ConversionSpec
from pipeline.sources.worlds.base import Columns, World, arrivals, intercept, lognormal_ms, sigmoid

__all__ = ["LifecycleParams", "LifecycleWorld"]

STEP_S = 600.0  # ads are born and their exposure is re-weighed every 10 minutes of event time
_DEVICES = ("mobile", "desktop", "tablet")
_DEVICE_P = np.array([0.65, 0.28, 0.07])
_DEVICE_EFFECT = np.array([0.0, -0.25, 0.1])
_CONVERSION_DEVICE_EFFECT = np.array([-0.2, 0.4, 0.0])  # checkout is easier on a desktop
_AGES = ("18-24", "25-34", "35-44", "45-54", "55-64", "65+")
_GENDERS = ("f", "m", "u")
_POS_CUTS = np.array([-0.84, -0.25, 0.25, 0.84])  # standard-normal quintiles: 5 equally used slots


@dataclass(frozen=True)
class LifecycleParams:
    """The world's knobs; the defaults are the quality suite's ``lifecycle`` world."""

    start_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    events_per_s: float = 1.2  # mean impressions per second (the day's cycle swings around it)
    traffic_swing: float = 0.5  # relative diurnal swing of traffic
    ctr_swing: float = 0.25  # diurnal swing of the click logit
    base_ctr: float = 0.005  # mean click probability (all delays)
    users: int = 300_000
    user_zipf: float = 1.0
    regions: int = 20
    categories: int = 16
    advertisers: int = 200
    initial_ads: int = 400  # the catalogue at the start, of ages up to a day
    item_every_s: float = 120.0  # mean time between new ads
    half_life_median_s: float = 6 * 3_600.0  # an ad's exposure half-life (lognormal across ads)
    half_life_sigma: float = 0.7
    fatigue: float = 0.4  # click logit lost per half-life of age (creative wear-out)
    launch_boost: float = 3.0  # extra exposure of a brand-new ad (exploration), fading over launch_s
    launch_s: float = 1_800.0
    examine: tuple[float, ...] = (1.0, 0.6, 0.4, 0.27, 0.18)  # P(slot 1..5 is looked at)
    click_delay_median_s: float = 45.0
    click_delay_sigma: float = 1.3
    click_delay_max_s: float = 3_600.0
    conversions: ConversionSpec = field(default_factory=ConversionSpec)  # clicks that convert; default: none


class _Ads:
    """The catalogue: ads born so far, each with its birth, half-life, quality and ranker score."""

    def __init__(self, p: LifecycleParams, seed: int) -> None:
        self.p, self.seed = p, seed
        rng = np.random.default_rng([seed, 4])
        self.adv_quality = rng.normal(0.0, 0.3, p.advertisers)
        self.adv_price = rng.lognormal(-1.0, 0.5, p.advertisers)
        w = np.arange(1, p.advertisers + 1, dtype=np.float64) ** -1.0
        self.adv_p = w[rng.permutation(p.advertisers)] / w.sum()
        self.cols: dict[str, np.ndarray] = {
            k: np.empty(0) for k in ("birth", "hl", "q", "rank", "cat", "adv")
        }
        self._add(rng, -rng.uniform(0.0, 86_400.0, p.initial_ads))
        self.step = -1

    def _add(self, rng: np.random.Generator, births: np.ndarray) -> None:
        n, p = births.size, self.p
        adv = rng.choice(p.advertisers, n, p=self.adv_p)
        q = self.adv_quality[adv] + rng.normal(0.0, 0.4, n)
        new = {
            "birth": births,
            "hl": p.half_life_median_s * np.exp(p.half_life_sigma * rng.standard_normal(n)),
            "q": q,
            "rank": 0.8 * q + rng.normal(0.0, 0.5, n),  # the ranker's (noisy) view of quality
            "cat": rng.integers(0, p.categories, n),
            "adv": adv,
        }
        self.cols = {k: np.concatenate([self.cols[k], new[k]]) for k in self.cols}

    def advance_to(self, step: int) -> None:
        while self.step < step:
            self.step += 1
            rng = np.random.default_rng([self.seed, 5, self.step])
            born = rng.poisson(STEP_S / self.p.item_every_s)
            self._add(rng, self.step * STEP_S + np.sort(rng.uniform(0.0, STEP_S, born)))

    def age(self, ads: np.ndarray, t_s: np.ndarray) -> np.ndarray:
        return np.maximum(t_s - self.cols["birth"][ads], 0.0)

    def exposure_cdf(self, t_s: float) -> np.ndarray:
        """Traffic share of every ad at ``t_s``: ranker score, decay by age, launch exploration."""
        c, p = self.cols, self.p
        age = t_s - c["birth"]
        w = np.exp(c["rank"]) * np.exp2(-np.maximum(age, 0) / c["hl"])
        w *= 1.0 + p.launch_boost * np.exp(-np.maximum(age, 0) / p.launch_s)
        w[age < 0] = 0.0  # not born yet
        cdf = np.cumsum(w / w.sum())
        cdf[-1] = 1.0
        return cdf


class LifecycleWorld(World):
    """Ads with life cycles in ranked slots, daily seasonality, CTR ~0.5%; see the module docstring."""

    name = "lifecycle"

    def __init__(self, seed: int, params: LifecycleParams | None = None) -> None:
        p = params or LifecycleParams()
        super().__init__(seed, p.start_ms)
        self.p = p
        rng = np.random.default_rng([seed, 0])
        w = np.arange(1, p.users + 1, dtype=np.float64) ** -p.user_zipf
        self.user_cdf = np.cumsum(w[rng.permutation(p.users)] / w.sum())
        self.user_cdf[-1] = 1.0
        self.user_seg = rng.integers(0, len(_AGES) * len(_GENDERS), p.users)
        self.user_region = rng.integers(0, p.regions, p.users)
        self.user_device = rng.choice(len(_DEVICES), p.users, p=_DEVICE_P)
        self.taste = rng.normal(0.0, 0.5, (p.users, p.categories)).astype(np.float32)
        self.seg_affinity = rng.normal(0.0, 0.6, (len(_AGES) * len(_GENDERS), p.categories))
        self.examine = np.asarray(p.examine, np.float64)
        self.conv = ConversionModel(p.conversions, seed, p.advertisers, _CONVERSION_DEVICE_EFFECT)
        self.b0 = 0.0
        z, scale, zc = [], [], []
        for i, (_, _, zi, ex, zci) in enumerate(self._draw()):  # the first 20k impressions fix b0, c0
            z.append(zi)
            scale.append(ex)
            zc.append(zci)
            if i == 3:
                break
        self.b0 = intercept(np.concatenate(z), p.base_ctr, np.concatenate(scale))
        p_click = np.concatenate(scale) * sigmoid(np.concatenate(z) + self.b0)
        self.conv.calibrate(np.concatenate(zc), p_click)

    def _rate(self, t_s: np.ndarray) -> np.ndarray:
        p = self.p
        hour = (self.start_ms / 1000 + t_s) / 3_600.0
        return p.events_per_s * (1 + p.traffic_swing * np.cos(2 * np.pi * (hour - 20) / 24))

    def _draw(self) -> Iterator[tuple[Columns, np.random.Generator, np.ndarray, np.ndarray, np.ndarray]]:
        """Chunks without clicks: the columns, the chunk's generator, the logit, P(examined) and the
        conversion logit (without intercepts)."""
        p, ads, t = self.p, _Ads(self.p, self.seed), 0.0
        for ci in itertools.count():
            rng = np.random.default_rng([self.seed, 2, ci])
            t_s = arrivals(rng, t, self.chunk, self._rate, p.events_per_s * (1 + p.traffic_swing))
            t = float(t_s[-1])
            steps = (t_s // STEP_S).astype(np.int64)
            items = np.empty(t_s.size, np.int64)
            for s in range(int(steps[0]), int(steps[-1]) + 1):
                at = steps == s
                ads.advance_to(s)
                cdf = ads.exposure_cdf((s + 0.5) * STEP_S)
                items[at] = np.searchsorted(cdf, rng.random(int(at.sum())), side="right")
            users = np.searchsorted(self.user_cdf, rng.random(t_s.size), side="right")
            own = rng.random(t_s.size) < 0.85
            dev = np.where(own, self.user_device[users], rng.choice(len(_DEVICES), t_s.size, p=_DEVICE_P))
            c = ads.cols
            cat, adv = c["cat"][items].astype(np.int64), c["adv"][items].astype(np.int64)
            pos = np.searchsorted(_POS_CUTS, -c["rank"][items] + rng.normal(0.0, 0.8, t_s.size))
            ts = self.start_ms + np.round(t_s * 1000).astype(np.int64)
            hour_f = ((ts / 3_600_000) % 24).astype(np.float64)
            age_hl = ads.age(items, t_s) / c["hl"][items]
            z = (
                c["q"][items]
                + self.seg_affinity[self.user_seg[users], cat]
                + self.taste[users, cat]
                + _DEVICE_EFFECT[dev]
                + p.ctr_swing * np.cos(2 * np.pi * (hour_f - 21) / 24)
                - p.fatigue * age_hl
            )
            seg = self.user_seg[users]
            cols = Columns(
                ts=ts,
                users=[f"u{u}" for u in users.tolist()],
                items=[f"ad{i}" for i in items.tolist()],
                features={
                    "position": [str(k + 1) for k in pos.tolist()],
                    "hour": self.hours(ts),
                    "device": [_DEVICES[d] for d in dev.tolist()],
                    "age_band": [_AGES[s // len(_GENDERS)] for s in seg.tolist()],
                    "gender": [_GENDERS[s % len(_GENDERS)] for s in seg.tolist()],
                    "region": [f"r{r}" for r in self.user_region[users].tolist()],
                    "ad_category": [f"cat{k}" for k in cat.tolist()],
                    "advertiser": [f"adv{a}" for a in adv.tolist()],
                },
                dense={"bid": ads.adv_price[adv] * np.exp(-0.1 * pos + 0.2 * rng.standard_normal(t_s.size))},
                p=np.zeros(t_s.size),
                delay_ms=np.full(t_s.size, -1, np.int64),
            )
            yield cols, rng, z, self.examine[pos], self.conv.logit(adv, dev, self.seg_affinity[seg, cat])

    def _chunks(self) -> Iterator[Columns]:
        p = self.p
        for ci, (cols, rng, z, examine, zc) in enumerate(self._draw()):
            cols.p = examine * sigmoid(z + self.b0)
            clicked = rng.random(len(cols)) < cols.p
            delay = lognormal_ms(
                rng, len(cols), p.click_delay_median_s, p.click_delay_sigma, p.click_delay_max_s
            )
            cols.delay_ms = np.where(clicked, delay, -1)
            if p.conversions.rate > 0:  # from generators of their own: the clicks stay as they are
                cols.conv_ms, cols.conv_value = self.conv.draw(ci, zc, clicked)
            yield cols
