"""The Kafka adapters against the real broker (uuid topics and groups from conftest.py).

A simulated stream published with publish_stream is consumed exactly once; a commit and restart
resumes right after the commit; a checkpoint seek resumes there in a fresh group; two members split
the partitions (Range: the same partition numbers of both topics); a rebalance over uncommitted
records rewinds and calls on_revoke, after which a daemon that drops its uncommitted state still sees
every event once; KafkaSink's flush acknowledges or raises; a dead broker fails fast and says where.
Rates printed here are for information (`pytest -s`), never asserted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, RebalanceInProgressError

from pipeline.core.config import KafkaConfig, SimulatorConfig
from pipeline.core.events import DeadLetter, Impression, LabelledExample
from pipeline.core.types import EventKind, RawEvent
from pipeline.kafka import example_records
from pipeline.kafka.io import (
    FencedMemberError,
    KafkaSink,
    KafkaSinkError,
    KafkaUnavailableError,
    caught_up,
    ensure_topics,
    publish_source,
    publish_stream,
)
from pipeline.kafka.sources import KafkaEventSource, KafkaExampleSource
from pipeline.sources.jsonl_mapping import write_jsonl
from pipeline.sources.simulator import Simulator
from pipeline.sources.streams import JsonlSource

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

N_EVENTS = 20_000
Coord = tuple[str, int, int]


def stream(n: int = N_EVENTS, seed: int = 3) -> list[tuple[EventKind, dict[str, Any]]]:
    return list(itertools.islice(Simulator(SimulatorConfig(), seed=seed).stream(n), n))


def source(
    cfg: KafkaConfig, group: str, batch_size: int | None = None, on_revoke: Callable[[], None] | None = None
) -> KafkaEventSource:
    topics: dict[str, EventKind] = {cfg.impressions_topic: "impression", cfg.clicks_topic: "click"}
    return KafkaEventSource(cfg, topics, group, batch_size=batch_size, on_revoke=on_revoke)


def coord(e: RawEvent) -> Coord:
    return (e.source, e.partition, e.offset)


def event_id(e: RawEvent) -> str:
    assert isinstance(e.value, bytes)
    d = json.loads(e.value)
    return d["click_id"] if e.kind == "click" else d["impression_id"]


def drain(src: KafkaEventSource, until: int, timeout_s: float = 30.0) -> list[RawEvent]:
    """Batches until `until` events came (or the deadline passes)."""
    got: list[RawEvent] = []
    deadline = time.monotonic() + timeout_s
    for batch in src.batches():
        got += batch
        if len(got) >= until or time.monotonic() > deadline:
            break
    return got


def published_ids(events: Iterable[tuple[EventKind, dict[str, Any]]]) -> Counter[str]:
    return Counter(e["click_id"] if k == "click" else e["impression_id"] for k, e in events)


def test_publish_then_consume_every_event_exactly_once(kafka_cfg: KafkaConfig, kafka_group: str) -> None:
    events = stream()
    t0 = time.perf_counter()
    counts = publish_stream(kafka_cfg, events)
    produce_s = time.perf_counter() - t0
    assert counts == Counter(k for k, _ in events)

    with source(kafka_cfg, kafka_group) as src:
        first = drain(src, 1)  # group join and first fetch: not part of the rate
        t0 = time.perf_counter()
        got = first + drain(src, N_EVENTS - len(first))
        consume_s = time.perf_counter() - t0
        assert len(got) == N_EVENTS and len({coord(e) for e in got}) == N_EVENTS
        assert Counter(event_id(e) for e in got) == published_ids(events)  # duplicates in the stream too
        assert all(e.kind == ("click" if e.source == kafka_cfg.clicks_topic else "impression") for e in got)
        assert all(e.key and e.key.decode() in e.value.decode() for e in got)  # type: ignore[union-attr]
        snap = src.snapshot()
        assert sum(snap.values()) == N_EVENTS and set(src.lag().values()) == {0}
        assert src.commit(snap) == snap
    consume_rate = (N_EVENTS - len(first)) / consume_s
    print(f"\nproduce {N_EVENTS / produce_s:,.0f} events/s, consume {consume_rate:,.0f} events/s")


def test_commit_then_restart_resumes_right_after_the_commit(
    kafka_cfg: KafkaConfig, kafka_group: str, kafka_admin: KafkaAdminClient
) -> None:
    publish_stream(kafka_cfg, stream(6_000))
    with source(kafka_cfg, kafka_group, batch_size=500) as src:
        done = drain(src, 2_500)
        committed = src.commit(src.snapshot())
        uncommitted = drain(src, 1)  # read after the commit: a crash now must replay these
    with source(kafka_cfg, kafka_group) as src:
        rest = drain(src, 6_000 - len(done))
    assert len(done) + len(rest) == 6_000
    assert {coord(e) for e in done}.isdisjoint({coord(e) for e in rest})
    assert {coord(e) for e in uncommitted} <= {coord(e) for e in rest}
    starts: dict[str, int] = {}
    for e in rest:
        starts.setdefault(f"{e.source}:{e.partition}", e.offset)
    assert all(starts[k] == off for k, off in committed.items() if k in starts)

    # a checkpoint's offsets, in a group that never committed anything, resume at the same place
    group = f"{kafka_group}-seek"
    try:
        with source(kafka_cfg, group) as src:
            src.seek(committed)
            again = drain(src, len(rest))
        assert sorted(map(coord, again)) == sorted(map(coord, rest))
    finally:
        kafka_admin.delete_groups([group])


def _run(
    src: KafkaEventSource,
    out: list[RawEvent],
    stop: threading.Event,
    commit: Callable[[], bool] = lambda: True,
) -> None:
    """A daemon's loop: take a batch, keep it, commit (a rebalance makes the commit fail: go on)."""
    for batch in src.batches():
        out += batch
        if batch and commit():
            # a rebalance makes the commit fail; the next batch reports it through on_revoke
            with contextlib.suppress(CommitFailedError, RebalanceInProgressError):
                src.commit(src.snapshot())
        if stop.is_set():
            return


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_two_members_split_the_partitions_and_read_everything_once(
    kafka_cfg: KafkaConfig, kafka_group: str
) -> None:
    a, b = source(kafka_cfg, kafka_group), source(kafka_cfg, kafka_group)
    got: tuple[list[RawEvent], list[RawEvent]] = ([], [])
    stop = threading.Event()
    threads = [threading.Thread(target=_run, args=(s, g, stop)) for s, g in zip((a, b), got, strict=True)]
    try:
        for t in threads:
            t.start()
        # Range over 2 topics x 3 partitions: one member gets partitions 0-1 of both, the other 2
        _wait(lambda: sorted(map(len, (a.assignment(), b.assignment()))) == [2, 4], "a 4/2 split")
        owned = [s.assignment() for s in (a, b)]
        events = stream(6_000)
        publish_stream(kafka_cfg, events)
        _wait(lambda: len(got[0]) + len(got[1]) >= 6_000, "all events")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        a.close()
        b.close()
    assert set(owned[0]).isdisjoint(owned[1])
    for keys in owned:  # Range: a member owns the same partition numbers of both topics
        numbers = [{k.rsplit(":", 1)[1] for k in keys if k.startswith(f"{t}:")} for t in a.topics]
        assert numbers[0] == numbers[1]
    coords = [coord(e) for g in got for e in g]
    assert len(coords) == len(set(coords)) == 6_000
    assert Counter(event_id(e) for g in got for e in g) == published_ids(events)
    assert {e.partition for e in got[0]}.isdisjoint({e.partition for e in got[1]})  # co-partitioned


