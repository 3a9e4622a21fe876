"""Replay entry times: a gap in event time is never a reason to reject; a corrupt timestamp is."""

from __future__ import annotations

import dataclasses

from pipeline.core.config import Config
from pipeline.core.entered_time import EnteredTime
from pipeline.core.events import DeadLetter
from pipeline.core.types import ManualClock, RawEvent
from pipeline.join.partitioned_join import PartitionedJoin

HOUR = 3_600_000
T0 = 1_767_225_600_000


class Letters(list[DeadLetter]):
    def write(self, letter: DeadLetter) -> None:
        self.append(letter)


def impression(i: int, ts: int) -> RawEvent:
    value = {"impression_id": f"i{i}", "ts": ts, "user_id": "u", "item_id": "a"}
    return RawEvent("impression", value, "f", key=b"u")


def one_partition() -> Config:
    cfg = Config()
    cfg.kafka = dataclasses.replace(cfg.kafka, partitions=1)
    return cfg


def test_gaps_of_hours_and_weeks_replay_without_dead_letters() -> None:
    ts = [T0 + i * 1_000 for i in range(200)]
    ts += [ts[-1] + 2 * HOUR + i * 1_000 for i in range(200)]  # a 2-hour gap
    ts += [ts[-1] + 30 * 24 * HOUR + i * 1_000 for i in range(200)]  # a month-long gap
    letters = Letters()
    join = PartitionedJoin(one_partition(), ManualClock(T0), letters)
    events = [impression(i, t) for i, t in enumerate(ts)]
    for b in range(0, len(events), 64):  # batch edges too
        join.step(events[b : b + 64])
    assert not letters and len(join.finish()) == len(ts)


def test_corrupt_timestamps_are_refused_among_good_neighbours() -> None:
    ts = [T0 + i * 1_000 for i in range(300)]
    ts[100] = T0 + 400 * 24 * HOUR  # a year ahead (milliseconds as microseconds, say)
    ts[200] = T0 - 90 * 24 * HOUR  # three months behind
    letters = Letters()
    join = PartitionedJoin(one_partition(), ManualClock(0), letters)
    join.step([impression(i, t) for i, t in enumerate(ts)])
    assert sorted(d.reason for d in letters) == ["ts_in_future", "ts_too_old"]


def test_references_continue_across_batches_and_leave_stamped_events_alone() -> None:
    ref = EnteredTime(max_future_skew_s=300, max_past_age_s=86_400)
    first = [impression(i, T0 + i) for i in range(50)]
    ref.assign(first)
    late = impression(99, T0 - 10 * 24 * HOUR)  # ten days behind the previous batch
    kafka = impression(98, T0)
    kafka.entered_ms = 42  # a Kafka record's timestamp is kept as it is
    ref.assign([late, kafka])
    assert [e.entered_ms for e in first] == [T0 + i for i in range(50)]
    assert late.entered_ms is not None and late.entered_ms > late.value["ts"] + 86_400_000  # type: ignore[index]
    assert kafka.entered_ms == 42
