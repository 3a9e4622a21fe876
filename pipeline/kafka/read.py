"""Every record of a topic, read up to the end offsets taken first (tests, benchmarks, checks).

A plain assigned consumer (no group, nothing committed): what a check that must see the whole
topic needs, where a group member could be cut short by a slow broker or a rebalance.
"""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition

__all__ = ["read_to_end"]


def read_to_end(bootstrap: str, topic: str, timeout_s: float = 300.0) -> list[Any]:
    """The ``ConsumerRecord`` s of ``topic`` from the beginning to the end offsets as this call
    starts, partition by partition in offset order; TimeoutError after ``timeout_s``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out: dict[int, list[Any]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to {end} in {timeout_s:.0f} s")
            for tp, records in consumer.poll(timeout_ms=1_000).items():
                out[tp.partition] += [r for r in records if r.offset < end[tp]]
        return [r for p in sorted(out) for r in out[p]]
    finally:
        consumer.close()
