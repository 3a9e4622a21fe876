"""Labelled examples on the examples topic: several per Kafka record, as JSON lines.

kafka-python spends tens of microseconds on every record it produces, as much as the joiner's budget
for a whole event: one record per example bounded the joiner at ~0.3 of a raw consumer's rate before
it joined anything (``kafka_python_bound`` in ``benchmarks/ingest.py``). So the joiner writes a
partition task's examples as JSON lines, up to ``kafka.examples_per_record`` lines and
:data:`MAX_RECORD_BYTES` per record. Kafka's own ``kafka-console-consumer`` still shows one readable
example per line, and a record of one line (what earlier versions wrote) reads the same way. JSON
never writes a raw newline (strings escape it), so splitting on ``\\n`` gives back each example's
bytes exactly.

An example's **position** is its record's offset and its line in the record. The trainer keeps one
integer per partition, ``offset * STRIDE + line`` (:func:`position`), so that ordering and "skip what
came before" stay integer comparisons; Kafka itself gets the record offsets (:func:`kafka_offsets`).

>>> [len(r.split(b"\\n")) for r in records([b'{"a":1}'] * 5, per_record=2)]
[2, 2, 1]
>>> position(7, 0) < position(7, 1) < position(8, 0), divmod(position(7, 3), STRIDE)
(True, (7, 3))
>>> kafka_offsets({"ex:0": position(7, 3), "ex:1": position(9, 0)})
{'ex:0': 7, 'ex:1': 9}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

__all__ = [
    "MAX_RECORD_BYTES",
    "STRIDE",
    "from_offsets",
    "kafka_offsets",
    "lineage",
    "lines",
    "position",
    "records",
]

STRIDE = 1 << 16  # lines per record at most (kafka.examples_per_record is capped below it)
MAX_RECORD_BYTES = 512 * 1024  # half of Kafka's default 1 MB record limit


def records(examples: Sequence[bytes], per_record: int) -> Iterator[bytes]:
    """``examples`` (each one line of JSON) as record values of at most ``per_record`` lines and
    about :data:`MAX_RECORD_BYTES` (a record holds at least one example, whatever its size)."""
    start = size = 0
    for i, ex in enumerate(examples):
        if i > start and (i - start >= per_record or size + len(ex) > MAX_RECORD_BYTES):
            yield b"\n".join(examples[start:i])
            start, size = i, 0
        size += len(ex) + 1
    if start < len(examples):
        yield b"\n".join(examples[start:])


def lines(value: bytes) -> list[bytes]:
    """The examples of one record value, each as the bytes the joiner wrote."""
    return value.split(b"\n")


def position(offset: int, line: int) -> int:
    """The trainer's position of line ``line`` of the record at ``offset``."""
    return offset * STRIDE + line


def kafka_offsets(positions: Mapping[str, int]) -> dict[str, int]:
    """Per partition, the offset of the record holding the position (what Kafka commits and seeks)."""
    return {tp: pos // STRIDE for tp, pos in positions.items()}


def from_offsets(offsets: Mapping[str, int]) -> dict[str, int]:
    """Per partition, the position of the first line of the record at the offset."""
    return {tp: position(off, 0) for tp, off in offsets.items()}


def lineage(start: Mapping[str, int], end: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """A block's position for its version's lineage: per partition, the offset of the record holding
    the next example to read, and the lines of that record read already (partly read records only).

    >>> lineage({"ex:0": position(7, 0)}, {"ex:0": position(9, 4)})
    {'kafka_offsets_from': {'ex:0': 7}, 'kafka_offsets_to': {'ex:0': 9}, 'kafka_lines_from': {}, \
'kafka_lines_to': {'ex:0': 4}}
    """
    return {
        "kafka_offsets_from": kafka_offsets(start),
        "kafka_offsets_to": kafka_offsets(end),
        "kafka_lines_from": {tp: pos % STRIDE for tp, pos in start.items() if pos % STRIDE},
        "kafka_lines_to": {tp: pos % STRIDE for tp, pos in end.items() if pos % STRIDE},
    }
