"""Conversions in the generated streams (simulator, lifecycle world): off by default and then the
streams are those of before conversions existed; on, they follow clicks without touching them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

import numpy as np
import pytest

from pipeline.core.config import SimulatorConfig, ValidationConfig
from pipeline.core.events import Conversion
from pipeline.core.types import ManualClock, RawEvent
from pipeline.core.validation import Validator
from pipeline.sources.conversions import ConversionSpec
from pipeline.sources.simulator import Simulator
from pipeline.sources.worlds.lifecycle import LifecycleParams, LifecycleWorld
from pipeline.sources.worlds.shifts import ShiftsWorld

Events = Sequence[tuple[str, dict[str, Any]]]
CFG = SimulatorConfig()
ON = dataclasses.replace(CFG, conversion_rate=0.1)
FAULTY = dataclasses.replace(CFG, duplicate_rate=0.05, early_click_rate=0.05, base_ctr=0.2)
LIFECYCLE_ON = LifecycleParams(conversions=ConversionSpec(rate=0.3))
# sha256 of the streams (each event's repr: key order counts) of the code before conversions existed
BEFORE = {
    "simulator-1-40k": "884a026f98f09c7e7a0d9e7fdda2d5e42daaad8f25018c87ff8db74b4beb8cb5",
    "faulty-2-20k": "8ea151026cea6b9843ea6ab3c7197df0c2d0a56f0883f830b02089b035e9fa29",
    "lifecycle-1-24k": "4ad90ec3d1606a6b2532c842128d8179f8d98e18eb749cf69242d04aff8d2a98",
    "lifecycle-2-6k": "38eb3e33eda8596917a806dc3c834e9004189e0341630d4bfca8ca51d15db761",
    "shifts-2-6k": "d7f85c4a69c9faf8ddcdbdc9e6e1a81cd208bf32c4d31f1ee4a2308b0fc3241c",
}


def digest(evs: Iterable[tuple[str, dict[str, Any]]]) -> str:
    h = hashlib.sha256()
    for ev in evs:
        h.update(repr(ev).encode() + b"\n")
    return h.hexdigest()


def without_conversions(evs: Events) -> Events:
    return [(k, e) for k, e in evs if k != "conversion"]


@cache
def sim(conversion_rate: float, seed: int, n: int) -> Events:
    return list(Simulator(dataclasses.replace(CFG, conversion_rate=conversion_rate), seed).stream(n))


@cache
def lifecycle(seed: int, n: int) -> Events:
    return list(LifecycleWorld(seed, LIFECYCLE_ON).stream(n))


def check_conversions(evs: Events) -> tuple[int, int]:
    """Every conversion is valid, follows a click of its impression by the same user, arrives after it
    and in event-time order, once; returns (clicked impressions, conversions)."""
    validator = Validator(ValidationConfig(), clock=ManualClock(0))
    clicks: dict[str, dict[str, Any]] = {}
    ids: Counter[str] = Counter()
    last = -1
    for kind, e in evs:
        if kind == "click":
            clicks.setdefault(e["impression_id"], e)
        elif kind == "conversion":
            raw = RawEvent("conversion", json.dumps(e).encode(), "test", entered_ms=e["ts"])
            assert isinstance(validator.validate(raw), Conversion)
            click = clicks[e["impression_id"]]  # the click came first
            assert e["user_id"] == click["user_id"] and e["ts"] > click["ts"] >= 0
            assert e["conversion_id"] == "v" + e["impression_id"]
            assert math.isfinite(e["value"]) and e["value"] >= 0 and round(e["value"], 2) == e["value"]
            assert set(e) == {"conversion_id", "impression_id", "ts", "user_id", "value"}
            assert e["ts"] >= last  # conversions are delivered at their ts
            last = e["ts"]
            ids[e["conversion_id"]] += 1
    assert all(n == 1 for n in ids.values())
    return len(clicks), len(ids)


# -- off by default: the streams of before --------------------------------------------------------
def test_default_streams_are_those_of_before() -> None:
    assert CFG.conversion_rate == 0
    assert digest(sim(0.0, 1, 40_000)) == BEFORE["simulator-1-40k"]
    assert digest(Simulator(FAULTY, 2).stream(20_000)) == BEFORE["faulty-2-20k"]
    assert digest(LifecycleWorld(2).stream(6_000)) == BEFORE["lifecycle-2-6k"]
    assert digest(ShiftsWorld(2).stream(6_000)) == BEFORE["shifts-2-6k"]


def test_conversions_leave_impressions_and_clicks_alone() -> None:
    evs = sim(ON.conversion_rate, 1, 40_000)
    assert digest(without_conversions(evs)) == BEFORE["simulator-1-40k"]
    faulty = list(Simulator(dataclasses.replace(FAULTY, conversion_rate=0.3), 2).stream(20_000))
    assert digest(without_conversions(faulty)) == BEFORE["faulty-2-20k"]
    assert digest(without_conversions(lifecycle(1, 24_000))) == BEFORE["lifecycle-1-24k"]


# -- on: what they look like ----------------------------------------------------------------------
def test_simulator_conversions_follow_clicks_at_the_configured_rate() -> None:
    evs = sim(ON.conversion_rate, 1, 40_000)
    clicked, converted = check_conversions(evs)
    # ~2,250 clicks: a binomial share of 0.1 has a standard deviation of ~0.006
    assert converted / clicked == pytest.approx(ON.conversion_rate, abs=0.02)
    click_ts = {e["impression_id"]: e["ts"] for k, e in evs if k == "click"}
    delays = np.array([e["ts"] - click_ts[e["impression_id"]] for k, e in evs if k == "conversion"]) / 1000
    assert np.median(delays) == pytest.approx(ON.conversion_delay_median_s, rel=0.2)
    assert delays.max() <= ON.conversion_delay_max_s
    values = [e["value"] for k, e in evs if k == "conversion"]
    assert np.median(values) == pytest.approx(ON.conversion_value_median, rel=0.2)


def test_the_conversion_model_is_not_the_click_model() -> None:
    evs = sim(ON.conversion_rate, 1, 40_000)
    device = {e["impression_id"]: e["features"]["device"] for k, e in evs if k == "impression"}
    clicked = {e["impression_id"] for k, e in evs if k == "click"}
    converted = {e["impression_id"] for k, e in evs if k == "conversion"}

    def rates(dev: str) -> tuple[float, float]:
        shown = [i for i, d in device.items() if d == dev]
        clicks = [i for i in shown if i in clicked]
        return len(clicks) / len(shown), sum(i in converted for i in clicks) / len(clicks)

    (mobile_ctr, mobile_cvr), (desktop_ctr, desktop_cvr) = rates("mobile"), rates("desktop")
    assert mobile_ctr > desktop_ctr and desktop_cvr > 1.4 * mobile_cvr  # desktop clicks less, converts more


def test_a_resent_click_converts_once() -> None:
    cfg = dataclasses.replace(FAULTY, conversion_rate=0.3)
    evs = list(Simulator(cfg, 2).stream(20_000))
    check_conversions(evs)
    resent = {i for i, n in Counter(e["impression_id"] for k, e in evs if k == "click").items() if n > 1}
    assert sum(e["impression_id"] in resent for k, e in evs if k == "conversion") > 10


def test_conversions_are_deterministic_and_do_not_depend_on_n() -> None:
    def conversions(evs: Events, below: int) -> list[dict[str, Any]]:
        return [e for k, e in evs if k == "conversion" and int(e["impression_id"][4:]) < below]

    long = sim(ON.conversion_rate, 1, 40_000)
    short = list(Simulator(ON, 1).stream(15_000))  # not a multiple of the chunk
    assert conversions(short, 15_000) == conversions(long, 15_000) != []
    assert conversions(list(Simulator(ON, 2).stream(10_000)), 10_000) != conversions(long, 10_000)


# -- the lifecycle world --------------------------------------------------------------------------
def test_lifecycle_conversions() -> None:
    assert LifecycleParams().conversions.rate == 0
    evs = lifecycle(1, 24_000)
    clicked, converted = check_conversions(evs)
    # ~120 clicks: a binomial share of 0.3 has a standard deviation of ~0.04
    assert converted / clicked == pytest.approx(LIFECYCLE_ON.conversions.rate, abs=0.15)
    short = list(LifecycleWorld(1, LIFECYCLE_ON).stream(8_000))  # the same seed, fewer impressions
    first = [e for k, e in evs if k == "conversion" and int(e["impression_id"].rsplit("-")[-1]) < 8_000]
    assert [e for k, e in short if k == "conversion"] == first != []
    ts = [e["ts"] for _, e in evs]
    assert ts == sorted(ts)  # a world delivers everything at its ts
