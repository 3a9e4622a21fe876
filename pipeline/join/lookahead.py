"""A replay's input read ahead: how soon each partition's streams get an event again.

The joiner daemon's consumer reads every topic partition on its own, so over a backlog a partition
task sees the head of each of its streams as soon as it exists, and a stream read to its end turns
idle (:meth:`~pipeline.join.partition_task.PartitionTask.run`). A replay offers the events in the
input's one order instead, so a stream with nothing buffered may be about to get an event or may
never get one again, and the task waits. Where a stream is sparse that wait is long: a partition
whose users never click held every impression (and, through the example merge, every other
partition's examples) until the input ended. A 1M-impression JSONL replay with one click-less
partition of three peaked at 3.6 GB against 1.8 GB, and with conversions joined
(``joiner.conversion_window_s``) on a log without any, nothing was joined before the end.

:class:`Lookahead` reads the input once more from its start and keeps, per stream of each partition,
the input positions of its events and the earliest event time from each on (a suffix minimum).
:meth:`Lookahead.bound` then tells a task, at any place of the input, the earliest time an event
still to come on an empty stream may have, or :data:`~pipeline.join.partition_task.NO_MORE` when
none comes: the task runs the other streams up to that time, exactly as it would with the event
buffered, so the examples, their order and the blocks are the ones the replay gives without it
(``tests/test_lookahead.py``). A time that validation will refuse only lowers the bound (the task
waits longer than it needs to, never less).

Reading ahead costs one more pass over the source and 16 bytes per event, so a replay does it
only when a task holds more than :data:`STALLED` events (``PartitionedJoin``, checked at its fixed
promise places), which no stream with regular clicks reaches.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from pipeline.core.fast_json import loads
from pipeline.core.types import RawEvent
from pipeline.join.partition_task import NO_MORE

__all__ = ["STALLED", "Lookahead"]

STALLED = 16_384  # events held by one partition task before a replay reads its input ahead

_LOWEST = -(2**62)  # below any valid event time: a garbled one only makes the bound conservative


class Lookahead:
    """Per (stream kind, partition), the input positions of its events and their suffix minima."""

    def __init__(
        self, batches: Iterable[list[RawEvent]], route: Callable[[bytes], int], kinds: Iterable[str]
    ) -> None:
        wanted = set(kinds)
        seen: dict[tuple[str, int], tuple[array[int], array[int]]] = {}
        n = 0
        for batch in batches:
            for raw in batch:
                if raw.kind in wanted:
                    ts = _event_ts(raw)
                    if ts is not None:  # without a time it is refused: a skip, which never waits
                        p = route(raw.key) if raw.key is not None else 0
                        where = seen.get((raw.kind, p))
                        if where is None:
                            where = seen[raw.kind, p] = (array("q"), array("q"))
                        where[0].append(n)
                        where[1].append(min(max(ts, _LOWEST), NO_MORE - 1))
                n += 1
        self.events = n
        self._streams = {k: (np.frombuffer(pos, np.int64), _suffix_min(ts)) for k, (pos, ts) in seen.items()}

    def bound(self, kind: str, partition: int, offered: int) -> int:
        """The earliest time of the events of ``kind`` on ``partition`` at input positions from
        ``offered`` on (the number of events offered so far); ``NO_MORE`` if there are none."""
        stream = self._streams.get((kind, partition))
        if stream is None:
            return NO_MORE
        positions, earliest = stream
        i = int(np.searchsorted(positions, offered))
        return NO_MORE if i == len(positions) else int(earliest[i])


def _suffix_min(ts: array[int]) -> np.ndarray:
    """``out[i] = min(ts[i:])``."""
    return np.minimum.accumulate(np.frombuffer(ts, np.int64)[::-1])[::-1]


def _event_ts(raw: RawEvent) -> int | None:
    value = raw.value
    if isinstance(value, bytes | bytearray):
        try:
            value = loads(bytes(value))
        except ValueError:
            return None
    ts = value.get("ts") if isinstance(value, Mapping) else None
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None