def test_a_topic_created_after_subscribing_is_assigned_despite_short_polls(
    kafka_bootstrap: str, kafka_topic: Callable[..., str], kafka_admin: KafkaAdminClient, kafka_group: str
) -> None:
    """kafka-python 3.0.x dropped the assignment of a metadata-triggered rejoin when a poll timed out
    mid-join (pipeline.kafka.compat): the new topic's partitions were never assigned. 1 ms polls
    make every rejoin outlive its poll, as a busy host does to a daemon's 200-1000 ms polls."""
    first = kafka_topic(partitions=2)
    late = f"{first}-late"  # created once the member holds the first topic's partitions
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        group_id=kafka_group,
        enable_auto_commit=False,
        metadata_max_age_ms=300,
    )

    def polled_until(n: int, timeout_ms: int) -> bool:
        deadline = time.monotonic() + 20
        while len(consumer.assignment()) != n and time.monotonic() < deadline:
            consumer.poll(timeout_ms=timeout_ms)
        return len(consumer.assignment()) == n

    try:
        consumer.subscribe([first, late])
        assert polled_until(2, 50) and {tp.topic for tp in consumer.assignment()} == {first}
        spec = {"num_partitions": 2, "replication_factor": 1}
        kafka_admin.create_topics({late: spec}, wait_for_metadata=True)
        assert polled_until(4, 1), f"assigned {sorted(consumer.assignment())} after 20 s of 1 ms polls"
    finally:
        consumer.close()
        kafka_admin.delete_topics([late])


