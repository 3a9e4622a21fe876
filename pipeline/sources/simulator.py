"""A seeded, deterministic CTR stream with drifting user interests and a known ground truth.

Hidden click model (logit): ``b0 + strength * (interest[user, t] · topic[item]) + popularity[item, t]
+ bias[user] + effects of device, site category (and its match with the item's topic), ad slot and
hour of day``; ``b0`` is solved so the mean click probability is ``base_ctr``. Interests and item
popularity follow Ornstein-Uhlenbeck processes (stationary N(0, 1), half-life ``drift_half_life_s``)
stepped every minute of event time, and every ``shift_every_s`` a ``shift_fraction`` of users is
redrawn at once. A model frozen on the first 100k impressions therefore scores later hours with stale
interests and popularities: with the defaults a frozen FM loses ~0.05-0.07 AUC to an online one
within 600k impressions (measured; the oracle AUC of the hidden model is ~0.90).

Impressions arrive as a Poisson process; each click comes after a lognormal delay. The stream is in
*arrival* order: events are delivered at their ``ts`` except for duplicates (re-sent a little later)
and skewed impressions (delivered just after their quick click, i.e. the click arrives first).
Conversions (``conversion_rate`` > 0) follow some clicks, with a hidden logit ``c0 + 0.8 * quality[item]
+ device effect + 0.5 * interest · topic``, drawn apart from clicks (:mod:`pipeline.sources.conversions`).

Everything is drawn in fixed chunks of :data:`CHUNK` impressions from per-chunk generators, so the
first ``n`` impressions are the same whatever ``n`` a call asks for.

>>> from pipeline.core.config import SimulatorConfig
>>> sim = Simulator(SimulatorConfig(), seed=1)
>>> kind, event = next(iter(sim.stream(10)))
>>> kind, event["impression_id"], sorted(event["features"])
('impression', 'imp-0', ['device', 'hour', 'site_category', 'slot'])
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from pipeline.core.config import SimulatorConfig
from pipeline.core.types import EventKind
from pipeline.sources.conversions import ConversionModel, ConversionSpec, conversion_event, sigmoid

__all__ = ["CHUNK", "Simulator"]

CHUNK = 10_000  # impressions drawn per vectorised step; part of the seed -> stream mapping
STEP_MS = 60_000  # interests move once per minute of event time
DEVICES = ("mobile", "desktop", "tablet", "ctv")
CATEGORIES: tuple[str, ...] = ("news", "sports", "games", "finance", "travel", "shopping")
CATEGORIES += ("social", "video", "music", "weather", "health", "education")
SLOTS = ("0", "1", "2", "3", "4")
_HOURS = tuple(f"{h:02d}" for h in range(24))
_SLOT_EFFECT = np.array([0.5, 0.1, -0.2, -0.5, -0.8])  # top slots are seen, so clicked, more
_SLOT_P = np.array([0.3, 0.25, 0.2, 0.15, 0.1])
_DEVICE_P = np.array([0.6, 0.25, 0.12, 0.03])
_COLS = ("deliv", "order", "kind", "idx", "ts", "user", "item", "dev", "cat", "slot", "bid", "value")


def _zipf_cdf(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """CDF over ids whose activity is Zipf-like in a random rank order (id 0 is not the busiest)."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    w = w[rng.permutation(n)]
    cdf = np.cumsum(w / w.sum())
    cdf[-1] = 1.0
    return cdf


