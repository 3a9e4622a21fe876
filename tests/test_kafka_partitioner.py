"""KeyHashPartitioner: the producer's partitioner with cached key hashes picks the default partition."""

from __future__ import annotations

import pytest
from kafka.cluster import ClusterMetadata
from kafka.partitioner import DefaultPartitioner

from pipeline.kafka.client import KeyHashPartitioner


class _Cluster(ClusterMetadata):
    """Metadata of one topic "t" with partitions 0..4."""

    def topics(self, exclude_internal_topics: bool = True) -> set[str]:
        return {"t"}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return {0, 1, 2, 3, 4} if topic == "t" else None

    def available_partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions_for_topic(topic)


def test_key_hash_partitioner_picks_exactly_the_default_partition() -> None:
    cluster, cached, default = _Cluster(), KeyHashPartitioner(max_keys=50), DefaultPartitioner()
    keys = [f"user-{i}".encode() for i in range(200)] * 2  # repeats hit the cache; 200 > max_keys
    got = [cached.partition("t", k, k, b"v", b"v", cluster) for k in keys]
    assert got == [default.partition("t", k, k, b"v", b"v", cluster) for k in keys]
    assert len(set(got)) == 5 and len(cached._hash._hashes) <= 50


def test_key_hash_partitioner_refuses_an_unknown_topic() -> None:
    with pytest.raises(ValueError, match="not found"):
        KeyHashPartitioner().partition("missing", b"k", b"k", b"v", b"v", _Cluster())