def test_rebalance_over_uncommitted_records_rewinds_and_tells_the_daemon(
    kafka_cfg: KafkaConfig, kafka_group: str
) -> None:
    events = stream(6_000)
    publish_stream(kafka_cfg, events)
    state: list[RawEvent] = []  # member a's in-memory state: dropped on revoke, like a daemon's
    a = source(kafka_cfg, kafka_group, batch_size=1_000, on_revoke=state.clear)
    first = drain(a, 1)  # read, never committed
    state += first
    b_got: list[RawEvent] = []
    stop = threading.Event()
    b = source(kafka_cfg, kafka_group)
    tb = threading.Thread(target=_run, args=(b, b_got, stop))
    ta = threading.Thread(target=_run, args=(a, state, stop, lambda: a.revocations > 0))  # no commit before
    try:
        tb.start()
        ta.start()
        _wait(lambda: a.revocations == 1 and len(state) + len(b_got) >= 6_000, "rebalance and all events")
        time.sleep(0.5)  # anything read twice would arrive now
    finally:
        stop.set()
        tb.join(10)
        ta.join(10)
        a.close()
        b.close()
    assert a.revocations == 1 and b.revocations == 0
    coords = [coord(e) for e in state + b_got]
    assert len(coords) == len(set(coords)) == 6_000


def test_a_member_is_not_caught_up_while_another_members_partitions_are_unread(
    kafka_cfg: KafkaConfig, kafka_group: str
) -> None:
    """The exit-when-idle test: ``caught_up`` is about the group, not about this member alone.

    Member b owns partitions and never commits (as a member killed by SIGKILL does, until the broker
    expires it): a, all read on its own partitions, must not count as caught up. Once b leaves, a is
    given b's partitions, reads them, and only then is caught up, having seen every event."""
    events = stream(6_000)
    publish_stream(kafka_cfg, events)
    b_got: list[RawEvent] = []
    stop_b, stop_a = threading.Event(), threading.Event()
    b = source(kafka_cfg, kafka_group)
    tb = threading.Thread(target=_run, args=(b, b_got, stop_b, lambda: False))  # reads, never commits
    tb.start()
    _wait(lambda: len(b.assignment()) == 6, "b owning every partition")
    a = source(kafka_cfg, kafka_group)
    a_got: list[RawEvent] = []
    verdicts: list[tuple[int, bool, bool]] = []  # (partitions a owns, a's own read to the end, caught_up)

    def run_a() -> None:  # caught_up runs in a's thread, as in a daemon's loop
        for batch in a.batches():
            a_got.extend(batch)
            if batch:
                with contextlib.suppress(CommitFailedError, RebalanceInProgressError):
                    a.commit(a.snapshot())
            lag = a.lag()
            verdicts.append((len(lag), bool(lag) and not any(lag.values()), caught_up(a)))
            if stop_a.is_set():
                return

    ta = threading.Thread(target=run_a)
    try:
        ta.start()
        _wait(lambda: any(0 < n < 6 and read for n, read, _ in verdicts), "a split, a's share read")
        split = [v for v in verdicts if 0 < v[0] < 6 and v[1]]
        assert not any(up for _, _, up in split), "caught up while b's partitions were unread"
        stop_b.set()
        tb.join(10)
        b.close()  # b leaves without committing: its partitions move to a, from their beginning
        _wait(lambda: bool(verdicts) and verdicts[-1] == (6, True, True), "a owning and reading everything")
    finally:
        stop_a.set()
        stop_b.set()
        ta.join(10)
        tb.join(10)
        a.close()
        b.close()
    assert len({coord(e) for e in a_got}) == 6_000  # b's partitions too, read again by a


