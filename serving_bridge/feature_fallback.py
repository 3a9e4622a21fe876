"""Default features when the online store is away: a replica keeps scoring, never answers 5xx.

:class:`FallbackFeatures` wraps a reader (the direct Redis reader or Feast's SDK). A read that
fails (connection refused, timeout, anything the client raises) returns
:meth:`StreamingFeatures.defaults` for every candidate, counts the fallback and logs it (once per
outage, not once per request). After a failure the store is not asked again for ``retry_s``: a
store that hangs would otherwise add its timeout to every request.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from features.aggregations import StreamingFeatures
from pipeline.config import FeatureConfig

__all__ = ["FallbackFeatures"]

log = logging.getLogger(__name__)


class _Reader(Protocol):
    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]: ...


class FallbackFeatures:
    """``get`` as the wrapped reader, or defaults (counted in :attr:`fallbacks`) while it fails."""

    def __init__(
        self, reader: _Reader | None, cfg: FeatureConfig | None = None, retry_s: float = 1.0
    ) -> None:
        self.reader = reader  # None: no store configured yet, defaults for every request
        self.retry_s = retry_s
        self._defaults = StreamingFeatures(cfg or FeatureConfig()).defaults()
        self.fallbacks = 0  # requests scored with default features because the store failed
        self.failures = 0  # reads that raised
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._outage = False  # logged once per outage

    @property
    def healthy(self) -> bool:
        return self.reader is not None and not self._outage

    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        if self.reader is not None and time.monotonic() >= self._down_until:
            try:
                rows = self.reader.get(user_id, item_ids)
            except Exception as exc:
                self._failed(exc)
            else:
                if self._outage:
                    self._outage = False
                    log.warning("features: online store reachable again")
                return rows
        with self._lock:
            self.fallbacks += 1
        return [dict(self._defaults) for _ in item_ids]

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.failures += 1
            self._down_until = time.monotonic() + self.retry_s
            first = not self._outage
            self._outage = True
        if first:
            log.warning("features: online store read failed (%r); scoring with default features", exc)
