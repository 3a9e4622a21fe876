"""Joiner edge cases: late click, click before impression, duplicates, expiry, checkpoints."""

from __future__ import annotations

import json

import pytest

from pipeline.core.config import JoinerConfig
from pipeline.core.events import Click, Conversion, Impression
from pipeline.join.joiner import Joiner

MIN = 60_000
T0 = 1_767_225_600_000


def imp(iid: str, ts: int, user: str = "u1", item: str = "a1") -> Impression:
    return Impression(iid, T0 + ts, user, item, {"site": "s"})


def click(cid: str, iid: str, ts: int, user: str = "u1") -> Click:
    return Click(cid, iid, T0 + ts, user)


def joiner(**kw: float) -> Joiner:
    return Joiner(JoinerConfig(**{"attribution_window_s": 900, "watermark_lag_s": 0, **kw}))


def labels(j: Joiner) -> dict[str, int]:
    return {e.example_id: e.label for e in j.drain()}


def test_click_within_window_makes_a_positive_at_window_end() -> None:
    j = joiner()
    j.process_all([imp("i1", 0), click("c1", "i1", 2 * MIN), imp("i2", 15 * MIN)])
    assert j.drain() == []  # the window is open until 15 min
    j.process_all([imp("i3", 15 * MIN + 1)])
    out = j.drain()
    assert [(e.example_id, e.label, e.label_ts) for e in out] == [("i1", 1, T0 + 2 * MIN)]


def test_examples_come_out_in_impression_time_order() -> None:
    j = joiner()
    j.process_all([imp("i1", 0), imp("i2", MIN), click("c2", "i2", 2 * MIN), imp("i3", 3 * MIN)])
    j.flush()
    assert [(e.example_id, e.label) for e in j.drain()] == [("i1", 0), ("i2", 1), ("i3", 0)]


def test_no_click_becomes_negative_only_after_window_end() -> None:
    j = joiner()
    j.process_all([imp("i1", 0), imp("i2", 14 * MIN)])
    assert labels(j) == {}
    j.process_all([imp("i3", 15 * MIN + 1)])  # watermark passes i1's window end
    out = j.drain()
    assert [(e.example_id, e.label, e.label_ts) for e in out] == [("i1", 0, T0 + 15 * MIN)]


def test_late_click_after_negative_is_counted_not_attributed() -> None:
    j = joiner()
    j.process_all([imp("i1", 0), imp("i2", 16 * MIN)])
    assert labels(j) == {"i1": 0}
    j.process_all([click("c1", "i1", 16 * MIN)])
    assert labels(j) == {}
    assert j.stats.late_clicks == 1


def test_late_click_while_still_pending_uses_event_time() -> None:
    j = joiner(watermark_lag_s=3600)  # the impression is still open, but the click is too late
    j.process_all([imp("i1", 0), click("c1", "i1", 20 * MIN)])
    j.flush()
    assert labels(j) == {"i1": 0}
    assert j.stats.late_clicks == 1


def test_click_before_impression_is_held_and_joined() -> None:
    j = joiner()
    j.process_all([click("c1", "i1", 1 * MIN), imp("i1", 0)])
    j.flush()
    assert labels(j) == {"i1": 1}
    assert j.stats.early_clicks == 1 and j.stats.orphan_clicks == 0


def test_click_whose_impression_never_comes_is_orphaned() -> None:
    j = joiner(early_click_hold_s=600)
    j.process_all([click("c1", "ghost", 0), imp("i9", 11 * MIN)])
    assert j.stats.orphan_clicks == 1
    [rejected] = j.drain_rejected()  # a dead letter with its reason: never dropped silently
    assert (rejected.event.click_id, rejected.reason) == ("c1", "orphan_click")
    assert "ghost" in rejected.detail
    j.flush()
    assert labels(j) == {"i9": 0}