_MEMBER = """
import json, sys, time
from pipeline.core.config import KafkaConfig
from pipeline.kafka.sources import KafkaEventSource
cfg = KafkaConfig(**json.loads(sys.argv[1]))
topics = {cfg.impressions_topic: "impression", cfg.clicks_topic: "click"}
src = KafkaEventSource(cfg, topics, sys.argv[2], batch_size=500)
got = 0
for batch in src.batches():
    got += len(batch)
    if got >= 2_000:
        break
print(json.dumps(src.commit(src.snapshot())), flush=True)
time.sleep(600)  # SIGKILLed here, without leaving the group
"""


def test_a_static_member_killed_and_restarted_gets_its_partitions_back_at_once(
    kafka_cfg: KafkaConfig, kafka_group: str
) -> None:
    """With ``group_instance_id`` the restarted process takes the dead one's place in the group; a
    dynamic member would own nothing until the broker expired the dead one (session timeout, 45 s)."""
    static = dataclasses.replace(kafka_cfg, group_instance_id="joiner@host-a")
    publish_stream(static, stream(6_000))
    argv = [sys.executable, "-c", _MEMBER, json.dumps(dataclasses.asdict(static), default=str), kafka_group]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        committed = json.loads(proc.stdout.readline() or "null")  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()
    assert committed and sum(committed.values()) >= 2_000
    with source(static, kafka_group) as again:
        rest = drain(again, 6_000 - sum(committed.values()), timeout_s=30)  # well inside the 45 s
        owned = again.assignment()
    assert len(owned) == 6 and len(rest) == 6_000 - sum(committed.values())
    starts: dict[str, int] = {}
    for e in rest:
        starts.setdefault(f"{e.source}:{e.partition}", e.offset)
    assert all(starts[k] == off for k, off in committed.items() if k in starts)  # resumed at the commit


def test_a_member_whose_instance_id_another_process_took_stops_with_a_clear_error(
    kafka_cfg: KafkaConfig, kafka_group: str
) -> None:
    """kafka-python keeps fetching when fenced; the source turns the broker's refusal into an error
    that stops the daemon, so two processes never work on the same partitions."""
    static = dataclasses.replace(kafka_cfg, group_instance_id="joiner@host-a")
    publish_stream(static, stream(2_000))
    a = source(static, kafka_group)
    b: KafkaEventSource | None = None
    try:
        assert drain(a, 1)
        b = source(static, kafka_group)  # another process joins as the same instance: a is fenced
        assert drain(b, 1)
        with pytest.raises(FencedMemberError, match=r"its own kafka\.group_instance_id"):
            a.commit(a.snapshot())
        assert a.fenced and not b.fenced
        assert b.commit(b.snapshot())  # the newcomer owns the partitions
    finally:
        a.close()
        if b is not None:
            b.close()


def test_sink_flush_acknowledges_or_raises(kafka_cfg: KafkaConfig, kafka_topic: Callable[..., str]) -> None:
    with KafkaSink(kafka_cfg, kafka_cfg.dead_letter_topic) as sink:
        for i in range(1_000):
            sink.write(DeadLetter("bad_json", "x", "impression", b"{", "impressions", 0, i))
        assert sink.flush() == 1_000
    consumer = KafkaConsumer(bootstrap_servers=kafka_cfg.bootstrap_servers)
    tp = TopicPartition(kafka_cfg.dead_letter_topic, 0)
    assert consumer.end_offsets([tp])[tp] == 1_000
    consumer.close()

    small = kafka_topic(partitions=1, **{"max.message.bytes": "2048"})
    with KafkaSink(kafka_cfg, small) as sink:
        sink.send(b"k", b"fits")
        sink.send(b"k", b"x" * 10_000)  # the broker refuses it: flush must say so
        with pytest.raises(KafkaSinkError, match=r"of 2 records sent since the last flush failed"):
            sink.flush()
        sink.send(b"k", b"fits too")  # the sink recovers (kafka-python alone keeps failing the partition)
        assert sink.flush() == 1
    quick = dataclasses.replace(kafka_cfg, connect_timeout_ms=1_000)  # bounds send()'s wait for metadata
    with (
        KafkaSink(quick, "no-such-topic-" + small) as sink,
        pytest.raises(KafkaSinkError, match="does it exist"),
    ):
        sink.send(None, b"x")


