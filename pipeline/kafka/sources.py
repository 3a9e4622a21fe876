"""The daemons' Kafka sources: raw events for the joiner, labelled examples for the trainer.

Both are consumer-group members whose snapshots, commits, seeks and rebalances are
:class:`~pipeline.kafka.io.GroupSource`'s (see :mod:`pipeline.kafka.io` for the exactly-once loop).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from kafka.consumer.fetcher import ConsumerRecord

from pipeline.core.config import KafkaConfig
from pipeline.core.events import DeadLetter, LabelledExample
from pipeline.core.types import Clock, EventKind, RawEvent, WallClock
from pipeline.kafka import example_records
from pipeline.kafka.example_records import position
from pipeline.kafka.io import GroupSource

__all__ = ["ExampleBatch", "KafkaEventSource", "KafkaExampleSource", "decode_example"]

_RAW_PREFIX = 1_024  # bytes of a malformed example kept in its dead letter (as pipeline.core.validation does)


class KafkaEventSource(GroupSource):
    """Raw impressions/clicks from ``topics`` (``{topic: kind}``) as :class:`RawEvent` batches.

    ``value`` is the message bytes as they are (a tombstone becomes ``b""``): validation happens
    later, so bad content never raises here. ``batches()`` yields one list per poll, at most
    ``batch_size`` events (default ``cfg.max_poll_records``), and an empty list every
    ``cfg.poll_timeout_ms`` when idle, so a daemon loop can do time-based work; it returns after
    ``stop()``. See the module docstring for commits, rebalances and seeks.
    """

    def __init__(
        self,
        cfg: KafkaConfig,
        topics: Mapping[str, EventKind],
        group_id: str,
        batch_size: int | None = None,
        clock: Clock | None = None,
        on_revoke: Callable[[], None] | None = None,
        read_committed: bool = False,
    ) -> None:
        self.topics = dict(topics)
        super().__init__(
            cfg, self.topics, group_id, batch_size, clock or WallClock(), on_revoke, read_committed
        )

    def batches(self) -> Iterator[list[RawEvent]]:
        kinds = self.topics
        for records in self._polls():
            yield [  # the record's timestamp is when the event entered the system (validation's reference)
                RawEvent(
                    kinds[r.topic],
                    r.value or b"",
                    r.topic,
                    r.partition,
                    r.offset,
                    r.key,
                    r.timestamp if r.timestamp is not None and r.timestamp >= 0 else None,
                )
                for r in records
            ]


@dataclass
class ExampleBatch:
    """One poll of the examples topic: decoded examples and the lines that were not examples."""

    examples: list[LabelledExample] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    # per example: "topic:partition", its position and the position after it (example_records)
    where: list[tuple[str, int, int]] = field(default_factory=list)

    def add(self, r: ConsumerRecord) -> None:
        """Every line of record ``r``: an example with its position, or a dead letter."""
        tp = f"{r.topic}:{r.partition}"
        lines = example_records.lines(r.value or b"")
        for i, line in enumerate(lines):
            item = decode_example(r, line, i if len(lines) > 1 else None)
            if isinstance(item, LabelledExample):
                self.examples.append(item)
                after = (r.offset, i + 1) if i + 1 < len(lines) else (r.offset + 1, 0)
                self.where.append((tp, position(r.offset, i), position(*after)))
            else:
                self.dead.append(item)


def decode_example(
    r: ConsumerRecord, line: bytes | None = None, index: int | None = None
) -> LabelledExample | DeadLetter:
    """A :class:`LabelledExample` of ``line`` (default: the whole value) of record ``r``, or a dead
    letter saying why it is not one (and, given ``index``, which line of the record it was)."""
    raw = (r.value or b"") if line is None else line
    reason, detail = "", ""
    try:
        ex = LabelledExample.from_json(raw)
        imp = ex.impression
        if ex.label not in (0, 1) or isinstance(ex.label, bool):
            reason, detail = "bad_value", f"label {ex.label!r} is not 0 or 1"
        elif not all(type(v) is int for v in (imp.ts, ex.label_ts)):
            reason, detail = "bad_type", "ts and label_ts must be integers (epoch ms)"
        elif not (isinstance(imp.impression_id, str) and isinstance(imp.features, dict)):
            reason, detail = "bad_type", "impression_id must be a string and features an object"
        else:
            return ex
    except UnicodeDecodeError as exc:
        reason, detail = "bad_encoding", str(exc)
    except json.JSONDecodeError as exc:
        reason, detail = "bad_json", str(exc)
    except KeyError as exc:
        reason, detail = "missing_field", f"field {exc} is missing"
    except (TypeError, AttributeError, ValueError, RecursionError) as exc:
        reason, detail = "bad_type", f"{type(exc).__name__}: {exc}"
    if index is not None:
        detail = f"line {index} of the record: {detail}"
    return DeadLetter(reason, detail[:200], "example", raw[:_RAW_PREFIX], r.topic, r.partition, r.offset)


class KafkaExampleSource(GroupSource):
    """Labelled examples from ``topic`` (default ``cfg.examples_topic``), for the trainer.

    ``batches()`` yields an :class:`ExampleBatch` per poll (empty when idle): ``examples`` decoded
    from every record's JSON lines (:mod:`pipeline.kafka.example_records`), each with its position,
    and ``dead``, a :class:`DeadLetter` (reason ``bad_json``, ``missing_field``, ...) for each
    line that is not a valid example, to be sent to the dead-letter topic.
    Snapshots, commits, seeks and rebalances behave as in :class:`KafkaEventSource`.
    """

    def __init__(
        self,
        cfg: KafkaConfig,
        group_id: str,
        topic: str | None = None,
        batch_size: int | None = None,
        clock: Clock | None = None,
        on_revoke: Callable[[], None] | None = None,
    ) -> None:
        self.topic = topic or cfg.examples_topic
        super().__init__(cfg, [self.topic], group_id, batch_size, clock or WallClock(), on_revoke)

    def batches(self) -> Iterator[ExampleBatch]:
        for records in self._polls():
            batch = ExampleBatch()
            for r in records:
                batch.add(r)
            yield batch
