"""Conversions of the synthetic streams, and the logistic and lognormal draws they share with clicks.

A conversion (a purchase after a click) follows a click of the same impression, by the same user,
after a lognormal delay (median ``delay_median_s``, shape ``delay_sigma``, capped at ``delay_max_s``)
and carries an order value (lognormal, median ``value_median``, rounded to cents; none when
``value_median`` is 0): :class:`ConversionSpec`. Whether a click converts is a coin whose probability
comes from a hidden conversion model that is not the click model (:class:`ConversionModel`): logit
``c0 + 0.8 * quality[key] + device_effect[device] + 0.5 * affinity``, where ``quality`` is one N(0, 1)
per item (or advertiser) drawn once, ``affinity`` is the source's user-item match (a smaller weight
than in its click model) and ``c0`` is solved so that clicks convert at ``rate`` on average. The draws
come from generators of their own (``default_rng([seed, 6])`` once, ``default_rng([seed, 7, chunk])``
per chunk; a source that uses conversions draws nothing else from those), so turning conversions on
changes no impression and no click. One conversion at most per clicked impression: a re-sent click
never converts twice.

>>> spec = ConversionSpec(rate=0.5, value_median=30.0)
>>> clicked = np.array([True, False, True, True] * 100)
>>> delay_ms, value = spec.draw([1, 7, 0], np.full(400, 0.5), clicked)
>>> converted = delay_ms > 0
>>> bool(np.all(clicked[converted])), 100 < int(converted.sum()) < 200, bool(np.all(value[converted] > 0))
(True, True, True)
>>> kind, event = conversion_event("imp-3", 1_000, "user-1", 12.5)
>>> kind, event["conversion_id"], event["value"]
('conversion', 'vimp-3', 12.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.core.config import SimulatorConfig
from pipeline.core.types import EventKind

__all__ = [
    "ConversionModel",
    "ConversionSpec",
    "conversion_event",
    "intercept",
    "lognormal_ms",
    "sigmoid",
]

VALUE_SIGMA = 0.8  # lognormal shape of order values (a few big baskets)
QUALITY_WEIGHT = 0.8  # conversion logit per unit of an item's (advertiser's) hidden quality
AFFINITY_WEIGHT = 0.5  # conversion logit per unit of user-item affinity (clicks weigh it more)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def intercept(z: np.ndarray, target: float, scale: np.ndarray | float = 1.0) -> float:
    """The ``b`` with ``mean(scale * sigmoid(z + b)) == target`` (bisection: monotone in ``b``)."""
    lo, hi = -20.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.mean(scale * sigmoid(z + mid)) < target else (lo, mid)
    return (lo + hi) / 2


def lognormal_ms(rng: np.random.Generator, n: int, median_s: float, sigma: float, cap_s: float) -> np.ndarray:
    """Lognormal delays in whole milliseconds, at least 1 and at most ``cap_s``."""
    d = np.exp(rng.standard_normal(n) * sigma + math.log(median_s * 1000))
    return np.clip(np.round(d), 1, cap_s * 1000).astype(np.int64)


@dataclass(frozen=True)
class ConversionSpec:
    """How often clicks convert, how late, and for how much; ``rate`` 0 = no conversions."""

    rate: float = 0.0  # mean probability that a click converts
    delay_median_s: float = 1_800.0  # click -> conversion delay (lognormal): median
    delay_sigma: float = 1.0  # its shape
    delay_max_s: float = 86_400.0  # its cap
    value_median: float = 30.0  # median order value (lognormal); 0 = conversions carry no value

    def __post_init__(self) -> None:
        checks = {
            "rate": 0 <= self.rate <= 1,
            "delay_median_s": self.delay_median_s > 0,
            "delay_sigma": self.delay_sigma >= 0,
            "delay_max_s": self.delay_max_s >= 1e-3 or self.rate == 0,  # at least 1 ms
            "value_median": self.value_median >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"ConversionSpec: {name} = {getattr(self, name)!r} is out of range")

    @classmethod
    def of(cls, cfg: SimulatorConfig) -> ConversionSpec:
        """The simulator's, from the ``conversion_*`` fields of its config."""
        return cls(
            cfg.conversion_rate,
            cfg.conversion_delay_median_s,
            cfg.conversion_delay_sigma,
            cfg.conversion_delay_max_s,
            cfg.conversion_value_median,
        )

    def draw(self, key: list[int], q: np.ndarray, clicked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(delay_ms, value)`` per impression: from its click to its conversion (-1: none), and the
        order value (NaN: none), for the conversion probabilities ``q`` of the clicks. Drawn from a
        generator of their own, ``default_rng(key)``, as many draws whatever ``clicked`` is."""
        n = q.size
        if self.rate == 0:
            return np.full(n, -1, np.int64), np.full(n, np.nan)
        rng = np.random.default_rng(key)
        converted = clicked & (rng.random(n) < q)
        delay_ms = lognormal_ms(rng, n, self.delay_median_s, self.delay_sigma, self.delay_max_s)
        value = np.round(self.value_median * np.exp(VALUE_SIGMA * rng.standard_normal(n)), 2)
        with_value = converted & (self.value_median > 0)
        return np.where(converted, delay_ms, -1), np.where(with_value, value, np.nan)


class ConversionModel:
    """A source's hidden conversion model (see the module docstring); ``keys`` items (advertisers)."""

    def __init__(self, spec: ConversionSpec, seed: int, keys: int, device_effect: npt.ArrayLike) -> None:
        self.spec, self.seed = spec, seed
        self.device_effect = np.asarray(device_effect, np.float64)
        self.quality = np.random.default_rng([seed, 6]).standard_normal(keys)
        self.c0 = 0.0

    def logit(self, key: np.ndarray, device: np.ndarray, affinity: np.ndarray) -> np.ndarray:
        """The conversion logit of a click, without the intercept ``c0``."""
        return QUALITY_WEIGHT * self.quality[key] + self.device_effect[device] + AFFINITY_WEIGHT * affinity

    def calibrate(self, z: np.ndarray, p_click: np.ndarray) -> None:
        """Set ``c0`` so that impressions of logits ``z``, weighted by ``p_click``, convert at ``rate``."""
        if self.spec.rate > 0:
            self.c0 = intercept(z, self.spec.rate, p_click / np.mean(p_click))

    def draw(self, chunk: int, z: np.ndarray, clicked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`ConversionSpec.draw` for chunk ``chunk``'s impressions of conversion logits ``z``."""
        return self.spec.draw([self.seed, 7, chunk], sigmoid(z + self.c0), clicked)


def conversion_event(imp_id: str, ts: int, user: str, value: float) -> tuple[EventKind, dict[str, Any]]:
    """The raw event of the conversion of ``imp_id``'s click (``value`` NaN: none)."""
    e: dict[str, Any] = {"conversion_id": f"v{imp_id}", "impression_id": imp_id, "ts": ts, "user_id": user}
    if not math.isnan(value):
        e["value"] = value
    return "conversion", e
