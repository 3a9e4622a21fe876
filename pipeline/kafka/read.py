"""Every record of a topic, read up to the end offsets taken first (tests, benchmarks, checks).

A plain assigned consumer (no group, nothing committed): what a check that must see the whole
topic needs, where a group member could be cut short by a slow broker or a rebalance.
"""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from pipeline.kafka.example_records import lines

__all__ = ["ExampleCounter", "examples_to_end", "read_to_end"]


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


def examples_to_end(bootstrap: str, topic: str, timeout_s: float = 300.0) -> list[bytes]:
    """Every example of an examples topic (each line of every record, as the joiner wrote it), read
    like :func:`read_to_end`."""
    return [line for r in read_to_end(bootstrap, topic, timeout_s) for line in lines(r.value or b"")]


class ExampleCounter:
    """How many examples an examples topic holds so far, read incrementally (tests, benchmarks):
    one assigned consumer from the beginning, every line of every new record counted."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.topic, self.count = topic, 0

    def __call__(self) -> int:
        """The count after reading what arrived since the last call (0 while the topic is missing)."""
        self.new_examples()
        return self.count

    def new_examples(self) -> list[bytes]:
        """The examples (JSON lines) that arrived since the last call, counted (none while the
        topic is missing)."""
        if not self.consumer.assignment():
            parts = self.consumer.partitions_for_topic(self.topic)
            if not parts:
                return []
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            self.consumer.assign(tps)
            self.consumer.seek_to_beginning(*tps)
        polled = self.consumer.poll(timeout_ms=200, max_records=100_000).values()
        new = [line for records in polled for r in records for line in lines(r.value or b"")]
        self.count += len(new)
        return new

    def close(self) -> None:
        self.consumer.close()
