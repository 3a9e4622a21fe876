"""Default features when the online store is away: a replica keeps scoring, never answers 5xx.

:class:`FallbackFeatures` wraps a reader (the direct Redis reader or Feast's SDK). A read that
fails (connection refused, timeout, a store not opened yet, anything the client raises) returns
:meth:`StreamingFeatures.defaults` for every candidate, counts the fallback and logs it (once per
outage, not once per request). After ``failures_to_back_off`` failed reads in a row the store is
not asked again for ``retry_s``: a store that hangs would otherwise add its timeout to every
request. A single failure does not back off: one read late by a stall of this process (the VM
descheduled it, a collection) is not an outage, and backing off on it scored the next second of
requests (~200 at 200 req/s) with defaults.

With ``timeout_s`` set (``serving.feature_timeout_s`` in ``ctr serve``) the request waits for a
read at most ``timeout_s``; a slower read counts as a failure and the request scores with defaults
at once. :meth:`aget` (the serving app's path) awaits the reader's own ``aget`` on the event loop
under that deadline, with no thread in between; a reader without one, and :meth:`get`, run the
read on a small worker pool and wait for it as long. Socket timeouts alone do not bound a read: a client
may retry with back-off (redis-py 7 by default sleeps up to 2 + 4 + 8 s between its retries), and
Feast's SDK builds its own Redis client, which we do not configure.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol, cast

from features.aggregations import StreamingFeatures
from pipeline.core.config import FeatureConfig

__all__ = ["FallbackFeatures", "read_async"]

log = logging.getLogger(__name__)


class _Reader(Protocol):
    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]: ...


async def read_async(
    reader: _Reader, user_id: str, item_ids: list[str], executor: Executor | None = None
) -> list[dict[str, float]]:
    """``reader.aget`` awaited when the reader has one (the direct Redis reader); otherwise its
    blocking ``get`` (Feast's SDK) on ``executor`` (None: the loop's default pool)."""
    aget = getattr(reader, "aget", None)
    if aget is not None:
        return cast(list[dict[str, float]], await aget(user_id, item_ids))
    return await asyncio.get_running_loop().run_in_executor(executor, reader.get, user_id, item_ids)


class FallbackFeatures:
    """``get`` as the wrapped reader, or defaults (counted in :attr:`fallbacks`) while it fails."""

    def __init__(
        self,
        reader: _Reader | None,
        cfg: FeatureConfig | None = None,
        retry_s: float = 1.0,
        *,
        timeout_s: float | None = None,
        workers: int = 32,
        failures_to_back_off: int = 3,
    ) -> None:
        self.reader = reader  # None: no store configured yet, defaults for every request
        self.retry_s = retry_s
        self.failures_to_back_off = max(1, failures_to_back_off)
        self._in_a_row = 0  # failed reads since the last good one
        self.timeout_s = timeout_s  # None: read in the caller's thread, no deadline (tests, tools)
        self._defaults = StreamingFeatures(cfg or FeatureConfig()).defaults()
        self.fallbacks = 0  # requests scored with default features because the store failed
        self.failures = 0  # reads that raised (or missed the deadline)
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._outage = False  # logged once per outage
        self._pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="feature-read") if timeout_s is not None else None
        )

    async def awarm(self, connections: int) -> bool:
        """The reader's connections opened on the running loop before requests need them; False
        if there is nothing to warm yet (no store open). Raises what the reader met."""
        warm = getattr(self.reader, "awarm", None)
        return bool(await warm(connections)) if warm is not None else True

    @property
    def healthy(self) -> bool:
        return self.reader is not None and not self._outage

    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        reader = self._reader_now()
        if reader is not None:
            try:
                rows = self._read(reader, user_id, item_ids)
            except Exception as exc:
                self._failed(exc)
            else:
                self._recovered()
                return rows
        return self._fallback(item_ids)

    async def aget(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        """:meth:`get` for a caller on the event loop: the same deadline, fallback and counts."""
        reader = self._reader_now()
        if reader is not None:
            try:
                async with asyncio.timeout(self.timeout_s):
                    rows = await read_async(reader, user_id, item_ids, self._pool)
            except Exception as exc:  # TimeoutError included: the read is cancelled, not awaited on
                if isinstance(exc, TimeoutError):
                    exc = TimeoutError(f"online store read took longer than {self.timeout_s} s")
                self._failed(exc)
            else:
                self._recovered()
                return rows
        return self._fallback(item_ids)

    def _reader_now(self) -> _Reader | None:
        """The reader to ask, or None: no store configured, or in its back-off after a failure."""
        return self.reader if time.monotonic() >= self._down_until else None

    def _fallback(self, item_ids: list[str]) -> list[dict[str, float]]:
        with self._lock:
            self.fallbacks += 1
        return [dict(self._defaults) for _ in item_ids]

    def _recovered(self) -> None:
        self._in_a_row = 0
        if self._outage:
            self._outage = False
            log.warning("features: online store reachable again")

    def _read(self, reader: _Reader, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        if self._pool is None:
            return reader.get(user_id, item_ids)
        future = self._pool.submit(reader.get, user_id, item_ids)
        try:
            return future.result(timeout=self.timeout_s)
        except TimeoutError:  # concurrent.futures.TimeoutError is the builtin one since 3.11
            future.cancel()  # not started yet (all workers busy): never runs; else it ends on its own
            raise TimeoutError(f"online store read took longer than {self.timeout_s} s") from None

    def close(self) -> None:
        """Stop the worker pool (a read still running finishes on its own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.failures += 1
            self._in_a_row += 1
            if self._in_a_row < self.failures_to_back_off:
                log.info("features: online store read failed (%r); this request scores with defaults", exc)
                return
            self._down_until = time.monotonic() + self.retry_s
            first = not self._outage
            self._outage = True
        if first:
            log.warning(
                "features: %d online store reads in a row failed (last: %r); scoring with default "
                "features, asking the store again every %.1f s",
                self._in_a_row,
                exc,
                self.retry_s,
            )