class _Drift:
    """User interests and item popularity over event-time steps: OU moves plus abrupt user shifts."""

    def __init__(self, cfg: SimulatorConfig, seed: int) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng([seed, 1])
        self.u = self.rng.standard_normal((cfg.users, cfg.topics))
        self.pop = self.rng.standard_normal(cfg.items)  # ads wear out or trend; scaled in the logit
        self.step = 0
        self.a = math.exp(-math.log(2) * STEP_MS / 1000 / cfg.drift_half_life_s)
        self.shift_steps = cfg.shift_every_s * 1000 / STEP_MS if cfg.shift_every_s > 0 else 0.0

    def advance_to(self, step: int) -> _Drift:
        """Move to ``step`` (never back); returns self so callers read ``.u`` and ``.pop``."""
        keep, fresh = self.a, math.sqrt(1 - self.a**2)  # keeps the stationary variance at 1
        while self.step < step:
            self.step += 1
            self.u = keep * self.u + fresh * self.rng.standard_normal(self.u.shape)
            self.pop = keep * self.pop + fresh * self.rng.standard_normal(self.pop.shape)
            s = self.shift_steps
            if s and self.cfg.shift_fraction > 0 and int(self.step // s) > int((self.step - 1) // s):
                moved = self.rng.random(self.cfg.users) < self.cfg.shift_fraction
                self.u[moved] = self.rng.standard_normal((int(moved.sum()), self.cfg.topics))
        return self


class Simulator:
    """Deterministic impression/click stream for a seed; see the module docstring for the model."""

    def __init__(self, cfg: SimulatorConfig, seed: int) -> None:
        for name in ("users", "items", "topics", "events_per_s", "drift_half_life_s", "click_delay_median_s"):
            if not getattr(cfg, name) > 0:
                raise ValueError(f"Simulator: SimulatorConfig.{name} = {getattr(cfg, name)!r} must be > 0")
        if not 0 < cfg.base_ctr < 1:
            raise ValueError(f"Simulator: SimulatorConfig.base_ctr = {cfg.base_ctr!r} must be in (0, 1)")
        self.cfg, self.seed = cfg, seed
        rng = np.random.default_rng([seed, 0])
        k = cfg.topics
        self.user_cdf = _zipf_cdf(cfg.users, cfg.user_zipf, rng)
        self.item_cdf = _zipf_cdf(cfg.items, cfg.item_zipf, rng)
        self.item_topic = rng.integers(0, k, cfg.items)
        v = np.eye(k)[self.item_topic] + 0.3 * rng.standard_normal((cfg.items, k))
        self.item_vec = v / np.linalg.norm(v, axis=1, keepdims=True)  # mostly one topic per item
        self.item_price = rng.lognormal(-1.0, 0.5, cfg.items)
        self.user_bias = rng.normal(0.0, 0.4, cfg.users)
        self.user_device = rng.choice(len(DEVICES), cfg.users, p=_DEVICE_P)
        self.device_effect = np.array([0.1, -0.2, 0.0, -0.4])
        self.cat_p = rng.dirichlet(np.full(len(CATEGORIES), 2.0))
        self.cat_effect = rng.normal(0.0, 0.4, len(CATEGORIES))
        self.cat_topic = rng.integers(0, k, len(CATEGORIES))  # an ad on a matching site does better
        # Diurnal curve, phased so a run's first ~4 hours average out and keep the rate at base_ctr.
        first_hour = (cfg.start_ms // 3_600_000) % 24
        self.hour_effect = 0.2 * np.sin(2 * np.pi * (np.arange(24) - first_hour - 2) / 24)
        self.user_ids = [f"user-{i}" for i in range(cfg.users)]
        self.item_ids = [f"item-{i}" for i in range(cfg.items)]
        self.conv = ConversionModel(ConversionSpec.of(cfg), seed, cfg.items, [-0.3, 0.4, 0.1, -0.6])
        self.b0 = self._calibrate(np.random.default_rng([seed, 3]))
        self._probe = _Drift(cfg, seed)

    # -- the hidden model ------------------------------------------------------------------------
    def _logit(self, drift: _Drift, step: np.ndarray, ctx: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """Logit without intercept at drift ``step``s (non-decreasing) for ``ctx``; its interest term."""
        users, items, dev, cat, slot, hour = ctx
        u, pop = np.empty((len(users), self.cfg.topics)), np.empty(len(users))
        for s in range(int(step[0]), int(step[-1]) + 1):  # a few steps per chunk
            at = step == s
            drift.advance_to(s)
            u[at], pop[at] = drift.u[users[at]], drift.pop[items[at]]
        affinity = np.einsum("nk,nk->n", u, self.item_vec[items])
        match = 0.5 * (self.cat_topic[cat] == self.item_topic[items])
        return (
            self.cfg.interest_strength * affinity
            + 0.6 * pop
            + self.user_bias[users]
            + self.device_effect[dev]
            + self.cat_effect[cat]
            + match
            + _SLOT_EFFECT[slot]
            + self.hour_effect[hour]
        ), affinity

    def _calibrate(self, rng: np.random.Generator, n: int = 100_000) -> float:
        """Intercept that makes the mean click probability ``base_ctr`` (interests are stationary)."""
        # the real initial interests (heavy users dominate the mean), hours spread over a day
        ctx = (*self._context(rng, n), rng.integers(0, 24, n))
        z, affinity = self._logit(_Drift(self.cfg, self.seed), np.zeros(n, np.int64), ctx)
        lo, hi = -15.0, 10.0
        for _ in range(50):  # bisection: the mean sigmoid is monotone in the intercept
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.mean(1 / (1 + np.exp(-(z + mid)))) < self.cfg.base_ctr else (lo, mid)
        self.conv.calibrate(self.conv.logit(ctx[1], ctx[2], affinity), sigmoid(z + (lo + hi) / 2))
        return (lo + hi) / 2

    def _context(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
        users = np.searchsorted(self.user_cdf, rng.random(n), side="right")
        items = np.searchsorted(self.item_cdf, rng.random(n), side="right")
        own = rng.random(n) < 0.85  # users mostly stick to their own device
        dev = np.where(own, self.user_device[users], rng.choice(len(DEVICES), n, p=_DEVICE_P))
        cat = rng.choice(len(CATEGORIES), n, p=self.cat_p)
        slot = rng.choice(len(SLOTS), n, p=_SLOT_P)
        return users, items, dev, cat, slot

    def click_probability(
        self, user: int, item: int, ts_ms: int, device: int = 0, category: int = 0, slot: int = 0
    ) -> float:
        """Ground-truth click probability of ``user-<user>`` seeing ``item-<item>`` at ``ts_ms``."""
        step = max(0, (ts_ms - self.cfg.start_ms) // STEP_MS)
        if step < self._probe.step:
            self._probe = _Drift(self.cfg, self.seed)
        ctx = tuple(np.array([v]) for v in (user, item, device, category, slot, (ts_ms // 3_600_000) % 24))
        z = self.b0 + self._logit(self._probe, np.array([step]), ctx)[0]
        return float(1 / (1 + np.exp(-z[0])))

    # -- chunks ----------------------------------------------------------------------------------
    def _chunks(self, n_impressions: int) -> Iterator[dict[str, np.ndarray]]:
        """Impression-level arrays, CHUNK at a time (the last one truncated)."""
        cfg, drift, t = self.cfg, _Drift(self.cfg, self.seed), 0.0
        # Only quick clicks are skewed (their impression arrives late but within the watermark lag):
        # pick among them with a probability that makes the share of all clicks early_click_rate.
        quick_ratio = max(cfg.early_click_max_delay_s, 1e-9) / cfg.click_delay_median_s
        quick_share = 0.5 * (1 + math.erf(math.log(quick_ratio) / (cfg.click_delay_sigma * math.sqrt(2))))
        skew_p = min(1.0, cfg.early_click_rate / quick_share) if quick_share > 0 else 0.0
        for ci in range(math.ceil(n_impressions / CHUNK)):
            rng = np.random.default_rng([self.seed, 2, ci])
            off = t + np.cumsum(rng.exponential(1000.0 / cfg.events_per_s, CHUNK))
            t = float(off[-1])
            ts = cfg.start_ms + off.astype(np.int64)
            users, items, dev, cat, slot = self._context(rng, CHUNK)
            hour = (ts // 3_600_000) % 24
            z, aff = self._logit(drift, (ts - cfg.start_ms) // STEP_MS, (users, items, dev, cat, slot, hour))
            p = 1 / (1 + np.exp(-(self.b0 + z)))
            delay = np.exp(rng.standard_normal(CHUNK) * cfg.click_delay_sigma) * cfg.click_delay_median_s
            delay_ms = np.clip(np.round(delay * 1000), 1, cfg.click_delay_max_s * 1000).astype(np.int64)
            clicked = rng.random(CHUNK) < p
            quick = delay_ms <= cfg.early_click_max_delay_s * 1000
            out = {
                "idx": np.arange(ci * CHUNK, (ci + 1) * CHUNK),
                "ts": ts,
                "user": users,
                "item": items,
                "dev": dev,
                "cat": cat,
                "slot": slot,
                "p": p,
                "clicked": clicked,
                "click_ts": ts + delay_ms,
                "bid": np.round(
                    self.item_price[items] * np.exp(-0.3 * slot + 0.2 * rng.standard_normal(CHUNK)), 4
                ),
                "dup_imp": rng.random(CHUNK) < cfg.duplicate_rate,
                "dup_click": clicked & (rng.random(CHUNK) < cfg.duplicate_rate),
                "skew": clicked & quick & (rng.random(CHUNK) < skew_p),
                "lag_ms": rng.integers(100, 10_000, CHUNK),  # how late a duplicate is re-sent
            }
            out["conv_ms"], out["value"] = self.conv.draw(ci, self.conv.logit(items, dev, aff), clicked)
            keep = min(CHUNK, n_impressions - ci * CHUNK)
            yield {k: a[:keep] for k, a in out.items()}

    def _events(self, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every delivery of a chunk (impressions, clicks, conversions, duplicates) with a sort key."""
        imp_deliv = np.where(c["skew"], c["click_ts"] + c["lag_ms"] // 10, c["ts"])
        parts = [  # (mask, delivery time, kind, order slot)
            (np.ones(len(c["ts"]), bool), imp_deliv, 0, 0),
            (c["dup_imp"], imp_deliv + c["lag_ms"], 0, 1),
            (c["clicked"], c["click_ts"], 1, 2),
            (c["dup_click"], c["click_ts"] + c["lag_ms"], 1, 3),
            (c["conv_ms"] > 0, c["click_ts"] + c["conv_ms"], 2, 4),
        ]
        cols: dict[str, list[np.ndarray]] = {k: [] for k in _COLS}
        for mask, deliv, kind, slot in parts:
            cols["deliv"].append(deliv[mask])
            cols["order"].append(c["idx"][mask] * 5 + slot)
            cols["kind"].append(np.full(int(mask.sum()), kind, np.int8))
            cols["ts"].append((c["ts"], c["click_ts"], deliv)[kind][mask])  # a conversion arrives at its ts
            for k in ("idx", "user", "item", "dev", "cat", "slot", "bid", "value"):
                cols[k].append(c[k][mask])
        return {k: np.concatenate(v) for k, v in cols.items()}

    # -- public API ------------------------------------------------------------------------------
    def stream(self, n_impressions: int) -> Iterator[tuple[EventKind, dict[str, Any]]]:
        """``n_impressions`` impressions and all their clicks (duplicates, conversions) in arrival order."""
        pending = {k: np.empty(0, np.float64 if k in ("bid", "value") else np.int64) for k in _COLS}
        chunks = self._chunks(n_impressions)
        for c in chunks:
            ev = {k: np.concatenate([pending[k], v]) for k, v in self._events(c).items()}
            order = np.lexsort((ev["order"], ev["deliv"]))
            ev = {k: v[order] for k, v in ev.items()}
            # Later chunks deliver nothing before their first impression's ts >= this chunk's last.
            cut = int(np.searchsorted(ev["deliv"], c["ts"][-1], side="left"))
            yield from self._dicts({k: v[:cut] for k, v in ev.items()})
            pending = {k: v[cut:] for k, v in ev.items()}
        yield from self._dicts(pending)

    def _dicts(self, ev: dict[str, np.ndarray]) -> Iterator[tuple[EventKind, dict[str, Any]]]:
        uid, iid = self.user_ids, self.item_ids
        names = ("kind", "idx", "ts", "user", "item", "dev", "cat", "slot", "bid", "value")
        for kind, i, ts, u, it, d, c, s, b, v in zip(*(ev[k].tolist() for k in names), strict=True):
            if kind == 2:
                yield conversion_event(f"imp-{i}", ts, uid[u], v)
            elif kind:
                yield (
                    "click",
                    {"click_id": f"clk-{i}", "impression_id": f"imp-{i}", "ts": ts, "user_id": uid[u]},
                )
            else:
                yield (
                    "impression",
                    {
                        "impression_id": f"imp-{i}",
                        "ts": ts,
                        "user_id": uid[u],
                        "item_id": iid[it],
                        "features": {
                            "device": DEVICES[d],
                            "site_category": CATEGORIES[c],
                            "slot": SLOTS[s],
                            "hour": _HOURS[(ts // 3_600_000) % 24],
                        },
                        "dense": {"bid_floor": b},
                    },
                )

    def ground_truth(self, n_impressions: int, attribution_window_s: float) -> dict[str, int]:
        """The labels a correct joiner produces: 1 iff a click lands within the window (event time)."""
        window = round(attribution_window_s * 1000)
        out: dict[str, int] = {}
        for c in self._chunks(n_impressions):
            label = c["clicked"] & (c["click_ts"] - c["ts"] <= window)
            out.update(zip((f"imp-{i}" for i in c["idx"].tolist()), label.astype(int).tolist(), strict=True))
        return out

    def true_probabilities(self, n_impressions: int) -> dict[str, float]:
        """The hidden click probability of each impression (an oracle model, for benchmarks)."""
        out: dict[str, float] = {}
        for c in self._chunks(n_impressions):
            out.update(zip((f"imp-{i}" for i in c["idx"].tolist()), c["p"].tolist(), strict=True))
        return out
