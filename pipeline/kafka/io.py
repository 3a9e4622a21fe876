"""Kafka adapters of the production profile: :class:`GroupSource`, the consumer-group member the
daemons' sources (:mod:`pipeline.kafka.sources`) are made of, plus, re-exported, client settings,
topics and :class:`KafkaSink` (:mod:`pipeline.kafka.client`), ``ctr produce``
(:mod:`pipeline.kafka.publish`) and snapshot parsing (:mod:`pipeline.kafka.offsets`).

:class:`~pipeline.kafka.sources.KafkaEventSource` implements :class:`pipeline.core.types.Source` over a
consumer group with manual commits. The daemon loop that gives exactly-once *effect*::

    src = KafkaEventSource(cfg, {cfg.impressions_topic: "impression", cfg.clicks_topic: "click"},
                           group_id=f"{cfg.group_id_prefix}-joiner", on_revoke=joiner.reset)
    for batch in src.batches():          # [] every poll_timeout_ms when idle: time-based work here
        out = process(batch)
        sink.send(...); sink.flush()     # durable (raises if not)
        src.commit(src.snapshot())       # only now: a crash before this replays the batch

A crash replays everything after the last commit; writes downstream are idempotent (dedup by id).

**Rebalances look like a restart.** kafka-python runs the rebalance callbacks on its IO thread while
the daemon's thread is blocked inside ``poll``, so nothing can be committed in them. Instead, when a
rebalance takes away records the daemon was given but has not committed, the source rewinds every
partition it keeps to its last commit (a revoked partition resumes at that commit on its new owner),
counts it in ``revocations`` and calls ``on_revoke()`` in the daemon's thread before the next batch.
The daemon then drops its uncommitted in-memory state (e.g. pending joins) and carries on: what
follows is the replay from the last commit. A rebalance after everything was committed needs nothing.

**Resuming from a checkpoint.** ``seek(snapshot)`` before (or during) consumption makes partitions
start at the snapshot's offsets when they are assigned, instead of at the group's committed offsets;
the trainer keeps offsets in its checkpoint and seeks to them, so a crash between checkpoint and
commit neither loses nor repeats a block.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Self

from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import FencedInstanceIdError, KafkaError

from pipeline.core.config import KafkaConfig
from pipeline.core.types import Clock
from pipeline.kafka.client import (
    FencedMemberError,
    KafkaSink,
    KafkaSinkError,
    KafkaUnavailableError,
    connect,
    ensure_topics,
    kafka_client_kwargs,
)
from pipeline.kafka.offsets import OffsetBook, RebalanceListener, parse_snapshot, snapshot_key
from pipeline.kafka.publish import RateLimiter, publish_source, publish_stream

__all__ = [
    "FencedMemberError",
    "GroupSource",
    "KafkaSink",
    "KafkaSinkError",
    "KafkaUnavailableError",
    "RateLimiter",
    "caught_up",
    "ensure_topics",
    "kafka_client_kwargs",
    "parse_snapshot",
    "publish_source",
    "publish_stream",
]

log = logging.getLogger(__name__)


class GroupSource:
    """A consumer-group member with manual commits: polling, snapshots, commits, seeks, lag."""

    def __init__(
        self,
        cfg: KafkaConfig,
        topics: Iterable[str],
        group_id: str,
        batch_size: int | None,
        clock: Clock,
        on_revoke: Callable[[], None] | None,
        read_committed: bool = False,
    ) -> None:
        self.cfg, self.group_id, self.clock, self.on_revoke = cfg, group_id, clock, on_revoke
        self.batch_size = batch_size or cfg.max_poll_records
        self.revocations = 0  # rebalances that rewound this source (see the module docstring)
        self.poll_failures = 0  # polls that raised (broker away); retried every second
        self.fenced = False  # another process took our group_instance_id (see FencedMemberError)
        self._book = OffsetBook()
        self._end_lag: dict[str, int] = {}  # read_to_end's lag and when it was measured
        self._end_lag_at = float("-inf")
        self._stop = threading.Event()
        self._consumer = connect(
            KafkaConsumer,
            cfg,
            f"consumer group {group_id!r}",
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.batch_size,
            max_poll_interval_ms=cfg.max_poll_interval_ms,
            group_instance_id=cfg.group_instance_id or None,
            check_crcs=cfg.check_crcs,
            # read_committed: a newly assigned partition waits for its open transaction (changelog.py)
            isolation_level="read_committed" if read_committed else "read_uncommitted",
            # Range gives one member the same partition number of every topic: impressions and
            # clicks of one user (same key, same partition count) reach the same joiner.
            partition_assignment_strategy=(RangePartitionAssignor,),
        )
        self._topics = sorted(set(topics))
        self._consumer.subscribe(topics=self._topics, listener=RebalanceListener(self._consumer, self._book))

    def _polls(self) -> Iterator[list[ConsumerRecord]]:
        """Records of each poll until ``stop()``; an empty list when a poll found nothing."""
        failing = False
        while not self._stop.is_set():
            try:
                polled = self._consumer.poll(timeout_ms=self.cfg.poll_timeout_ms, max_records=self.batch_size)
            except FencedInstanceIdError as exc:
                raise self._fenced(exc) from exc
            except KafkaError as exc:  # broker away (e.g. no coordinator): wait, and tell the caller
                self.poll_failures += 1
                if not failing:
                    log.warning("kafka: poll failed (%r); retrying until the broker is back", exc)
                failing = True
                self._stop.wait(1.0)
                yield []  # an idle batch: the daemon keeps its time-based work (watchdog) going
                continue
            if failing:
                log.warning("kafka: polling again")
                failing = False
            if self._book.take_disrupted():
                self.revocations += 1
                if self.on_revoke is not None:
                    self.on_revoke()
            records: list[ConsumerRecord] = []
            for tp, recs in polled.items():
                self._book.yielded(tp, recs[0].offset, recs[-1].offset)
                records.extend(recs)
            yield records

    def stop(self) -> None:
        """Make ``batches()`` return after the current poll (callable from any thread or a signal)."""
        self._stop.set()

    def snapshot(self) -> dict[str, int]:
        """``{"topic:partition": next_offset}`` after everything yielded so far (owned partitions)."""
        with self._book.lock:
            return {snapshot_key(tp): off for tp, off in sorted(self._book.positions.items())}

    def commit(
        self, snapshot: Mapping[str, int], transaction: Callable[[dict[Any, Any], Any], None] | None = None
    ) -> dict[str, int]:
        """Commit exactly these offsets for the partitions this member owns; returns what it committed.

        Entries for partitions it does not own (any more) are skipped: committing them could move
        another member's position. Raises ``kafka.errors.CommitFailedError`` if the group is
        rebalancing; the next batch then reports the rebalance (``on_revoke``), and
        :class:`FencedMemberError` if another process took this member's ``group_instance_id``.
        ``transaction(offsets, group_metadata)``: commit them inside a producer's transaction
        (``KafkaProducer.send_offsets_to_transaction``) instead of directly.
        """
        offsets = parse_snapshot(snapshot)
        mine = {tp: off for tp, off in offsets.items() if tp in self._book.owned}
        if mine:
            commit = {tp: OffsetAndMetadata(off, "", -1) for tp, off in mine.items()}
            try:
                if transaction is None:
                    self._consumer.commit(commit, timeout_ms=self.cfg.request_timeout_ms)
                else:
                    transaction(commit, self._consumer.group_metadata())
            except FencedInstanceIdError as exc:
                raise self._fenced(exc) from exc
            self._book.committed(mine)
        return {snapshot_key(tp): off for tp, off in sorted(mine.items())}

    def _fenced(self, exc: Exception) -> FencedMemberError:
        """kafka-python only stops heartbeating when fenced and keeps fetching: the caller must stop."""
        self.fenced = True
        return FencedMemberError(
            f"consumer group {self.group_id!r}: another process joined as instance "
            f"{self.cfg.group_instance_id!r}, so this one no longer owns its partitions and stops ({exc!r}). "
            "Give every daemon process its own kafka.group_instance_id (CTR_KAFKA_GROUP_INSTANCE_ID)."
        )

    def seek(self, snapshot: Mapping[str, int]) -> None:
        """Resume at a checkpoint's offsets: now for owned partitions, else when they are assigned."""
        for tp, offset in self._book.seek(parse_snapshot(snapshot)).items():
            self._consumer.seek(tp, offset)

    def rewind(self, snapshot: Mapping[str, int]) -> dict[str, int]:
        """Replay every owned partition: from ``snapshot``'s offset where it has one, else from the
        last commit (or the first offset yielded). For a daemon that dropped its in-memory state
        after a failure, exactly as after a rebalance; returns where each partition restarts."""
        wanted = parse_snapshot(snapshot)
        with self._book.lock:
            targets = {
                tp: wanted.get(tp, self._book.restart.get(tp))
                for tp in self._book.owned
                if tp in wanted or tp in self._book.restart
            }
        seeks = {tp: off for tp, off in targets.items() if off is not None}
        for tp, off in self._book.seek(seeks).items():
            self._consumer.seek(tp, off)
        return {snapshot_key(tp): off for tp, off in sorted(seeks.items())}

    def assignment(self) -> list[str]:
        return sorted(snapshot_key(tp) for tp in self._book.owned)

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has, as the broker says (not as the config assumes)."""
        parts = self._consumer.partitions_for_topic(topic)
        if not parts:
            raise KafkaError(f"topic {topic!r} has no partitions the broker knows of; does it exist?")
        return len(parts)

    def read_to_end(self, key: str, now: float, max_age_s: float = 0.5) -> bool:
        """Has this member read partition ``key`` ("topic:partition") to its end?

        The lag behind the answer is at most ``max_age_s`` old (one broker round trip per period,
        not per partition); a broker that does not answer means a backlog, i.e. not at the end.
        """
        if now - self._end_lag_at > max_age_s:
            try:
                self._end_lag = self.lag()
            except Exception:
                self._end_lag = {}
            self._end_lag_at = now
        return self._end_lag.get(key, 1) == 0

    def lag(self) -> dict[str, int]:
        """Per owned partition: end offset - next offset to yield (a metric; one broker round trip)."""
        owned = sorted(self._book.owned)
        if not owned:
            return {}
        ends = self._consumer.end_offsets(owned, timeout_ms=self.cfg.request_timeout_ms)
        out: dict[str, int] = {}
        for tp in owned:
            pos = self._book.positions.get(tp)
            if pos is None:
                pos = self._consumer.position(tp, timeout_ms=self.cfg.request_timeout_ms)
            if pos is not None and tp in ends:
                out[snapshot_key(tp)] = max(0, ends[tp] - pos)
        return out

    def group_lag(self) -> dict[str, int]:
        """Per partition of every subscribed topic, what the *group* has not read: this member's own
        partitions by its position (as :meth:`lag`), every other one by the group's last commit (its
        first offset where nothing was committed). A round trip per partition: for exit decisions,
        not for every batch. Raises ``KafkaError`` when the broker does not answer."""
        c, timeout = self._consumer, self.cfg.request_timeout_ms
        mine = self.lag()
        out: dict[str, int] = {}
        others: list[TopicPartition] = []
        for topic in self._topics:
            parts = c.partitions_for_topic(topic)
            if not parts:  # no metadata yet: nothing is known to be read
                out[f"{topic}:?"] = 1
            for tp in (TopicPartition(topic, p) for p in sorted(parts or ())):
                if tp in self._book.owned:
                    out[snapshot_key(tp)] = mine.get(snapshot_key(tp), 1)  # no position yet: unread
                else:
                    others.append(tp)
        if others:
            ends, firsts = c.end_offsets(others, timeout), c.beginning_offsets(others, timeout)
            for tp in others:
                at = c.committed(tp, timeout_ms=timeout)
                out[snapshot_key(tp)] = max(0, ends[tp] - (firsts[tp] if at is None else at))
        return out

    def close(self) -> None:
        """Leave the group; nothing is committed. A dynamic member's partitions move at once; a static
        one (``group_instance_id``) keeps them until it rejoins or the broker expires it."""
        self._stop.set()
        self._consumer.close(autocommit=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def caught_up(source: GroupSource) -> bool:
    """The group has read every partition of the source's topics to its end: this member its own,
    the other members theirs, as far as their commits say (:meth:`GroupSource.group_lag`).

    A backlog, a rebalance still pending, or a partition held by a member that was killed (the broker
    expires it only after ``session.timeout.ms``, 45 s) is not idleness: a daemon told to exit when
    idle (tests, backfills) must not stop then and leave that partition unread."""
    try:
        lag = source.group_lag()
    except Exception:  # the broker did not answer: not known to be caught up
        return False
    return bool(lag) and all(v == 0 for v in lag.values())
