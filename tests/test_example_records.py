"""Examples several per Kafka record (JSON lines): encoding, positions, and the trainer's reading."""

from __future__ import annotations

from kafka.consumer.fetcher import ConsumerRecord

from pipeline.core.events import Impression, LabelledExample
from pipeline.kafka import example_records
from pipeline.kafka.example_records import MAX_RECORD_BYTES, STRIDE, kafka_offsets, lineage, position
from pipeline.kafka.sources import ExampleBatch


def examples(n: int, note: str = "") -> list[LabelledExample]:
    return [
        LabelledExample(Impression(f"imp-{i}", 1_700_000_000_000 + i, "u_1", "ad", {"q": note}), i % 2, 1)
        for i in range(n)
    ]


def record(value: bytes, offset: int, partition: int = 0) -> ConsumerRecord:
    return ConsumerRecord("ex", partition, 0, offset, 0, 0, None, value, [], None, 0, 0, 0)


def test_lines_give_back_each_examples_bytes_exactly_even_with_newlines_inside() -> None:
    values = [ex.to_json() for ex in examples(7, note="two\nlines \u2028 and \\n")]
    out = list(example_records.records(values, per_record=3))
    assert [len(example_records.lines(r)) for r in out] == [3, 3, 1]
    assert [line for r in out for line in example_records.lines(r)] == values


def test_a_record_stays_under_the_byte_cap_but_always_holds_one_example() -> None:
    big = b"x" * (MAX_RECORD_BYTES // 3 + 10)
    out = list(example_records.records([big] * 7, per_record=500))
    assert [len(example_records.lines(r)) for r in out] == [2, 2, 2, 1]
    assert all(len(r) <= MAX_RECORD_BYTES for r in out)
    huge = b"y" * (2 * MAX_RECORD_BYTES)
    assert list(example_records.records([huge, b"z"], per_record=500)) == [huge, b"z"]


def test_positions_order_lines_within_records_and_map_back_to_kafka_offsets() -> None:
    batch = ExampleBatch()
    values = [ex.to_json() for ex in examples(5)]
    batch.add(record(b"\n".join(values[:3]), offset=40))  # 3 examples in record 40
    batch.add(record(values[3], offset=41))  # an old one-example record
    batch.add(record(b"\n".join([values[4], b"{oops"]), offset=42))  # a bad line after a good one
    assert [ex.example_id for ex in batch.examples] == [f"imp-{i}" for i in range(5)]
    assert batch.where == [
        ("ex:0", position(40, 0), position(40, 1)),
        ("ex:0", position(40, 1), position(40, 2)),
        ("ex:0", position(40, 2), position(41, 0)),  # after a record's last line: the next record
        ("ex:0", position(41, 0), position(42, 0)),
        ("ex:0", position(42, 0), position(42, 1)),
    ]
    [dead] = batch.dead
    assert (dead.reason, dead.offset, dead.detail[:20]) == ("bad_json", 42, "line 1 of the record")
    # a block ending after line 2 of record 40 resumes in record 40 (Kafka), skipping 2 lines
    assert kafka_offsets({"ex:0": position(40, 2)}) == {"ex:0": 40}
    assert lineage({"ex:0": position(38, 0)}, {"ex:0": position(40, 2)}) == {
        "kafka_offsets_from": {"ex:0": 38},
        "kafka_offsets_to": {"ex:0": 40},
        "kafka_lines_from": {},
        "kafka_lines_to": {"ex:0": 2},
    }
    assert position(40, STRIDE - 1) < position(41, 0)
