"""TimeQueue pops what one heap would, in the same order, however entries and pops interleave."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.join.time_queue import TimeQueue

# a push (time, id), or a pop of everything before a watermark
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 60), st.sampled_from("abcde")),
        st.tuples(st.just("pop"), st.integers(0, 70), st.just("")),
    ),
    max_size=200,
)


@given(_OPS, st.lists(st.tuples(st.integers(0, 60), st.sampled_from("abc")), max_size=20))
@settings(max_examples=300, deadline=None)
def test_pops_as_one_heap(ops, restored) -> None:
    queue, heap = TimeQueue(restored), list(restored)
    heapq.heapify(heap)
    for op, t, ident in ops:
        if op == "push":
            queue.push(t, ident)
            heapq.heappush(heap, (t, ident))
        else:
            got, want = [], []
            while queue.due(t):
                got.append(queue.pop())
            while heap and heap[0][0] < t:
                want.append(heapq.heappop(heap))
            assert got == want
        assert len(queue) == len(heap) and bool(queue) == bool(heap)
        assert sorted(queue) == sorted(heap)


def test_entries_in_time_order_never_touch_the_heap() -> None:
    queue = TimeQueue()
    for t in range(1_000):
        queue.push(t, f"i{t}")
    queue.push(5, "late")  # one out of order: the heap holds it alone
    assert (len(queue._run), len(queue._heap)) == (1_000, 1)
    assert [queue.pop() for _ in range(7)][-2:] == [(5, "i5"), (5, "late")]
