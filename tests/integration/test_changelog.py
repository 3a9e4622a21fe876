"""The joiner's changelog topic on the real broker: transactions, chunked values, compaction's view."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaError

from pipeline.core.config import KafkaConfig
from pipeline.kafka.changelog import CHUNK, Changelog


@pytest.fixture
def changelog(kafka_bootstrap: str, kafka_topic: Callable[..., str]) -> Changelog:
    cfg = KafkaConfig(bootstrap_servers=kafka_bootstrap, connect_timeout_ms=5_000)
    return Changelog(cfg, kafka_topic(partitions=2, **{"cleanup.policy": "compact"}), 2, uuid.uuid4().hex)


def test_latest_committed_value_per_key_with_values_over_a_record(changelog: Changelog) -> None:
    big = b"[" + b"1," * (CHUNK + 100_000) + b"1]"  # 1.2 MB: three records
    changelog.commit({0: [(b"ua", b"1"), (b"ub", big)], 1: [(b"m", b"2")]}, {}, None)
    assert changelog.read(0) == {b"ua": b"1", b"ub": big}
    assert changelog.read(1) == {b"m": b"2"}
    changelog.commit({0: [(b"ua", None), (b"ub", b"[2]")]}, {}, None)  # deleted; shrunk to one record
    assert changelog.read(0) == {b"ub": b"[2]"}
    changelog.commit({0: [(b"ub", big)]}, {}, None)
    other = Changelog(changelog.cfg, changelog.topic, 2, uuid.uuid4().hex)  # another process
    assert other.read(0) == {b"ub": big}
    other.commit({0: [(b"ub", b"[3]")]}, {}, None)  # it knows the chunks to delete from its read
    assert changelog.read(0) == {b"ub": b"[3]"}
    other.close()
    changelog.close()


def test_a_member_fenced_by_a_rebalance_commits_nothing(
    changelog: Changelog, kafka_group: str, kafka_topic: Callable[..., str]
) -> None:
    """KIP-447: offsets sent with a stale group generation fail the transaction, records included."""
    changelog.commit({0: [(b"ua", b"1")]}, {}, None)
    source = kafka_topic(partitions=2)

    def member() -> KafkaConsumer:
        c = KafkaConsumer(bootstrap_servers=changelog.cfg.bootstrap_servers, group_id=kafka_group)
        c.subscribe([source])
        return c

    def joined(*consumers: KafkaConsumer) -> None:
        deadline = time.monotonic() + 60
        while not all(c.assignment() for c in consumers):
            assert time.monotonic() < deadline, "the group did not form"
            for c in consumers:
                c.poll(timeout_ms=200)

    first = member()
    joined(first)
    stale = first.group_metadata()  # before a second member makes a new generation
    second = member()
    try:
        joined(first, second)
        assert first.group_metadata().generation_id > stale.generation_id
        offsets = {TopicPartition(source, 0): OffsetAndMetadata(5, "", -1)}
        with pytest.raises(KafkaError):
            changelog.commit({0: [(b"ua", b"2"), (b"ub", b"2")]}, offsets, stale)
    finally:
        first.close()
        second.close()
    assert changelog.read(0) == {b"ua": b"1"}  # none of the fenced transaction is visible
    changelog.commit({0: [(b"ub", b"3")]}, {}, None)  # and the next one works (a fresh producer)
    assert changelog.read(0) == {b"ua": b"1", b"ub": b"3"}
    changelog.close()
