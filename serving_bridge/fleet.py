"""A set of replicas, and the measurement of when all of them serve a given version."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from serving_bridge.replica import Replica

__all__ = ["Fleet"]


@dataclass
class Fleet:
    replicas: list[Replica]

    @classmethod
    def start(cls, replicas: Iterable[Replica]) -> Fleet:
        return cls([r.start() for r in replicas])

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()

    def notify(self) -> None:
        """The trainer moved the alias: every replica checks now."""
        for r in self.replicas:
            r.notify()

    def versions(self) -> dict[str, str | None]:
        return {r.name: r.version for r in self.replicas}

    def live_at(self, version: str) -> float | None:
        """Wall time at which the *last* replica went live on ``version`` (None if one has not)."""
        times = []
        for r in self.replicas:
            t = next((when for v, when in r.swaps if v == version), None)
            if t is None:
                return None
            times.append(t)
        return max(times)

    def wait_for(self, version: str, timeout_s: float = 30.0) -> float | None:
        """Block until every replica serves ``version``; returns :meth:`live_at` or None on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            t = self.live_at(version)
            if t is not None:
                return t
            time.sleep(0.01)
        return None
