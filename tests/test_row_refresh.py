"""Rows drained at a time hold what a lookup at that time gives, though no event came since.

The online store keeps each entity's newest row. Before rows were refreshed, that was the entity's
counts as of its last event, for ever: a user idle for two hours read its old 1 h count at serving,
where training's lookup gives 0. These tests keep a store the way Feast's Redis store keeps one
(per entity the row with the newest stamp) and check it against lookups, drain after drain.
"""

from __future__ import annotations

import json
import random

import pytest

from features.aggregations import FeatureRow, StreamingFeatures
from features.item_stage import ItemStage
from features.window_exits import next_exit
from pipeline.core.config import FeatureConfig
from pipeline.core.events import Impression, LabelledExample

T0 = 1_767_225_600_000
MIN = 60_000
HOUR = 60 * MIN


class NewestRowStore:
    """Per entity the row with the newest stamp; an older or equal stamp is dropped, as Feast does."""

    def __init__(self) -> None:
        self.rows: dict[str, FeatureRow] = {}

    def push(self, rows: list[FeatureRow], key: str) -> None:
        for row in rows:
            held = self.rows.get(row[key])
            assert held is None or row["event_timestamp"] > held["event_timestamp"]  # none dropped
            self.rows[row[key]] = row


@pytest.mark.parametrize("restore_at", [None, 150])
def test_the_store_holds_a_lookup_at_the_drain_time_for_every_entity(restore_at: int | None) -> None:
    cfg = FeatureConfig()
    sf = StreamingFeatures(cfg)
    users, items = NewestRowStore(), NewestRowStore()
    rng = random.Random(3)
    now, pushed, idle_drains = T0, 0, 0
    for step in range(300):  # ~9 days: bursts, lulls of hours, events up to 30 min out of order
        now += rng.choice((20_000, 4 * MIN, 25 * MIN, 3 * HOUR))
        for _ in range(rng.randrange(5)):
            u, i, ts = f"u{rng.randrange(40)}", f"i{rng.randrange(12)}", now - rng.randrange(30 * MIN)
            sf.record_impression(u, i, ts)
            if rng.random() < 0.3:
                sf.record_click(u, i, ts + 1_000)
        if step == restore_at:
            sf = StreamingFeatures.from_state(json.loads(json.dumps(sf.to_state())), cfg)
        user_rows, item_rows = sf.drain_dirty(now + 1_000)
        users.push(user_rows, "user_id")
        items.push(item_rows, "item_id")
        pushed += len(user_rows) + len(item_rows)
        idle_drains += sf.drain_dirty(now + 1_000) == ([], [])  # nothing new: nothing to push
        for u, row in users.rows.items():
            assert {n: float(row[n]) for n in sf.user_names} == sf.lookup_user(u, now + 1_000), (step, u)
        for i, row in items.rows.items():
            assert {n: float(row[n]) for n in sf.item_names} == sf.lookup_item(i, now + 1_000), (step, i)
    assert len(users.rows) == 40 and len(items.rows) == 12 and idle_drains == 300
    assert pushed < 300 * 52 / 2  # the entities changed or passed by a window's edge, not all of them
    # after the last event, windows empty: a day on, every row in the store says 0 (the prior's CTR)
    later = now + 2 * 24 * HOUR
    users.push(sf.drain_dirty(later)[0], "user_id")
    assert {row["user_impressions_24h"] for row in users.rows.values()} == {0}
    assert all(
        sf.lookup_user(u, later) == {n: float(r[n]) for n in sf.user_names} for u, r in users.rows.items()
    )


def test_without_a_time_rows_stay_as_of_each_entitys_newest_event() -> None:
    sf = StreamingFeatures(FeatureConfig())
    sf.record_impression("u", "i", T0)
    assert sf.drain_dirty()[0][0]["user_impressions_1h"] == 1
    assert sf.drain_dirty(T0 + 2 * HOUR) == ([], [])  # no time was given with its last row: no refresh


def test_next_exit_is_the_first_bucket_a_window_loses_an_event() -> None:
    # buckets 10 and 14 (unpacked: shift 0), windows of 3 and 12 buckets, as of bucket 15
    assert next_exit([10, 14], 0, 15, (3, 12)) == 17  # bucket 14 leaves the 3-bucket window at 17
    assert next_exit([10, 14], 0, 17, (3, 12)) == 22  # then 10 leaves the 12-bucket one at 22
    assert next_exit([10, 14], 0, 26, (3, 12)) == 0  # both windows empty: never again


def test_the_item_stage_pushes_what_an_example_attached_now_would_get() -> None:
    stage = ItemStage(FeatureConfig(), delay_ms=MIN)
    rng = random.Random(8)
    store, ts = NewestRowStore(), T0
    for n in range(400):  # ~17 hours, lulls included
        ts += rng.choice((10_000, 60_000, 40 * MIN))
        item = f"ad{rng.randrange(6)}"
        stage.attach([LabelledExample(Impression(f"i{n}", ts, "u", item), rng.random() < 0.2, ts)])
        store.push(stage.drain_rows(), "item_id")
        for i, row in store.rows.items():
            assert {k: float(row[k]) for k in stage.stats.item_names} == stage.stats.lookup_item(i, ts - MIN)


def test_a_refresh_is_no_change_to_checkpoint_and_a_restore_refreshes_the_same_rows() -> None:
    sf = StreamingFeatures(FeatureConfig())
    sf.track_changes()
    sf.record_impression("idle", "a", T0)
    sf.record_impression("busy", "a", T0)
    first = sf.drain_dirty(T0)[0]
    assert set(sf.take_changes()[0]) == {"idle", "busy"}
    sf.record_impression("busy", "a", T0 + 2 * HOUR)
    second = sf.drain_dirty(T0 + 2 * HOUR)[0]
    assert {r["user_id"]: r["user_impressions_1h"] for r in second} == {"idle": 0, "busy": 1}
    assert set(sf.take_changes()[0]) == {"busy"}  # the idle user's record is as it was
    restored = StreamingFeatures.from_state(json.loads(json.dumps(sf.to_state())), FeatureConfig())
    later = T0 + 25 * HOUR  # both users' 24 h windows lose events: both refreshed, by both
    assert restored.drain_dirty(later) == sf.drain_dirty(later) != ([], [])
    restored.record_impression("idle", "a", later)  # the same millisecond: stamped later still
    again = restored.drain_dirty(later)[0][0]["event_timestamp"]
    assert again > max(r["event_timestamp"] for r in first + second) and again.microsecond % 1000 == 1