def test_duplicate_impression_and_clicks_are_dropped() -> None:
    j = joiner()
    j.process_all(
        [
            imp("i1", 0),
            imp("i1", 0),
            click("c1", "i1", MIN),
            click("c1", "i1", MIN),
            click("c2", "i1", 2 * MIN),
            imp("i1", 3 * MIN),
        ]
    )
    j.flush()
    assert [(e.example_id, e.label) for e in j.drain()] == [("i1", 1)]
    assert j.stats.duplicate_impressions == 2
    assert j.stats.duplicate_clicks == 2


def test_duplicate_impression_after_it_was_finalised_is_dropped() -> None:
    j = joiner(dedup_horizon_s=3600)
    j.process_all([imp("i1", 0), imp("i2", 20 * MIN)])
    j.process_all([imp("i1", 0)])
    j.flush()
    assert sorted(labels(j)) == ["i1", "i2"]
    assert j.stats.duplicate_impressions == 1


def test_click_from_another_user_is_rejected() -> None:
    j = joiner()
    j.process_all([imp("i1", 0, user="u1"), click("c1", "i1", MIN, user="u2")])
    rejected = j.drain_rejected()
    assert [(r.event.click_id, r.reason) for r in rejected] == [("c1", "user_mismatch")]
    j.flush()
    assert labels(j) == {"i1": 0}


class RecordingFeatures:
    """Counts impressions and clicks per user; lookup returns the counts so far."""

    def __init__(self) -> None:
        self.imps: dict[str, int] = {}
        self.clicks: dict[str, int] = {}

    def lookup(self, user_id: str, item_id: str, ts_ms: int) -> dict[str, float]:
        return {"imps": self.imps.get(user_id, 0), "clicks": self.clicks.get(user_id, 0)}

    def record_impression(self, user_id: str, item_id: str, ts_ms: int) -> None:
        self.imps[user_id] = self.imps.get(user_id, 0) + 1

    def record_click(self, user_id: str, item_id: str, ts_ms: int) -> None:
        self.clicks[user_id] = self.clicks.get(user_id, 0) + 1

    def forget_idle(self, watermark_ms: int) -> list[str]:
        return []  # counts forever

    def has_user(self, user_id: str) -> bool:
        return user_id in self.imps


def test_examples_carry_features_from_before_their_own_impression() -> None:
    j = Joiner(JoinerConfig(attribution_window_s=900, watermark_lag_s=0), features=RecordingFeatures())
    j.process_all([imp("i1", 0), click("c1", "i1", MIN), imp("i2", 2 * MIN), imp("i3", 3 * MIN)])
    j.flush()
    feats = {e.example_id: e.stream_features for e in j.drain()}
    assert feats == {
        "i1": {"imps": 0, "clicks": 0},
        "i2": {"imps": 1, "clicks": 1},
        "i3": {"imps": 2, "clicks": 1},
    }


def _stream() -> list[Impression | Click]:
    events: list[Impression | Click] = []
    for n in range(200):
        events.append(imp(f"i{n}", n * 10_000, user=f"u{n % 7}"))
        if n % 3 == 0:
            events.append(click(f"c{n}", f"i{n}", n * 10_000 + 30_000, user=f"u{n % 7}"))
        if n % 17 == 0:
            events.append(click(f"e{n}", f"i{n + 1}", (n + 1) * 10_000 + 5_000, user=f"u{(n + 1) % 7}"))
    return events


@pytest.mark.parametrize("cut", [1, 57, 150, 250])
def test_checkpoint_and_resume_gives_the_uninterrupted_output(cut: int) -> None:
    events = _stream()
    whole = joiner(watermark_lag_s=30)
    whole.process_all(events)
    whole.flush()
    expected = [(e.example_id, e.label, e.label_ts) for e in whole.drain()]

    first = joiner(watermark_lag_s=30)
    first.process_all(events[:cut])
    got = [(e.example_id, e.label, e.label_ts) for e in first.drain()]
    state = json.loads(json.dumps(first.to_state()))
    second = joiner(watermark_lag_s=30)
    second.load_state(state)
    second.process_all(events[cut:])
    second.flush()
    got += [(e.example_id, e.label, e.label_ts) for e in second.drain()]
    assert sorted(got) == sorted(expected)
    assert second.stats == whole.stats


