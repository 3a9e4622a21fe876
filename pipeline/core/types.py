"""The small protocols every stage implements; everything else composes on top of them.

- a :class:`Source` yields batches of :class:`RawEvent` and can ``snapshot()`` where to resume
  (the *next* event, not the last one read);
- a stage is a callable from a batch to a batch;
- a :class:`Learner` ``learn``s a block of labelled examples and ``predict``s click probabilities;
- a :class:`ModelStore` ``publish``es a model version and ``resolve``s an alias to one;
- a :class:`Clock` tells event time (simulated in replays, wall time in production).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Clock",
    "EventKind",
    "Learner",
    "ManualClock",
    "ModelStore",
    "RawEvent",
    "Source",
    "WallClock",
]

EventKind = Literal["impression", "click", "conversion"]


@dataclass(slots=True)
class RawEvent:
    """One undecoded event as a source delivered it.

    ``value`` is the wire bytes (Kafka, files) or an already-built mapping (in-process simulator);
    validation accepts both. ``source``/``partition``/``offset`` say where it came from, for dead
    letters and lineage. ``entered_ms`` is when the event entered the system, what clock skew and
    age are judged against: the Kafka record's timestamp in the daemons, the replay's reference
    time (:mod:`pipeline.core.entered_time`) in a replay; ``None`` falls back to the validator's clock.
    """

    kind: EventKind
    value: bytes | Mapping[str, Any]
    source: str
    partition: int = 0
    offset: int = 0
    key: bytes | None = None
    entered_ms: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Clock(Protocol):
    """Event-time clock in epoch milliseconds."""

    def now_ms(self) -> int: ...


class WallClock:
    """The real clock (production)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock the caller moves: replays set it to the stream position, tests set it by hand."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def set(self, ms: int) -> None:
        self._now = ms

    def advance_to(self, ms: int) -> None:
        """Move forward to ``ms``; never backwards (event time is monotone for the clock)."""
        if ms > self._now:
            self._now = ms


@runtime_checkable
class Source(Protocol):
    """Yields batches of raw events; ``snapshot()`` is where a restart resumes."""

    @property
    def clock(self) -> Clock: ...

    def batches(self) -> Iterator[list[RawEvent]]: ...

    def snapshot(self) -> dict[str, Any]: ...


@runtime_checkable
class Learner(Protocol):
    """A CTR model that learns from labelled examples and predicts click probabilities."""

    def learn(self, examples: Sequence[Any]) -> float: ...

    def predict(self, examples: Sequence[Any]) -> np.ndarray: ...


@runtime_checkable
class ModelStore(Protocol):
    """Where accepted model versions live and aliases point."""

    def publish(self, model: Any, lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> str: ...

    def resolve(self, alias: str) -> str | None: ...

    def load(self, version: str) -> Any: ...