def test_example_source_splits_examples_from_dead_letters(kafka_cfg: KafkaConfig, kafka_group: str) -> None:
    examples = [
        LabelledExample(
            Impression(f"imp-{i}", 1_700_000_000_000 + i, f"u_{i % 7}", "ad", {"s": "1"}), i % 2, 1
        )
        for i in range(200)
    ]
    values = [ex.to_json() for ex in examples]
    with KafkaSink(kafka_cfg, kafka_cfg.examples_topic) as sink:
        for value in values[:20]:  # one example per record, as before batches
            sink.send(None, value)
        for value in example_records.records(values[20:], per_record=30):  # 30 per record: 6 records
            sink.send(None, value)
        for bad in (b"{oops", b'{"label": 1}', b""):
            sink.send(None, bad)
        sink.send(None, b"\n".join([values[0], b"{oops", values[1]]))  # a bad line among good ones
        sink.flush()
    with KafkaExampleSource(kafka_cfg, kafka_group) as src:
        good: list[LabelledExample] = []
        dead: list[DeadLetter] = []
        where: list[tuple[str, int, int]] = []
        deadline = time.monotonic() + 30
        for batch in src.batches():
            good += batch.examples
            dead += batch.dead
            where += batch.where
            if len(good) + len(dead) >= 206 or time.monotonic() > deadline:
                break
        assert sum(src.snapshot().values()) == 20 + 6 + 3 + 1  # records
    want = sorted(examples + examples[:2], key=lambda e: e.example_id)
    assert sorted(good, key=lambda e: e.example_id) == want
    assert sorted(d.reason for d in dead) == ["bad_json", "bad_json", "bad_json", "missing_field"]
    assert [d.detail.startswith("line 1 of the record") for d in dead].count(True) == 1
    assert len({(tp, at) for tp, at, _ in where}) == len(good)  # each example its own position ...
    for (tp, at, after), (tp2, at2, _) in itertools.pairwise(where):
        assert at < after and (tp != tp2 or after <= at2)  # ... and the next one after it
    records_of_examples = {(tp, at // example_records.STRIDE) for tp, at, _ in where}
    assert len(records_of_examples) == 20 + 6 + 1
    assert {(f"{d.source}:{d.partition}", d.offset) for d in dead if "line" not in d.detail}.isdisjoint(
        records_of_examples
    )


def test_publish_a_log_and_ensure_topics(
    kafka_cfg: KafkaConfig,
    kafka_group: str,
    kafka_admin: KafkaAdminClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "events.jsonl"
    write_jsonl(stream(300), path)
    with path.open("ab") as f:
        f.write(b"not an event\n")
    counts = publish_source(kafka_cfg, JsonlSource([path]), rate=2_000, progress=True)
    assert sum(counts.values()) == 301
    assert "published: " in capsys.readouterr().err  # the progress bar (`ctr produce --source`)
    with source(kafka_cfg, kafka_group) as src:
        got = drain(src, 301)
    assert len(got) == 301 and b"not an event" in {e.value for e in got}

    names = [f"{kafka_cfg.impressions_topic}-new{i}" for i in range(2)]
    try:
        assert sorted(ensure_topics(kafka_cfg, [*names, kafka_cfg.clicks_topic], partitions=2)) == names
        assert ensure_topics(kafka_cfg, names) == []  # idempotent
        described = kafka_admin.describe_topics(names)
        assert [len(t["partitions"]) for t in described] == [2, 2]
    finally:
        kafka_admin.delete_topics(names)


def test_unreachable_broker_fails_fast_and_says_where() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = KafkaConfig(bootstrap_servers=f"127.0.0.1:{port}", connect_timeout_ms=1_000)
    for build in (lambda: KafkaSink(cfg, "t"), lambda: source(cfg, "g"), lambda: ensure_topics(cfg, ["t"])):
        t0 = time.monotonic()
        with pytest.raises(KafkaUnavailableError, match=f"127.0.0.1:{port}.*within 1000 ms"):
            build()
        assert time.monotonic() - t0 < 10
