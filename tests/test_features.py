"""Unit tests of the streaming counters (features.aggregations): windows, expiry, CTR, point in time."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from features.aggregations import FEATURE_NAMES, StreamingFeatures, feature_names
from pipeline.core.config import FeatureConfig

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a bucket boundary
MIN = 60_000
HOUR = 60 * MIN


@pytest.fixture
def sf() -> StreamingFeatures:
    return StreamingFeatures(FeatureConfig())


def test_feature_names_are_ordered_user_then_item_window_by_window() -> None:
    assert FEATURE_NAMES[:3] == ("user_impressions_1h", "user_clicks_1h", "user_ctr_1h")
    assert FEATURE_NAMES[3] == "user_impressions_24h" and FEATURE_NAMES[6] == "item_impressions_1h"
    assert len(FEATURE_NAMES) == 12
    assert feature_names((300, 90)) == tuple(
        f"{e}_{k}_{w}"
        for e in ("user", "item")
        for w in ("5m", "90s")
        for k in ("impressions", "clicks", "ctr")
    )


def test_window_counts(sf: StreamingFeatures) -> None:
    for k in range(3):
        sf.record_impression("u", f"i{k}", T0 + k * MIN)
    sf.record_click("u", "i0", T0 + 5 * MIN)
    f = sf.lookup("u", "i0", T0 + 10 * MIN)
    assert (f["user_impressions_1h"], f["user_clicks_1h"]) == (3.0, 1.0)
    assert (f["user_impressions_24h"], f["user_clicks_24h"]) == (3.0, 1.0)
    assert (f["item_impressions_1h"], f["item_clicks_1h"]) == (1.0, 1.0)
    assert sf.lookup("other", "i1", T0 + 10 * MIN)["item_impressions_24h"] == 1.0


def test_expiry_after_the_window(sf: StreamingFeatures) -> None:
    sf.record_impression("u", "i", T0)
    # a window is whole buckets: (b - 12, b] for 1 h of 5-minute buckets
    assert sf.lookup("u", "i", T0 + HOUR - 1)["user_impressions_1h"] == 1.0
    after_1h = sf.lookup("u", "i", T0 + HOUR)
    assert (after_1h["user_impressions_1h"], after_1h["user_impressions_24h"]) == (0.0, 1.0)
    assert sf.lookup("u", "i", T0 + 24 * HOUR)["user_impressions_24h"] == 0.0
    # old buckets are dropped once a newer event moves the entity past its retention
    sf.record_impression("u", "i", T0 + 30 * HOUR)
    assert len(sf.to_state()["users"]["u"]) == 4 + 3  # header + one bucket
    assert sf.lookup("u", "i", T0 + 30 * HOUR)["user_impressions_24h"] == 1.0


def test_smoothed_ctr_and_defaults() -> None:
    cfg = FeatureConfig(ctr_prior_clicks=2.0, ctr_prior_rate=0.1)
    sf = StreamingFeatures(cfg)
    for _ in range(8):
        sf.record_impression("u", "i", T0)
    sf.record_click("u", "i", T0)
    assert sf.lookup("u", "i", T0)["user_ctr_1h"] == pytest.approx((1 + 2) / (8 + 2 / 0.1))
    d = sf.defaults()
    assert list(d) == list(sf.feature_names)
    assert d["user_impressions_1h"] == 0.0 and d["item_ctr_24h"] == pytest.approx(0.1)
    assert sf.lookup("nobody", "nothing", T0) == d


def test_lookup_before_record_excludes_the_current_event(sf: StreamingFeatures) -> None:
    sf.record_impression("u", "i", T0)
    before = sf.lookup("u", "i", T0 + MIN)
    sf.record_impression("u", "i", T0 + MIN)
    after = sf.lookup("u", "i", T0 + MIN)
    assert before["user_impressions_1h"] == 1.0 and after["user_impressions_1h"] == 2.0


def test_out_of_order_events_inside_the_window(sf: StreamingFeatures) -> None:
    sf.record_impression("u", "i", T0)
    sf.record_impression("u", "i", T0 + 20 * MIN)
    sf.record_impression("u", "i", T0 + 7 * MIN)  # late, into an older bucket than the newest
    sf.record_click("u", "i", T0 + 2 * MIN)
    assert sf.lookup("u", "i", T0 + 20 * MIN)["user_impressions_1h"] == 3.0
    early = sf.lookup("u", "i", T0 + 9 * MIN)  # window ending at 9 min: buckets 0-5 and 5-10 min
    assert (early["user_impressions_1h"], early["user_clicks_1h"]) == (2.0, 1.0)
    assert sf.lookup("u", "i", T0 + 70 * MIN)["user_impressions_1h"] == 1.0  # buckets 15-70 min: only 20
    # later than the longest window + max_lateness behind the entity's newest: dropped, counted
    sf.record_impression("u", "i", T0 + 30 * HOUR)
    sf.record_impression("u", "i", T0 + 30 * HOUR - 26 * HOUR)
    assert sf.late_dropped == 2  # the user and the item update


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_a_brute_force_count_on_disordered_streams(seed: int) -> None:
    rng = random.Random(seed)
    cfg = FeatureConfig(windows_s=(600, 3_600), bucket_s=60)
    sf = StreamingFeatures(cfg)
    seen: list[tuple[str, int, int]] = []  # (user, ts, is_click)
    for k in range(3_000):
        user, ts = f"u{rng.randrange(5)}", T0 + k * 3_000 + rng.randrange(-600_000, 1)
        if rng.random() < 0.3:
            got = sf.lookup(user, "i", ts)
            b = ts // 60_000
            for w, label in ((10, "10m"), (60, "1h")):
                inside = [c for u, t, c in seen if u == user and b - w < t // 60_000 <= b]
                assert got[f"user_impressions_{label}"] == len(inside) - sum(inside)
                assert got[f"user_clicks_{label}"] == sum(inside)
        click = int(rng.random() < 0.1)
        (sf.record_click if click else sf.record_impression)(user, "i", ts)
        seen.append((user, ts, click))


def test_drain_dirty_rows_and_strictly_increasing_timestamps(sf: StreamingFeatures) -> None:
    sf.record_impression("u", "i", T0 + 1_500)
    users, items = sf.drain_dirty()
    assert [r["user_id"] for r in users] == ["u"] and [r["item_id"] for r in items] == ["i"]
    row = users[0]
    assert row["user_impressions_1h"] == 1 and isinstance(row["user_impressions_1h"], int)
    assert row["event_timestamp"].timestamp() * 1000 == T0 + 1_500
    assert sf.drain_dirty() == ([], [])
    sf.record_click("u", "i", T0 + 1_500)  # same millisecond: the stamp must still move forward
    again = sf.drain_dirty()[0][0]
    assert again["event_timestamp"] > row["event_timestamp"] and again["user_clicks_1h"] == 1
    sf.record_impression("u", "i", T0)  # late: values change, the stamp still moves forward
    late = sf.drain_dirty()[0][0]
    assert late["event_timestamp"] > again["event_timestamp"] and late["user_impressions_1h"] == 2


def test_state_round_trip(sf: StreamingFeatures) -> None:
    rng = random.Random(0)
    for k in range(500):
        ts = T0 + k * 10_000 + rng.randrange(-60_000, 1)
        sf.record_impression(f"u{k % 7}", f"i{k % 3}", ts)
        if k % 9 == 0:
            sf.record_click(f"u{k % 7}", f"i{k % 3}", ts)
    sf.drain_dirty()
    sf.record_impression("u1", "i1", T0 + 6_000_000)
    back = StreamingFeatures.from_state(json.loads(json.dumps(sf.to_state())), sf.cfg)
    assert back.to_state() == sf.to_state()
    for t in (T0, T0 + 2_000_000, T0 + 6_000_000):
        assert back.lookup("u1", "i1", t) == sf.lookup("u1", "i1", t)
    for s in (sf, back):  # both go on identically, push stamps included
        s.record_click("u1", "i2", T0 + 6_000_000)
    assert back.drain_dirty() == sf.drain_dirty()
    with pytest.raises(ValueError, match="bucket_s"):
        StreamingFeatures.from_state(sf.to_state(), replace(sf.cfg, bucket_s=60))


@pytest.mark.parametrize(
    "bad",
    [{"windows_s": (3_600, 1_000)}, {"bucket_s": 0}, {"ctr_prior_clicks": 0.0}, {"ctr_prior_rate": 1.0}],
)
def test_bad_config_fails_loudly(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=f"features:|{next(iter(bad))}"):  # ranges: the config's own
        StreamingFeatures(replace(FeatureConfig(), **bad))  # type: ignore[arg-type]


def test_behaviour_sequence_keeps_the_last_k_clicks_in_time_order_within_the_ttl() -> None:
    sf = StreamingFeatures(FeatureConfig(sequence_length=3, sequence_ttl_s=60))
    for ts, item in ((1_000, "a"), (5_000, "c"), (3_000, "b"), (7_000, "d")):  # "b" attributed late
        sf.record_click("u", item, ts)
    sf.record_user("v", 2_000, click=True, item_id="z")  # the joiner's path: the user's side only
    assert sf.sequence("u") == (["d", "c", "b"], [7_000, 5_000, 3_000])  # "a" pushed out by K = 3
    seen = sf.lookup_user("u", 6_000)
    assert (seen["user_clicked_items"], seen["user_clicked_ts"]) == (["c", "b"], [5_000, 3_000])
    assert sf.lookup_user("u", 66_000)["user_clicked_items"] == ["d"]  # 3 s and 5 s: past the 60 s ttl
    assert sf.lookup("nobody", "x", 9_000)["user_clicked_items"] == []
    assert sf.lookup_user("v", 2_000)["user_clicked_items"] == ["z"]
    rows = {r["user_id"]: r for r in sf.drain_dirty()[0]}
    assert rows["u"]["user_clicked_items"] == ["d", "c", "b"]  # the stored row, whole
    again = StreamingFeatures.from_state(json.loads(json.dumps(sf.to_state())), sf.cfg)
    assert again.sequence("u") == sf.sequence("u") and again.sequence("v") == (["z"], [2_000])
    assert "user_clicked_items" not in StreamingFeatures(FeatureConfig()).lookup_user("u", 1)
