"""The cyclic garbage collector of a process that streams millions of short-lived objects.

CPython frees almost everything by reference counting; its cyclic collector only finds cycles, and
the joiner makes next to none. With Python's thresholds (700, 10, 10) the collector still ran
~2,150 young, ~195 middle and **9 full collections** while the joiner read 158k events over Kafka
(``benchmarks/ingest.py``): each full one walks every live object, the ~390,000 that start-up left
(Feast, pandas, protobuf, the Kafka clients) and the joiner's growing state (open impressions,
counters), and together they took **2.3-2.7 s of the joiner's ~9 s**, finding nothing to free.

:func:`tune_gc` makes two plain ``gc`` calls (nothing on PyPI wraps them; Instagram's "Dismissing
Python Garbage Collection" describes the same pair, and ``serving_bridge.process`` freezes for the
same reason):

- ``gc.freeze()``: every object alive once start-up is done moves to a permanent generation that
  no collection walks again (they live as long as the process);
- ``gc.set_threshold(gen0, ...)``: a young collection every ``gen0`` net container allocations
  instead of 700, so objects that live a few milliseconds (an event's dicts) die by refcount before
  any collection sees them, and fewer reach the older generations. Cycles are still collected, only
  later: at most ``gen0`` objects' worth of them wait.

With ``gen0`` = 50,000 the same run spent 0.2-0.3 s in 10 young collections and none in full ones.
The replay engine (``ctr backtest``, ``ctr demo``) paid more: 21 full collections, 5.2-5.5 s of a
14-16.5 s loop over 200k simulated impressions; tuned, none, and the loop took 9.5-10.7 s. The
joiner and trainer daemons call :func:`tune_gc` when their loop starts (the process is theirs, as
the signal handlers they install); :class:`~pipeline.replay.loop.OnlineLoop` uses
:func:`tuned_gc` and restores the collector when it returns.

>>> import gc
>>> before = tune_gc(50_000)
>>> gc.get_threshold()[0], gc.get_freeze_count() > 0
(50000, True)
>>> restore_gc(before); gc.get_threshold() == before, gc.get_freeze_count()
(True, 0)
>>> tune_gc(0) == gc.get_threshold()  # 0: Python's own thresholds, nothing frozen
True
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["restore_gc", "tune_gc", "tuned_gc"]


def tune_gc(gen0: int) -> tuple[int, int, int]:
    """Collect once, freeze what is alive, then collect the young generation every ``gen0``
    allocations (``0``: change nothing). Returns the thresholds before, for :func:`restore_gc`."""
    before = gc.get_threshold()
    if gen0 > 0:
        gc.collect()  # what start-up left as garbage is freed, not frozen
        gc.freeze()
        gc.set_threshold(gen0, before[1], before[2])
    return before


def restore_gc(thresholds: tuple[int, int, int]) -> None:
    """The collector as before :func:`tune_gc`; the frozen objects can be collected again."""
    gc.set_threshold(*thresholds)
    gc.unfreeze()


@contextmanager
def tuned_gc(gen0: int) -> Iterator[None]:
    """:func:`tune_gc` for the block, then the collector as it was: for the replay engine, which
    also runs inside other processes (tests, benchmarks) that go on afterwards."""
    before = tune_gc(gen0)
    try:
        yield
    finally:
        if gen0 > 0:
            restore_gc(before)
