"""Offset bookkeeping of one consumer-group member: snapshots, commits, checkpoint seeks, rebalances.

A snapshot is ``{"topic:partition": next_offset}``: the offset of the next record, not of the last
one read. :class:`OffsetBook` is pure state (unit-tested without a broker); :class:`RebalanceListener`
feeds it kafka-python's rebalance callbacks, which run on the client's IO thread while the daemon's
thread is blocked in ``poll``: so they only record and seek, and never commit.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener

__all__ = ["OffsetBook", "RebalanceListener", "parse_snapshot", "snapshot_key"]


def snapshot_key(tp: TopicPartition) -> str:
    """``"topic:partition"``, the key of a partition in a snapshot."""
    return f"{tp.topic}:{tp.partition}"


def parse_snapshot(snapshot: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """``{"topic:partition": next_offset}`` to TopicPartitions (topic names cannot contain ``:``).

    >>> parse_snapshot({"clicks:2": 17})
    {TopicPartition(topic='clicks', partition=2): 17}
    """
    out: dict[TopicPartition, int] = {}
    for key, offset in snapshot.items():
        topic, sep, part = str(key).rpartition(":")
        if not (sep and topic and part.isdigit()) or not isinstance(offset, int) or offset < 0:
            raise ValueError(
                f"Kafka snapshot entry {key!r}: {offset!r} is not 'topic:partition': offset >= 0"
            )
        out[TopicPartition(topic, int(part))] = offset
    return out


class OffsetBook:
    """One consumer's offsets: what it yielded, where a rebalance rewinds to, checkpoint seeks.

    Pure bookkeeping (unit-tested without a broker); the rebalance methods run on kafka-python's IO
    thread while the daemon's thread is blocked in ``poll``, and the lock covers the rest.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.positions: dict[TopicPartition, int] = {}  # next offset after what was yielded
        self.restart: dict[TopicPartition, int] = {}  # last commit, else the first offset yielded
        self.seek_to: dict[TopicPartition, int] = {}  # checkpoint offsets, applied on assignment
        self.owned: set[TopicPartition] = set()
        self.disrupted = False  # a rebalance took uncommitted records; the daemon has not heard yet

    def yielded(self, tp: TopicPartition, first: int, last: int) -> None:
        with self.lock:
            self.restart.setdefault(tp, first)
            self.positions[tp] = last + 1

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        with self.lock:
            self.restart.update(offsets)

    def seek(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Record checkpoint offsets; returns those to seek now (the partitions already owned)."""
        with self.lock:
            now = {tp: off for tp, off in offsets.items() if tp in self.owned}
            self.seek_to.update({tp: off for tp, off in offsets.items() if tp not in self.owned})
            self.positions.update(now)
            self.restart.update(now)
            return now

    def assigned(self, new: set[TopicPartition]) -> dict[TopicPartition, int]:
        """The new assignment (after any revocation); returns the seeks to make for it."""
        with self.lock:
            old = self.owned
            if any(self.positions.get(tp, off) != off for tp, off in self.restart.items() if tp in old):
                self.disrupted = True  # uncommitted records were yielded: rewind what we keep
                seeks = {tp: self.restart[tp] for tp in old & new if tp in self.restart}
            else:
                seeks = {}
            for tp in old - new:
                self.positions.pop(tp, None)
                self.restart.pop(tp, None)
            seeks.update({tp: self.seek_to.pop(tp) for tp in new if tp in self.seek_to})
            self.positions.update(seeks)
            self.restart.update(seeks)
            self.owned = set(new)
            return seeks

    def take_disrupted(self) -> bool:
        with self.lock:
            hit, self.disrupted = self.disrupted, False
            return hit


class RebalanceListener(ConsumerRebalanceListener):
    """Hands each new assignment to the :class:`OffsetBook` and makes the seeks it asks for."""

    def __init__(self, consumer: KafkaConsumer, book: OffsetBook) -> None:
        self.consumer, self.book = consumer, book

    def on_partitions_revoked(self, revoked: Any) -> None:
        pass  # eager protocol: the full assignment comes next, and `assigned` compares against it

    def on_partitions_assigned(self, assigned: Any) -> None:
        # seek() only updates the subscription state: safe on the IO thread (no network round trip)
        for tp, offset in self.book.assigned(set(assigned)).items():
            self.consumer.seek(tp, offset)
