"""The trainer's model store: checkpoint first, then register at most once per lineage key.

:class:`IdempotentStore` wraps the MLflow store for ``ctr trainer``: ``publish`` checkpoints the
accepted block as *pending* (through the daemon) before registering it, and registration first
looks the block's lineage key up, so a crash between the two, or an MLflow server that is down,
ends in exactly one version once it is back. MLflow outages are retried with back-off; an answer
no retry can change, or any other exception (a bug), is raised at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from mlflow.exceptions import MlflowException

from pipeline.core import systemd
from trainers.registry import MlflowModelStore

__all__ = ["REGISTRY_OUTAGES", "IdempotentStore", "lineage_key"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")
# What an MLflow server that is away or failing looks like to its client: connection errors and
# timeouts (requests' are OSErrors) and error answers (MlflowException, RestException included).
REGISTRY_OUTAGES = (MlflowException, OSError)
# ... except answers no retry can change (no such version or alias): raised at once, or a bad
# set_alias or load would be retried forever (found by pipeline.checks.check_model_store).
_NOT_OUTAGES = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


class _Daemon(Protocol):
    """What the store needs of the trainer daemon that owns it."""

    stopping: bool
    block_closed_at: float
    registry_failures: Counter[str]

    def save_pending(
        self, model: Any, lineage: dict[str, Any], metrics: dict[str, float], key: str
    ) -> None: ...


def lineage_key(lineage: Mapping[str, Any]) -> str:
    """What makes a version unique: its parent and the exact input it learned from."""
    basis = json.dumps([lineage.get("parent_version"), lineage.get("position")], sort_keys=True)
    return hashlib.sha256(basis.encode()).hexdigest()[:24]


class IdempotentStore:
    """Wraps the MLflow store: checkpoint first, then register at most once per lineage key."""

    def __init__(self, inner: MlflowModelStore, daemon: _Daemon) -> None:
        self.inner, self.daemon = inner, daemon

    def publish(self, model: Any, lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
        key = lineage_key(lineage)
        lineage = {**lineage, "block_closed_at": round(self.daemon.block_closed_at, 3)}
        self.daemon.save_pending(model, dict(lineage), dict(metrics), key)
        return self.register(model, {**lineage, "lineage_key": key}, metrics)

    def register(self, model: Any, lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
        found = self._retrying("lookup", lambda: self.find(str(lineage["lineage_key"])))
        if found is not None:
            log.info(
                "trainer: version %s already holds lineage %s; not registering again",
                found,
                lineage["lineage_key"],
            )
            return found
        return self._retrying("registration", lambda: self.inner.publish(model, lineage, metrics))

    def _retrying(self, what: str, call: Callable[[], _T]) -> _T:
        """``call()``, retried with back-off (1, 2, 4 ... 30 s) while the MLflow server is away."""
        delay = 1.0
        while True:  # the MLflow server may be down: keep the pending block until it is back
            try:
                return call()
            except REGISTRY_OUTAGES as exc:  # anything else is a bug: fail loudly, never retry it forever
                if self.daemon.stopping or getattr(exc, "error_code", None) in _NOT_OUTAGES:
                    raise
                self.daemon.registry_failures[what] += 1
                log.warning("trainer: MLflow %s failed; retrying in %.0fs", what, delay, exc_info=True)
                # waiting on MLflow is not a hang: keep the watchdog fed (and, while starting up,
                # the start timeout extended) instead of having systemd restart us into the same wait
                systemd.status(f"trainer: MLflow {what} failed; retrying in {delay:.0f}s")
                systemd.watchdog()
                systemd.extend_timeout(delay + 60)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)

    def find(self, key: str) -> str | None:
        return self.inner.find_by_tag("lineage_key", key)

    def set_alias(self, alias: str, version: str) -> None:
        self._retrying("alias move", lambda: self.inner.set_alias(alias, version))

    def resolve(self, alias: str) -> str | None:
        return self._retrying("alias lookup", lambda: self.inner.resolve(alias))

    def load(self, version: str) -> Any:
        return self._retrying("model download", lambda: self.inner.load(version))

    def download(self, version: str, dst: Path) -> Path:
        return self._retrying("model download", lambda: self.inner.download(version, dst))
