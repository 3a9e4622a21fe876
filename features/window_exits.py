"""When an entity's sliding windows next lose an event: the schedule of row refreshes.

A row pushed to the online store holds an entity's counters in the windows ending at the time of
the push. Time alone changes them later: an hour after a user's last impression its 1 h count is
0 at the joiner, whatever the row says. :class:`features.aggregations.StreamingFeatures` keeps, per
entity, the first bucket after its last row at which one of its windows loses a bucket of events
(:func:`next_exit`), and this schedule says, at each push, which entities passed theirs and need a
fresh row though nothing new happened to them.

Why by hand: a heap of buckets and, per bucket, the entities due then. An entity rescheduled
(a newer row moved its next exit) leaves its old entry behind; the caller checks an entry
against the entity's current ``next_exit`` when it comes due and skips a stale one, which is
cheaper than finding and removing it.

>>> exits = WindowExits()
>>> exits.add(12, "u1"); exits.add(10, "u2"); exits.add(12, "u3")
>>> list(exits.due(11)), list(exits.due(12)), len(exits)
([(10, 'u2')], [(12, 'u1'), (12, 'u3')], 0)
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator, Sequence

__all__ = ["WindowExits", "next_exit"]


def next_exit(buckets: Sequence[int], shift: int, at: int, spans: Sequence[int]) -> int:
    """The first bucket after ``at`` at which a window of ``spans`` buckets, ending there, holds
    fewer of the entity's buckets than it holds ending at ``at``; 0 if none ever will.

    ``buckets``: the entity's bucket entries, ascending, each one's index in its bits above
    ``shift`` (the packed cumulative counts of :mod:`features.aggregations`); all at or before
    ``at``. The window ending at ``at`` holds the buckets ``(at - span, at]``: the oldest of them,
    ``y``, leaves it at ``y + span``.
    """
    out = 0
    for span in spans:
        i = bisect_left(buckets, (at - span + 1) << shift)
        if i < len(buckets):
            leaves = (buckets[i] >> shift) + span
            if not out or leaves < out:
                out = leaves
    return out


class WindowExits:
    """Entities by the bucket at which their windows next lose an event (see the module docstring)."""

    __slots__ = ("_by_bucket", "_heap")

    def __init__(self) -> None:
        self._heap: list[int] = []  # the buckets of _by_bucket
        self._by_bucket: dict[int, list[str]] = {}

    def add(self, bucket: int, ident: str) -> None:
        """Schedule ``ident`` at ``bucket``."""
        due = self._by_bucket.get(bucket)
        if due is None:
            self._by_bucket[bucket] = [ident]
            heapq.heappush(self._heap, bucket)
        else:
            due.append(ident)

    def due(self, bucket: int) -> Iterator[tuple[int, str]]:
        """Remove and yield every ``(bucket, ident)`` scheduled at or before ``bucket``, in bucket order."""
        heap, by_bucket = self._heap, self._by_bucket
        while heap and heap[0] <= bucket:
            b = heapq.heappop(heap)
            for ident in by_bucket.pop(b):
                yield b, ident

    def __len__(self) -> int:
        return sum(map(len, self._by_bucket.values()))
