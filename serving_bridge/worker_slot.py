"""What one worker of a multi-worker ``ctr serve`` shares with its parent and its siblings.

Two numbers per worker in shared memory (``multiprocessing`` arrays the parent creates):

- its **heartbeat**, ``time.monotonic()`` when its event loop last ticked (CLOCK_MONOTONIC is one
  clock for every process of the host). The parent replaces a worker silent for
  ``serving.worker_hang_s``; siblings count only workers that beat within :data:`ALIVE_S`;
- its **open connections**. All workers accept on one listening socket, and a connection stays on
  the worker that accepted it (keep-alive). Left to the event loop, the worker that wakes first
  takes every connection waiting (libuv accepts until the queue is empty): 8 client connections
  opened together were seen split 6/2, so one worker carried three quarters of the load.
  :meth:`WorkerSlot.defer_accept` says whether a live sibling holds fewer connections than this
  worker, which then leaves the next connection to it (``DrainingServer`` waits at most
  ``MAX_DEFER_S``, 50 ms, so a busy or stuck sibling delays a connect by that, never refuses it).

Why by hand: nginx's ``accept_mutex`` and the kernel's ``SO_REUSEPORT`` hashing are the usual
answers; the first is not in uvicorn or uvloop, and the second spreads by a hash of the client's
address and port, which leaves 8 connections uneven as often as not.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["ALIVE_S", "WorkerSlot"]

ALIVE_S = 1.0  # a sibling that has not ticked for this long is starting, stopping or stuck


class WorkerSlot:
    """Worker ``index``'s cells in the shared ``beats`` (float) and ``connections`` (int) arrays."""

    def __init__(self, index: int, beats: Any, connections: Any) -> None:
        self.index = index
        self.beats = beats
        self.connections = connections

    def beat(self) -> None:
        """Called from the worker's event loop: it is alive."""
        self.beats[self.index] = time.monotonic()

    def set_connections(self, n: int) -> None:
        self.connections[self.index] = n

    def defer_accept(self, mine: int) -> bool:
        """True when a live sibling holds fewer connections than ``mine`` (this worker's)."""
        now = time.monotonic()
        for j in range(len(self.beats)):
            if j != self.index and now - self.beats[j] < ALIVE_S and self.connections[j] < mine:
                return True
        return False
