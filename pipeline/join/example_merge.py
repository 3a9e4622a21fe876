"""One deterministic order for the examples of many partition tasks: the order blocks are cut in.

Each partition task emits its examples in an order fixed by its partition's input alone. Handing
them to the trainer as they come would make the blocks depend on how the partitions' work
interleaved (fetch timing in the daemons, batch sizes in a replay). Instead the partitions' example
sequences are merged on ``(impression time, impression id, partition)``, taking the smallest head
only while every partition has one (or is done: at its end in a replay, idle and caught up in a
daemon). The merged order then depends only on each partition's sequence, so a replay and the
daemons, whatever their batch sizes, cut the same blocks from the same examples.

>>> from pipeline.core.events import Impression, LabelledExample
>>> ex = lambda i, ts: LabelledExample(Impression(i, ts, "u", "a"), 0, ts)
>>> m = ExampleMerge(2)
>>> m.offer(0, [ex("a", 1), ex("c", 3)])
>>> [e.example_id for e in m.pop()]  # partition 1 has nothing yet: "a" could still lose to it
[]
>>> m.offer(1, [ex("b", 2)])
>>> [e.example_id for e in m.pop()]
['a', 'b']
>>> [e.example_id for e in m.pop(done=lambda p: True)]
['c']
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from pipeline.core.events import LabelledExample

__all__ = ["ExampleMerge"]


def _key(item: tuple[LabelledExample, Any], partition: int) -> tuple[int, str, int]:
    imp = item[0].impression
    return imp.ts, imp.impression_id, partition


class ExampleMerge:
    """A ``partitions``-way merge of example sequences; see the module docstring.

    Each example may carry a tag (the daemon's position after it), given back by :meth:`pop_tagged`.
    """

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"ExampleMerge: partitions must be >= 1, got {partitions}")
        self.queues: list[deque[tuple[LabelledExample, Any]]] = [deque() for _ in range(partitions)]

    def offer(self, partition: int, examples: Iterable[LabelledExample], tags: Iterable[Any] = ()) -> None:
        """Append ``examples`` (in the partition's own order, with their ``tags``) to ``partition``'s."""
        self.queues[partition].extend(itertools.zip_longest(examples, tags))

    def pop(self, done: Callable[[int], bool] = lambda p: False) -> list[LabelledExample]:
        """Every example whose place in the merged order is final; ``done(p)``: nothing more from p."""
        return [ex for ex, _, _ in self.pop_tagged(done)]

    def pop_tagged(
        self, done: Callable[[int], bool] = lambda p: False
    ) -> list[tuple[LabelledExample, int, Any]]:
        """:meth:`pop`, each example with its partition and tag."""
        queues = self.queues
        if any(not q and not done(p) for p, q in enumerate(queues)):
            return []
        heap = [_key(q[0], p) for p, q in enumerate(queues) if q]
        heapq.heapify(heap)
        out: list[tuple[LabelledExample, int, Any]] = []
        while heap:
            p = heapq.heappop(heap)[2]
            q = queues[p]
            ex, tag = q.popleft()
            out.append((ex, p, tag))
            if q:
                heapq.heappush(heap, _key(q[0], p))
            elif not done(p):
                break  # p may still bring an example that sorts before the other heads
        return out

    def clear(self) -> None:
        """Forget everything buffered (the daemon's consumer rewound: it is read again)."""
        for q in self.queues:
            q.clear()

    @property
    def buffered(self) -> int:
        return sum(len(q) for q in self.queues)