def test_checkpoint_refuses_undrained_output() -> None:
    j = joiner()
    j.process_all([imp("i1", 0), click("c1", "i1", MIN), imp("i2", 20 * MIN)])
    with pytest.raises(RuntimeError, match="drain"):
        j.to_state()


def conversion(vid: str, iid: str, ts: int, user: str = "u1", value: float | None = None) -> Conversion:
    return Conversion(vid, iid, T0 + ts, user, value)


def test_a_clicked_impression_is_corrected_when_its_conversion_window_closes() -> None:
    j = joiner(conversion_window_s=3_600)
    j.process_all(
        [imp("i1", 0), click("c1", "i1", MIN), imp("i2", MIN), conversion("v1", "i1", 30 * MIN, value=9.5)]
    )
    j.process_all([imp("i3", 16 * MIN)])  # both click windows closed, i1's conversion window open
    out = j.drain()
    assert [(e.example_id, e.label, e.conversion) for e in out] == [("i1", 1, None), ("i2", 0, 0)]
    j.process_all([imp("i4", 61 * MIN + 1)])  # past c1 + 60 min
    fix = j.drain()
    assert [(e.example_id, e.label, e.label_ts, e.conversion, e.correction) for e in fix] == [
        ("i3", 0, T0 + 31 * MIN, 0, False),
        ("i1#cv", 1, T0 + 61 * MIN, 1, True),  # at its window's end, converted or not
    ]
    assert fix[1].conversion_value == 9.5 and fix[1].stream_features == out[0].stream_features
    assert (j.stats.corrections, j.stats.converted, j.stats.examples) == (1, 1, 3)


def test_a_click_without_conversion_is_corrected_to_zero_at_window_end() -> None:
    j = joiner(conversion_window_s=600)  # shorter than the click window: corrected with it
    j.process_all([imp("i1", 0), click("c1", "i1", MIN), imp("i2", 16 * MIN)])
    assert [(e.example_id, e.conversion, e.label_ts) for e in j.drain()] == [
        ("i1", None, T0 + MIN),
        ("i1#cv", 0, T0 + 15 * MIN),
    ]


def test_conversions_that_cannot_be_attributed_are_counted_or_dead_letters() -> None:
    j = joiner(conversion_window_s=3_600)
    j.process_all(
        [
            imp("i1", 0),
            imp("i2", 0),
            imp("i3", 0, user="u2"),
            conversion("v0", "i2", MIN),  # i2 never clicked (yet): post-view
            click("c1", "i1", MIN),
            click("c3", "i3", MIN, user="u2"),
            conversion("v1", "i1", 2 * MIN),
            conversion("v1b", "i1", 3 * MIN),  # a second one for i1
            conversion("v3", "i3", 3 * MIN, user="u1"),  # another user's
            conversion("vx", "nowhere", 3 * MIN),
            conversion("v3late", "i3", 62 * MIN, user="u2"),  # past c3 + 60 min, i3 still held
            imp("i9", 70 * MIN),
            conversion("v2", "i2", 70 * MIN),  # i2 finalised as a negative, still remembered
        ]
    )
    s = j.stats
    assert (s.conversions, s.converted, s.duplicate_conversions) == (7, 1, 1)
    assert (s.unclicked_conversions, s.late_conversions, s.orphan_conversions) == (2, 1, 1)
    rejected = [(r.event.conversion_id, r.reason) for r in j.drain_rejected()]
    assert rejected == [("v3", "user_mismatch"), ("vx", "orphan_conversion")]


def test_without_a_conversion_window_conversions_are_counted_and_ignored() -> None:
    j = joiner()
    j.process_all(
        [imp("i1", 0), click("c1", "i1", MIN), conversion("v1", "i1", 2 * MIN), imp("i2", 16 * MIN)]
    )
    assert [(e.example_id, e.conversion) for e in j.drain()] == [("i1", None)]
    assert (j.stats.conversions, j.stats.ignored_conversions) == (1, 1)
