"""One deterministic order for the examples of many partition tasks: the order blocks are cut in.

Each partition task emits its examples in an order fixed by its partition's input alone. Handing
them to the trainer as they come would make the blocks depend on how the partitions' work
interleaved (fetch timing in the daemons, batch sizes in a replay). Instead the partitions' example
sequences are merged on ``(impression time, impression id, partition)``, taking the smallest head
only while every partition has one (or is done: at its end in a replay, idle and caught up in a
daemon). The merged order then depends only on each partition's sequence, so a replay and the
daemons, whatever their batch sizes, cut the same blocks from the same examples.

>>> from pipeline.events import Impression, LabelledExample
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
from collections import deque
from collections.abc import Callable, Iterable

from pipeline.events import LabelledExample

__all__ = ["ExampleMerge"]


def _key(ex: LabelledExample, partition: int) -> tuple[int, str, int]:
    return ex.impression.ts, ex.impression.impression_id, partition


class ExampleMerge:
    """A ``partitions``-way merge of example sequences; see the module docstring."""

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"ExampleMerge: partitions must be >= 1, got {partitions}")
        self.queues: list[deque[LabelledExample]] = [deque() for _ in range(partitions)]

    def offer(self, partition: int, examples: Iterable[LabelledExample]) -> None:
        """Append ``examples`` (in the partition's own order) to ``partition``'s sequence."""
        self.queues[partition].extend(examples)

    def pop(self, done: Callable[[int], bool] = lambda p: False) -> list[LabelledExample]:
        """Every example whose place in the merged order is final; ``done(p)``: nothing more from p."""
        queues = self.queues
        if any(not q and not done(p) for p, q in enumerate(queues)):
            return []
        heap = [_key(q[0], p) for p, q in enumerate(queues) if q]
        heapq.heapify(heap)
        out: list[LabelledExample] = []
        while heap:
            p = heapq.heappop(heap)[2]
            q = queues[p]
            out.append(q.popleft())
            if q:
                heapq.heappush(heap, _key(q[0], p))
            elif not done(p):
                break  # p may still bring an example that sorts before the other heads
        return out

    @property
    def buffered(self) -> int:
        return sum(len(q) for q in self.queues)
