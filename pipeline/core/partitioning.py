"""Which partition a user's events live on: the one rule the producers, joiner and serving share.

Impressions and clicks are keyed by the raw user id, and Kafka's default partitioner (murmur2 of
the key, as the Java client) puts a key on ``murmur2(key) % partitions``; the partition count is
the topic's own, read from the broker, never assumed from the config.

>>> partition_of("user-1", 6) == partition_of("user-1", 6) and 0 <= partition_of("user-1", 6) < 6
True
>>> partition_of("anyone", 1)
0
"""

from __future__ import annotations

from kafka.partitioner.default import murmur2

__all__ = ["KeyHashes", "partition_of"]


class KeyHashes:
    """murmur2 of keys, cached: kafka-python computes it in pure Python (~8 µs), and keys repeat."""

    def __init__(self, max_keys: int = 1_000_000) -> None:
        self.max_keys = max_keys
        self._hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes) -> int:
        h = self._hashes.get(key)
        if h is None:
            if len(self._hashes) >= self.max_keys:  # bound memory on high-cardinality keys
                self._hashes.clear()
            h = self._hashes[bytes(key)] = murmur2(key) & 0x7FFFFFFF
        return h


_HASHES = KeyHashes()


def partition_of(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` among ``partitions``."""
    return _HASHES(key.encode("utf-8", "surrogatepass")) % partitions
