"""What every file or seeded source shares: batching, the event-time clock, snapshots, reading again.

A subclass only reads its events in order (``_read``: each event, its time and the position after
it); :class:`_BatchingSource` cuts them into batches, moves the clock and keeps the snapshot a
resume starts from (:mod:`pipeline.sources.streams` says what every source promises).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from pipeline.core.types import ManualClock, RawEvent
from pipeline.sources.files import DAMAGED, UnreadableLog, what_to_do

__all__ = ["KAFKA_KEY"]

# A timestamp this far past its batch's median does not move the clock, so one corrupt event (say
# in microseconds) cannot throw event time years ahead; a day still spans any real batch.
_MAX_CLOCK_JUMP_MS = 86_400_000
_Read = Iterator[tuple[RawEvent, int | None, Any]]  # event, its ts, position after it (see _position)


class _BatchingSource:
    """Batching, the event-time clock and snapshots; subclasses only read events in order."""

    name = ""

    def __init__(self, batch_size: int, resume: dict[str, Any] | None) -> None:
        if batch_size < 1:
            raise ValueError(f"{type(self).__name__}: batch_size must be >= 1, got {batch_size!r}")
        if resume is not None and resume.get("source") != self.name:
            raise ValueError(f"{type(self).__name__}: snapshot is from source {resume.get('source')!r}")
        self.batch_size = batch_size
        self.clock = ManualClock(int(resume.get("clock_ms", 0)) if resume else 0)
        self._pos: dict[str, Any] = {}
        self._origin: _BatchingSource | None = None  # this source as it was before its first batch

    def read_again(self) -> Iterator[list[RawEvent]]:
        """The batches :meth:`batches` delivered and will deliver, read afresh from where it began
        (a replay reading its input ahead, :mod:`pipeline.join.lookahead`), up to a damaged part if
        any; this source's own reading and clock are untouched."""
        if self._origin is None:
            raise RuntimeError(f"{type(self).__name__}.read_again: batches() has not started")
        again = copy.deepcopy(self._origin)

        def batches() -> Iterator[list[RawEvent]]:
            try:
                yield from again.batches()
            except UnreadableLog:  # damaged there: the replay reads up to it too, then stops with it
                return

        return batches()

    def snapshot(self) -> dict[str, Any]:
        """Where a restart resumes: the next event not yet delivered, and the clock so far."""
        return {"source": self.name, **self._pos, "clock_ms": self.clock.now_ms()}

    def batches(self) -> Iterator[list[RawEvent]]:
        """Batches of at most ``batch_size`` events, continuing from the last one delivered."""
        if self._origin is None:
            self._origin = copy.deepcopy(self)  # a plain object here: paths, seeds, positions
        batch: list[RawEvent] = []
        times: list[int] = []
        pos: Any = None
        delivered = 0
        damaged: Exception | None = None
        try:
            for event, ts, pos in self._read():
                batch.append(event)
                if ts is not None:
                    times.append(ts)
                if len(batch) >= self.batch_size:
                    self._deliver(times, pos)
                    delivered += len(batch)
                    yield batch
                    batch, times = [], []
        except DAMAGED as exc:  # what was read before it is delivered, then the error
            damaged = exc
        if batch:
            self._deliver(times, pos)
            delivered += len(batch)
            yield batch
        if damaged is not None:
            raise UnreadableLog(
                f"the {self.name} log cannot be read on after {delivered:,} events "
                f"({type(damaged).__name__}: {damaged}): {what_to_do(damaged)}"
            ) from damaged

    def _deliver(self, times: list[int], pos: Any) -> None:
        self._pos = self._position(pos)
        if times:
            median = sorted(times)[len(times) // 2]
            self.clock.advance_to(max(t for t in times if t <= median + _MAX_CLOCK_JUMP_MS))

    def _read(self) -> _Read:
        raise NotImplementedError

    def _position(self, pos: Any) -> dict[str, Any]:
        """Snapshot fields from the cheap position ``_read`` yields (built once per batch)."""
        return {"offset": pos}


def _ts_of(value: Any) -> int | None:
    ts = value.get("ts") if isinstance(value, dict) else None
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None


KAFKA_KEY = "kafka_key"  # a JSONL line's optional record key, when it was produced keyed otherwise


def _key_of(value: Any, pop: bool = False) -> bytes | None:
    """The record key: the line's ``kafka_key`` (taken out of the event with ``pop``), else its user."""
    if not isinstance(value, dict):
        return None
    key = value.pop(KAFKA_KEY, None) if pop else value.get(KAFKA_KEY)
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    user = value.get("user_id")
    return user.encode("utf-8", "surrogatepass") if isinstance(user, str) else None  # keyed by user
