"""One deterministic order for the examples of many partition tasks: the order blocks are cut in.

Each partition task emits its examples in an order fixed by its partition's input alone. Handing
them to the trainer as they come would make the blocks depend on how the partitions' work
interleaved (fetch timing in the daemons, batch sizes in a replay). Instead the partitions' example
sequences are merged on ``(impression time, impression id, partition)``, taking the smallest head
only while every partition has one (or is done: at its end in a replay, idle and caught up in a
daemon). The merged order then depends only on each partition's sequence, so a replay and the
daemons, whatever their batch sizes, cut the same blocks from the same examples.

A partition without a head need not stop the merge if it promises a bound: :meth:`ExampleMerge.promise`
puts ``ts`` in its sequence, meaning "no example of mine sorts below impression time ``ts``". A
promise is a head that is never output, so examples below it are taken while the partition has
nothing, and the order is the one the merge would give without it whenever the promise holds. A
replay (:class:`~pipeline.join.partitioned_join.PartitionedJoin`) promises at fixed places of the
input, so the order stays independent of batch sizes even when one is broken (an example offered
below its partition's last promise, counted in :attr:`ExampleMerge.broken_promises`). Without
promises a replay whose partitions do not all get traffic (a Criteo log: one user, one partition)
held every example until the input ended.

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
>>> m.offer(0, [ex("d", 4), ex("f", 6)])
>>> m.promise(1, 5)  # partition 1: nothing of mine sorts below time 5
>>> [e.example_id for e in m.pop()]
['d']
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from pipeline.core.events import LabelledExample

__all__ = ["ExampleMerge"]


class _Promise:
    """A partition's promise in its sequence: none of its later examples sorts below ``ts``."""

    __slots__ = ("ts",)

    def __init__(self, ts: int) -> None:
        self.ts = ts


def _key(item: tuple[LabelledExample | _Promise, Any], partition: int) -> tuple[int, str, int]:
    head = item[0]
    if isinstance(head, _Promise):  # before every example of its time: ids are never empty
        return head.ts, "", partition
    imp = head.impression
    return imp.ts, imp.impression_id, partition


class ExampleMerge:
    """A ``partitions``-way merge of example sequences; see the module docstring.

    Each example may carry a tag (the daemon's position after it), given back by :meth:`pop_tagged`.
    """

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"ExampleMerge: partitions must be >= 1, got {partitions}")
        self.queues: list[deque[tuple[LabelledExample | _Promise, Any]]] = [
            deque() for _ in range(partitions)
        ]
        self._promised: list[int | None] = [None] * partitions  # each partition's last promise
        self._examples = 0  # buffered, promises not counted
        self.broken_promises = 0  # examples offered below their partition's last promise

    def offer(self, partition: int, examples: Iterable[LabelledExample], tags: Iterable[Any] = ()) -> None:
        """Append ``examples`` (in the partition's own order, with their ``tags``) to ``partition``'s."""
        q, before = self.queues[partition], len(self.queues[partition])
        q.extend(itertools.zip_longest(examples, tags))
        self._examples += len(q) - before
        promised = self._promised[partition]
        if promised is not None:
            for i in range(before, len(q)):
                self.broken_promises += q[i][0].impression.ts < promised  # type: ignore[union-attr]

    def promise(self, partition: int, ts: int) -> None:
        """``partition`` sends no example below impression time ``ts`` from now on (see the module
        docstring). Promises in a row count as their largest: the merge gets past each in turn."""
        q = self.queues[partition]
        if q and isinstance(q[-1][0], _Promise):
            last = q[-1][0]
            last.ts = ts = max(last.ts, ts)
        else:
            q.append((_Promise(ts), None))
        self._promised[partition] = ts

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
            if not isinstance(ex, _Promise):
                out.append((ex, p, tag))
            if q:
                heapq.heappush(heap, _key(q[0], p))
            elif not done(p):
                break  # p may still bring an example that sorts before the other heads
        self._examples -= len(out)
        return out

    def clear(self) -> None:
        """Forget everything buffered (the daemon's consumer rewound: it is read again)."""
        for q in self.queues:
            q.clear()
        self._promised = [None] * len(self.queues)
        self._examples = 0

    @property
    def buffered(self) -> int:
        """Examples waiting for their place (promises not counted)."""
        return self._examples
