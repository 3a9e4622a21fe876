"""A compacted Kafka changelog topic, written in transactions: where the joiner's tasks keep their state.

Kafka Streams' way of keeping a task's state off the machine it runs on, with kafka-python's
transactions (KIP-98) and group-fenced offset commits (KIP-447); ``docs/state-engines.md`` says why
the joiner does not use a stream engine's state stores (Quix Streams, PyFlink) instead:

- **Write** (:meth:`Changelog.commit`): one transaction holds the changed records of every task
  (task ``p`` writes partition ``p``) *and* the consumer group's input offsets. Either all of it
  is visible or none: a state record never describes input whose offsets were not committed.
  A process that lost its partitions in a rebalance is fenced by its stale group generation, so
  its late transaction aborts instead of mixing into the next owner's state.
- **Read** (:meth:`Changelog.read`): the latest committed value of every key of one partition
  (``read_committed``: open and aborted transactions are invisible), which is what log compaction
  keeps. The group consumer of the next owner reads its committed offsets with ``require_stable``
  (kafka-python does when ``isolation_level="read_committed"``), so it waits for a transaction
  still open on those partitions to end before it restores.

A value larger than :data:`CHUNK` (a very active user's record) is written as several records
(``key``: a marker and the count, then ``key + b"\\0" + n``), reassembled by :meth:`Changelog.read`:
Kafka refuses records over ``max.message.bytes`` (1 MB by default). Keys never hold a NUL.

The transactional id is stable per state folder and slot and unique among live processes
(``<group>-joiner-<host>-<folder hash>-<slot>``, see :mod:`pipeline.daemons.joiner_state`; two
processes with one id would fence each other's transactions): a process restarted after ``kill -9`` aborts its
predecessor's open transaction at once; a machine lost for good holds its partitions' next owner
back at most ``transaction_timeout_ms``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError

from pipeline.core.config import KafkaConfig
from pipeline.kafka.client import connect, ensure_topics

__all__ = ["COMPACTED", "Changelog", "Records"]

log = logging.getLogger(__name__)
Records = list[tuple[bytes, bytes | None]]  # (key, value or None for a tombstone)
CHUNK = 500_000  # bytes: the most one record carries (Kafka's default limit is 1 MB a record)
_CHUNKED = b"\0"  # first byte of a chunked value's first record (a JSON value never starts so)
# Compacted; small segments so that compaction (which never touches the active segment) keeps a
# restore close to the state's size; tombstones kept a day (a restore seeing a key's deletion).
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": str(64 << 20),
    "min.cleanable.dirty.ratio": "0.5",
    "delete.retention.ms": str(24 * 3_600_000),
}


class Changelog:
    """``topic``'s partitions, one per task; see the module docstring."""

    def __init__(self, cfg: KafkaConfig, topic: str, partitions: int, transactional_id: str) -> None:
        self.cfg, self.topic, self.transactional_id = cfg, topic, transactional_id
        ensure_topics(cfg, [topic], partitions, configs=COMPACTED)
        self._producer: KafkaProducer | None = None
        self._chunks: dict[tuple[int, bytes], int] = {}  # (partition, key) -> records of its value

    def partition_count(self) -> int:
        consumer = self._consumer()
        try:
            return len(consumer.partitions_for_topic(self.topic) or ())
        finally:
            consumer.close()

    # -- writing ---------------------------------------------------------------------------------
    def _transactional(self) -> KafkaProducer:
        if self._producer is None:
            producer = connect(
                KafkaProducer,
                self.cfg,
                f"changelog {self.topic!r}",
                transactional_id=self.transactional_id,
                enable_idempotence=True,
                acks="all",
                linger_ms=self.cfg.linger_ms,
                batch_size=self.cfg.producer_batch_bytes,
                compression_type=self.cfg.compression_type or None,
                transaction_timeout_ms=self.cfg.transaction_timeout_ms,
                delivery_timeout_ms=self.cfg.delivery_timeout_ms,
                max_block_ms=self.cfg.request_timeout_ms,
            )
            try:  # aborts whatever a predecessor with this id left open
                producer.init_transactions()
            except BaseException:
                producer.close(timeout=0)
                raise
            self._producer = producer
        return self._producer

    def commit(self, records: Mapping[int, Records], offsets: Mapping[Any, Any], group_metadata: Any) -> int:
        """Write ``records`` (``{partition: records}``) and commit the group's ``offsets`` in one
        transaction; returns how many records. Raises (a ``KafkaError``) if the transaction did not
        commit: then none of it is visible, and the next call starts a fresh producer."""
        producer = self._transactional()
        n = sum(len(r) for r in records.values())
        try:
            producer.begin_transaction()
            for partition, recs in records.items():
                for key, value in self._chunked(partition, recs):
                    producer.send(self.topic, key=key, value=value, partition=partition)
            producer.flush(timeout=self.cfg.transaction_timeout_ms / 1000)  # raises on a timeout
            if offsets:
                producer.send_offsets_to_transaction(dict(offsets), group_metadata)
            producer.commit_transaction()
        except BaseException:
            self.reset()
            raise
        return n

    def _chunked(self, partition: int, records: Records) -> Records:
        """``records`` with every value over :data:`CHUNK` split, and the chunks a value had before
        and no longer needs deleted."""
        out: Records = []
        for key, value in records:
            had = self._chunks.get((partition, key), 1)
            n = 1 if value is None or len(value) <= CHUNK else -(-len(value) // CHUNK)
            if n == 1:
                out.append((key, value))
            else:
                parts = [value[i * CHUNK : (i + 1) * CHUNK] for i in range(n)]  # type: ignore[index]
                out.append((key, _CHUNKED + n.to_bytes(4, "big") + parts[0]))
                out += [(key + b"\0" + str(i).encode(), parts[i]) for i in range(1, n)]
            out += [(key + b"\0" + str(i).encode(), None) for i in range(n, had)]
            if n > 1:
                self._chunks[(partition, key)] = n
            else:
                self._chunks.pop((partition, key), None)
        return out

    def reset(self) -> None:
        """Drop the producer (after a failure); the next commit's ``init_transactions`` aborts its
        open transaction, if the broker has not already."""
        if self._producer is not None:
            try:
                self._producer.close(timeout=0)
            except Exception:  # already broken: nothing more to release
                log.debug("changelog: closing a failed producer", exc_info=True)
            self._producer = None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None

    # -- reading ---------------------------------------------------------------------------------
    def _consumer(self) -> KafkaConsumer:
        return connect(
            KafkaConsumer,
            self.cfg,
            f"changelog {self.topic!r}",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            check_crcs=self.cfg.check_crcs,
            max_poll_records=max(self.cfg.max_poll_records, 10_000),
            max_partition_fetch_bytes=16 << 20,  # a restore reads one partition from its start
            fetch_max_bytes=64 << 20,
        )

    def read(self, partition: int, timeout_s: float = 600.0) -> dict[bytes, bytes]:
        """The latest committed value of every key of ``partition`` (tombstoned keys left out)."""
        consumer = self._consumer()
        tp = TopicPartition(self.topic, partition)
        try:
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            end = consumer.end_offsets([tp], timeout_ms=self.cfg.request_timeout_ms)[tp]  # stable offset
            latest: dict[bytes, bytes] = {}
            deadline = time.monotonic() + timeout_s
            while consumer.position(tp, timeout_ms=self.cfg.request_timeout_ms) < end:
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError(
                        f"changelog {self.topic}:{partition}: not read to offset {end} "
                        f"within {timeout_s:.0f} s"
                    )
                for recs in consumer.poll(timeout_ms=500).values():
                    for r in recs:
                        if r.value is None:
                            latest.pop(r.key, None)
                        else:
                            latest[r.key] = r.value
            return self._joined(partition, latest)
        finally:
            consumer.close(autocommit=False)

    def _joined(self, partition: int, latest: dict[bytes, bytes]) -> dict[bytes, bytes]:
        """``latest`` with every chunked value put back together (and its chunk count remembered)."""
        self._chunks = {pk: n for pk, n in self._chunks.items() if pk[0] != partition}
        for key in [k for k, v in latest.items() if v[:1] == _CHUNKED]:
            first = latest[key]
            n = int.from_bytes(first[1:5], "big")
            rest = [latest.pop(key + b"\0" + str(i).encode()) for i in range(1, n)]
            latest[key] = first[5:] + b"".join(rest)
            self._chunks[(partition, key)] = n
        return latest
