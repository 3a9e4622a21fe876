"""A replay runs the daemon's partition tasks: its examples do not depend on batch sizes, are what
the tasks give when fed partition by partition as Kafka would, and the items are sharded alike."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pipeline.core.config import Config
from pipeline.core.events import DeadLetter, LabelledExample
from pipeline.core.partitioning import partition_of
from pipeline.core.types import ManualClock, RawEvent
from pipeline.core.validation import Validator
from pipeline.join.partition_task import PartitionTask
from pipeline.join.partitioned_join import PROMISE_EVERY, PartitionedJoin
from pipeline.sources.simulator import Simulator


class Letters(list[DeadLetter]):
    def write(self, letter: DeadLetter) -> None:
        self.append(letter)


def config(partitions: int) -> Config:
    cfg = Config()
    cfg.kafka = dataclasses.replace(cfg.kafka, partitions=partitions)
    return cfg


def events(n: int = 3_000) -> list[RawEvent]:
    out = []
    for kind, e in Simulator(Config().simulator, seed=5).stream(n):
        out.append(RawEvent(kind, e, "sim", key=e["user_id"].encode()))
    return out


def replay(cfg: Config, raw: list[RawEvent], batch: int) -> tuple[list[LabelledExample], Letters]:
    letters = Letters()
    join = PartitionedJoin(cfg, ManualClock(0), letters)
    out: list[LabelledExample] = []
    for b in range(0, len(raw), batch):
        out += join.step([dataclasses.replace(r) for r in raw[b : b + batch]])
    return out + join.finish(), letters


@pytest.mark.parametrize("partitions", [1, 3])
def test_examples_and_their_order_do_not_depend_on_batch_sizes(partitions: int) -> None:
    raw = events()
    big, dead_big = replay(config(partitions), raw, 5_000)
    small, dead_small = replay(config(partitions), raw, 97)
    assert [e.to_json() for e in big] == [e.to_json() for e in small] and len(big) > 1_000
    assert [d.to_json() for d in dead_big] == [d.to_json() for d in dead_small]


def as_kafka_holds(raw: list[RawEvent], partitions: int) -> dict[int, list[RawEvent]]:
    """Each partition's records, with their offsets, as Kafka holds them."""
    per_partition: dict[int, list[RawEvent]] = {p: [] for p in range(partitions)}
    offsets = {(k, p): 0 for k in ("impression", "click") for p in range(partitions)}
    for r in raw:
        p = partition_of(r.key.decode(), partitions)  # type: ignore[union-attr]
        off, offsets[r.kind, p] = offsets[r.kind, p], offsets[r.kind, p] + 1
        ts = r.value["ts"]  # type: ignore[index]
        per_partition[p].append(dataclasses.replace(r, partition=p, offset=off, entered_ms=ts))
    return per_partition


def fed_as_the_daemon(cfg: Config, p: int, records: list[RawEvent], rng: random.Random) -> list[bytes]:
    """Partition ``p``'s task fed ``records`` in chunks of random sizes, then run to its end."""
    validator = Validator(cfg.validation, ManualClock(0), lambda u: partition_of(u, cfg.kafka.partitions))
    task = PartitionTask(cfg, p)
    while records:
        n = rng.randrange(1, 300)
        for r in records[:n]:
            ev = validator.validate(r)
            task.offer(r.kind, r.offset, None if isinstance(ev, DeadLetter) else ev)
        records = records[n:]
        task.run(at_end=lambda kind: False)
    task.run(now=float("inf"), at_end=lambda kind: True)
    task.joiner.flush()
    return [e.to_json() for e in task.drain()]


def test_the_replay_gives_what_the_daemons_tasks_give_fed_partition_by_partition() -> None:
    cfg, raw = config(3), events()
    replayed, _ = replay(cfg, raw, 500)
    rng = random.Random(1)
    daemon: list[bytes] = []
    for p, records in as_kafka_holds(raw, 3).items():
        daemon += fed_as_the_daemon(cfg, p, records, rng)
    assert sorted(e.to_json() for e in replayed) == sorted(daemon) and len(daemon) > 1_000


def test_the_tasks_push_user_rows_only_as_in_the_daemon() -> None:
    join = PartitionedJoin(config(3), ManualClock(0), Letters())
    raw = events(500)
    join.step(raw)
    join.finish()
    users = join.drain_features()
    raw_users = {r.value["user_id"] for r in raw if isinstance(r.value, dict)}
    assert len({row["user_id"] for row in users}) == len(users) == len(raw_users)  # pseudonyms, 1:1


def slow_events(n: int) -> list[RawEvent]:
    """``n`` simulated events at 2 impressions per event-time second: windows close mid-stream."""
    sim = dataclasses.replace(Config().simulator, events_per_s=2.0)
    return [RawEvent(k, e, "sim", key=e["user_id"].encode()) for k, e in Simulator(sim, seed=5).stream(n)]


def one_user(raw: list[RawEvent]) -> list[RawEvent]:
    """The same events, all of one user (a Criteo log's "anon"): one partition gets every one."""
    out = []
    for r in raw:
        assert isinstance(r.value, dict)
        out.append(dataclasses.replace(r, value={**r.value, "user_id": "anon"}, key=b"anon"))
    return out


def test_a_partition_without_events_does_not_hold_back_the_others_examples() -> None:
    cfg, raw = config(3), one_user(slow_events(6_000))
    join = PartitionedJoin(cfg, ManualClock(0), Letters())
    during: list[LabelledExample] = []
    most_held = 0
    for b in range(0, len(raw), 200):
        during += join.step([dataclasses.replace(r) for r in raw[b : b + 200]])
        most_held = max(most_held, join.merge.buffered)
    after = join.finish()
    # partitions 0 and 2 never get an event: before the promises every example waited for the end
    assert len(during) > len(after) and len(during) + len(after) > 4_000  # the last window: at the end
    assert most_held < 2 * PROMISE_EVERY
    assert join.stats["examples_past_merge_promise"] == 0
    # in the order the one partition's task gives them, fed as the daemon feeds it
    p = partition_of("anon", 3)
    daemon = fed_as_the_daemon(cfg, p, as_kafka_holds(raw, 3)[p], random.Random(1))
    assert [e.to_json() for e in during + after] == daemon


def test_an_impression_later_than_its_promise_is_counted_and_its_place_does_not_depend_on_batches() -> None:
    cfg, raw = config(3), slow_events(4_000)
    first = next(r for r in raw if r.kind == "impression")
    assert isinstance(first.value, dict)
    # a last event two hours older than the stream's start: every partition promised more by then
    value = {**first.value, "impression_id": "late-1", "ts": first.value["ts"] - 7_200_000}
    stream = [*raw, dataclasses.replace(first, value=value)]
    big, _ = replay(cfg, stream, 5_000)
    small, _ = replay(cfg, stream, 61)
    assert [e.to_json() for e in big] == [e.to_json() for e in small]
    assert "late-1" in {e.example_id for e in big}
    join = PartitionedJoin(cfg, ManualClock(0), Letters())
    join.step([dataclasses.replace(r) for r in stream])
    join.finish()
    assert join.stats["examples_past_merge_promise"] == 1
