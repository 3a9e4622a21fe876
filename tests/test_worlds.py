"""The synthetic worlds (pipeline/sources/worlds): determinism, wire format, and their mechanisms."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.checks import check_source
from pipeline.core.config import ValidationConfig
from pipeline.core.events import Click, Conversion, Impression
from pipeline.core.types import ManualClock, RawEvent
from pipeline.core.validation import Validator
from pipeline.ops.cli import main
from pipeline.sources.streams import SimulatorSource
from pipeline.sources.worlds import WORLDS, open_world
from pipeline.sources.worlds.catalog import CatalogWorld
from pipeline.sources.worlds.lifecycle import LifecycleWorld
from pipeline.sources.worlds.shifts import ShiftsWorld

NEW = ("lifecycle", "lifecycle-cv", "shifts", "catalog")
Events = list[tuple[str, dict[str, Any]]]


@cache
def stream(name: str, seed: int, n: int) -> Events:
    return list(open_world(name, seed).stream(n))


def impressions(evs: Events) -> dict[str, dict[str, Any]]:
    return {e["impression_id"]: e for k, e in evs if k == "impression"}


@pytest.mark.parametrize("name", NEW)
def test_same_seed_same_stream_other_seed_other_stream(name: str) -> None:
    assert list(open_world(name, 1).stream(6_000)) == stream(name, 1, 6_000)
    assert stream(name, 2, 2_000) != stream(name, 1, 2_000)[: len(stream(name, 2, 2_000))]


@pytest.mark.parametrize("name", NEW)
def test_first_n_impressions_do_not_depend_on_n(name: str) -> None:
    short, long = impressions(stream(name, 3, 7_000)), impressions(stream(name, 3, 12_000))
    assert len(short) == 7_000 and all(long[i] == e for i, e in short.items())


@pytest.mark.parametrize("name", NEW)
def test_events_are_valid_and_in_arrival_order(name: str) -> None:
    evs = stream(name, 1, 20_000)
    v = Validator(ValidationConfig(), clock=ManualClock(0))
    seen: dict[str, int] = {}
    last = 0
    for kind, e in evs:
        out = v.validate(RawEvent(kind, json.dumps(e).encode(), "test", entered_ms=e["ts"]))
        expected = {"impression": Impression, "click": Click, "conversion": Conversion}[kind]
        assert isinstance(out, expected), out
        assert e["ts"] >= last  # delivered in event-time order
        last = e["ts"]
        if kind == "impression":
            seen[e["impression_id"]] = e["ts"]
        else:
            assert e["ts"] > seen[e["impression_id"]]  # a click (or conversion) follows its impression
    assert len(seen) == 20_000 and v.rejected == {}


@pytest.mark.parametrize("name", NEW)
def test_a_world_replays_as_a_source(name: str) -> None:
    check_source(lambda resume: SimulatorSource(open_world(name, 4), 3_000, 500, resume), name=name)


def test_simulate_writes_a_world(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    assert (
        main(["simulate", "--world", "shifts", "--impressions", "500", "--seed", "1", "--out", str(out)]) == 0
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [{"type": k, **e} for k, e in stream("shifts", 1, 500)] == lines
    assert set(WORLDS) == {"simulator", *NEW}


# -- lifecycle ------------------------------------------------------------------------------------
def test_lifecycle_ctr_is_low_and_falls_with_position() -> None:
    w = LifecycleWorld(seed=5)
    evs = stream("lifecycle", 5, 60_000)
    imps = impressions(evs)
    p = w.true_probabilities(60_000)
    clicks = sum(1 for k, _ in evs if k == "click")
    assert 0.003 < clicks / 60_000 < 0.008
    by_pos = defaultdict(list)
    for i, e in imps.items():
        by_pos[e["features"]["position"]].append(p[i])
    means = [np.mean(by_pos[str(k)]) for k in range(1, 6)]
    assert all(a > b for a, b in itertools.pairwise(means)) and means[0] > 3 * means[-1]


def test_lifecycle_new_ads_keep_arriving_and_fade() -> None:
    imps = list(impressions(stream("lifecycle", 5, 60_000)).values())
    first_seen: dict[str, int] = {}
    for e in imps:
        first_seen.setdefault(e["item_id"], e["ts"])
    t0, t1 = imps[0]["ts"], imps[-1]["ts"]
    assert (t1 - t0) > 12 * 3_600_000
    late = [e for e in imps if e["ts"] > t0 + (t1 - t0) * 2 / 3]
    fresh = sum(1 for e in late if first_seen[e["item_id"]] > t0 + (t1 - t0) / 3)
    assert fresh / len(late) > 0.5  # most late traffic goes to ads born after the first third
    counts = Counter(e["item_id"] for e in imps)
    top = counts.most_common(1)[0][0]
    ts = np.array([e["ts"] for e in imps if e["item_id"] == top])
    assert np.ptp(ts) < (t1 - t0)  # even the busiest ad has a life shorter than the stream


def test_lifecycle_traffic_has_a_daily_cycle() -> None:
    imps = impressions(stream("lifecycle", 5, 60_000)).values()
    per_hour = Counter(e["features"]["hour"] for e in imps)
    assert max(per_hour.values()) > 2 * min(per_hour.values())


# -- shifts ---------------------------------------------------------------------------------------
def test_shifts_clicks_past_the_window_and_ctr() -> None:
    evs = stream("shifts", 6, 60_000)
    imps = impressions(evs)
    delays = np.array([e["ts"] - imps[e["impression_id"]]["ts"] for k, e in evs if k == "click"]) / 1000
    assert 0.02 < delays.size / 60_000 < 0.05
    assert 0.12 < np.mean(delays > 900) < 0.3  # fake negatives for a 15-minute window
    assert np.median(delays) < 120 and delays.max() > 4 * 3_600


def test_shifts_bursts_of_new_users() -> None:
    imps = list(impressions(stream("shifts", 6, 60_000)).values())
    new = [e for e in imps if e["user_id"].startswith("b")]
    assert 0.03 < len(new) / len(imps) < 0.4
    hours = Counter((e["ts"] - imps[0]["ts"]) // 3_600_000 for e in new)
    assert len(hours) <= 6  # bursts are concentrated in time, not spread over the stream
    campaign = np.mean([e["features"]["channel"] == "campaign" for e in new])
    assert campaign > 0.6 > np.mean([e["features"]["channel"] == "campaign" for e in imps])


def test_shifts_category_trends_jump_at_a_shift() -> None:
    w = ShiftsWorld(seed=6)
    n = 60_000
    p = w.true_probabilities(n)
    imps = impressions(stream("shifts", 6, n))
    from pipeline.sources.worlds.shifts import _Timeline

    line = _Timeline(w.p, 6)
    line.cover(1e9)
    shift_ms = w.start_ms + line.shifts[0] * 1000

    def mean_by_cat(lo: float, hi: float) -> dict[str, float]:
        acc = defaultdict(list)
        for i, e in imps.items():
            if e["user_id"].startswith("u") and lo <= e["ts"] < hi:
                acc[e["features"]["ad_category"]].append(p[i])
        return {c: float(np.mean(v)) for c, v in acc.items() if len(v) > 20}

    hour = 3_600_000
    before, after = mean_by_cat(shift_ms - hour, shift_ms), mean_by_cat(shift_ms, shift_ms + hour)
    earlier = mean_by_cat(shift_ms - 2 * hour, shift_ms - hour)
    across = np.mean([abs(np.log(after[c] / before[c])) for c in before if c in after])
    within = np.mean([abs(np.log(before[c] / earlier[c])) for c in before if c in earlier])
    assert across > 2 * within


# -- catalog --------------------------------------------------------------------------------------
def test_catalog_items_churn_and_heavy_users_dominate() -> None:
    evs = stream("catalog", 6, 200_000)  # about a day
    imps = list(impressions(evs).values())
    assert 0.05 < sum(1 for k, _ in evs if k == "click") / len(imps) < 0.14
    t0, t1 = imps[0]["ts"], imps[-1]["ts"]
    first_seen: dict[str, int] = {}
    for e in imps:
        first_seen.setdefault(e["item_id"], e["ts"])
    late = [e for e in imps if e["ts"] > t0 + (t1 - t0) * 2 / 3]
    fresh = sum(1 for e in late if first_seen[e["item_id"]] > t0 + (t1 - t0) / 3)
    assert fresh / len(late) > 0.25  # within a day, new items take a real share of the traffic
    users = Counter(e["user_id"] for e in imps)
    top = sum(c for _, c in users.most_common(len(users) // 100))  # the busiest 1% of users
    assert top / len(imps) > 0.5 and sum(1 for c in users.values() if c <= 2) / len(users) > 0.5


def test_catalog_quality_wanders_and_the_dense_score_tracks_it() -> None:
    w = CatalogWorld(seed=6)
    n = 60_000
    p = w.true_probabilities(n)
    imps = impressions(stream("catalog", 6, n))
    score = np.array([e["dense"]["quality"] for e in imps.values()])
    logit = np.log([p[i] / (1 - p[i]) for i in imps])
    assert np.corrcoef(score, logit)[0, 1] > 0.15  # an upstream score with real signal (~0.25)
    # each item's hidden quality walks: over a day it moves by about 0.04 * E|N(0,1)| * sqrt(24)
    from pipeline.sources.worlds.catalog import _Items

    items = _Items(w.p, 6)
    items.at(0.0)
    start = items.quality[: w.p.items_at_start].copy()
    items.at(24 * 3_600.0)
    moved = np.abs(items.quality[: w.p.items_at_start] - start)
    assert 0.05 < np.median(moved) < 0.3 and np.mean(moved > 0.5) < 0.05


def test_backtest_replays_a_world(tmp_path: Path) -> None:
    args = ["backtest", "--format", "simulator", "--world", "shifts", "--impressions", "6000"]
    assert main([*args, "--train-every", "2000", "--seed", "3", "--out", str(tmp_path / "bt")]) == 0
    summary = json.loads((tmp_path / "bt" / "summary.json").read_text())
    assert summary["world"] == "shifts" and summary["examples"] == 6_000 and summary["blocks"] == 3
    assert main(["backtest", "--format", "jsonl", "--world", "shifts", "--source", str(tmp_path)]) == 2
