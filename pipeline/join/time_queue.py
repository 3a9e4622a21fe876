"""A priority queue of ``(time, id)`` entries for the joiner's windows, cheap when times come in order.

The joiner keeps four queues (open windows, early clicks' holds, dedup horizons, conversion
windows) and pops every entry whose time the watermark passed. A heap costs ``O(log n)`` tuple
comparisons per pop, a few microseconds at the sizes a partition holds, on every event. But the
entries mostly arrive in time order: an impression's window ends ``attribution_window_s`` after it,
and impressions come nearly in event-time order; a finalised id is forgotten a fixed horizon after
its window ended, in the order the windows end. So entries that do not precede the newest one go to
a sorted deque (append and pop in ``O(1)``), the others to a heap, and :meth:`TimeQueue.pop` takes
the smaller of the two heads: the same entries in the same order as one heap (ties between equal
times by id, as tuples compare), which keeps the joiner's output byte-identical.

>>> q = TimeQueue()
>>> for t, i in [(5, "a"), (7, "b"), (6, "c"), (7, "a"), (9, "d")]:
...     q.push(t, i)
>>> q.due(7), len(q), q.first()
(True, 5, 5)
>>> [q.pop() for _ in range(len(q))]
[(5, 'a'), (6, 'c'), (7, 'a'), (7, 'b'), (9, 'd')]
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator

__all__ = ["TimeQueue"]


class TimeQueue:
    """``(time, id)`` entries, smallest first; see the module docstring."""

    __slots__ = ("_heap", "_run")

    def __init__(self, entries: Iterable[tuple[int, str]] = ()) -> None:
        self._run: deque[tuple[int, str]] = deque(sorted(entries))  # ascending
        self._heap: list[tuple[int, str]] = []  # entries that came before the run's newest

    def push(self, time: int, ident: str) -> None:
        entry = (time, ident)
        run = self._run
        if not run or run[-1] <= entry:
            run.append(entry)
        else:
            heapq.heappush(self._heap, entry)

    def due(self, before: int) -> bool:
        """Whether the smallest entry's time is before ``before``."""
        run, heap = self._run, self._heap
        return bool((run and run[0][0] < before) or (heap and heap[0][0] < before))

    def first(self) -> int | None:
        """The smallest entry's time (``None`` if empty), without removing it."""
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heap[0][0]
        return run[0][0] if run else None

    def pop(self) -> tuple[int, str]:
        """Remove and return the smallest entry; ``IndexError`` if empty."""
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heapq.heappop(heap)
        return run.popleft()

    def __len__(self) -> int:
        return len(self._run) + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._run or self._heap)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        """Every entry, in no particular order."""
        yield from self._run
        yield from self._heap
