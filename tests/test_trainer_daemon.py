"""The trainer daemon's registration rules, without a broker: checkpoint first, register once."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pipeline.daemons.idempotent_store import IdempotentStore, lineage_key
from trainers.testing import InMemoryModelStore


class Model:
    version: str | None = None

    def clone(self) -> Model:
        return Model()


class FakeDaemon:
    stopping = False
    block_closed_at = 1_780_000_000.25  # wall time the block's last example was read

    def __init__(self, store: InMemoryModelStore) -> None:
        self.store = store
        self.registry_failures: Counter[str] = Counter()
        self.pending: list[tuple[str, int]] = []  # (lineage key, versions registered at that moment)

    def save_pending(self, model: Any, lineage: dict[str, Any], metrics: dict[str, float], key: str) -> None:
        self.pending.append((key, len(self.store.versions())))


LINEAGE = {
    "parent_version": "3",
    "position": {"kafka_offsets_from": {"ex:0": 5}, "kafka_offsets_to": {"ex:0": 9}},
}


def test_lineage_key_depends_on_parent_and_position_only() -> None:
    assert lineage_key(LINEAGE) == lineage_key({**LINEAGE, "examples": 4})
    assert lineage_key(LINEAGE) != lineage_key({**LINEAGE, "parent_version": "4"})
    moved = {"kafka_offsets_from": {"ex:0": 5}, "kafka_offsets_to": {"ex:0": 10}}
    assert lineage_key(LINEAGE) != lineage_key({**LINEAGE, "position": moved})


def test_checkpoint_comes_before_registration_and_a_retry_registers_nothing_new() -> None:
    inner = InMemoryModelStore()
    daemon = FakeDaemon(inner)
    store = IdempotentStore(inner, daemon)  # type: ignore[arg-type]
    first = store.publish(Model(), LINEAGE, {"auc": 0.7})
    assert daemon.pending == [(lineage_key(LINEAGE), 0)]  # checkpointed while nothing was registered
    again = store.publish(Model(), LINEAGE, {"auc": 0.7})  # a restart re-running the same block
    assert again == first and inner.versions() == ["1"]
    assert float(inner.lineage("1")["block_closed_at"]) == FakeDaemon.block_closed_at  # freshness starts here
    other = store.publish(Model(), {**LINEAGE, "parent_version": "1"}, {})
    assert other == "2"


def test_registration_waits_for_the_registry_to_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = InMemoryModelStore()
    failures = iter([ConnectionError("mlflow down"), ConnectionError("still down")])
    real_publish = inner.publish

    def flaky(model: Any, lineage: Any, metrics: Any) -> str:
        err = next(failures, None)
        if err is not None:
            raise err
        return real_publish(model, lineage, metrics)

    monkeypatch.setattr(inner, "publish", flaky)
    slept: list[float] = []
    monkeypatch.setattr("pipeline.daemons.trainer.time.sleep", slept.append)
    store = IdempotentStore(inner, FakeDaemon(inner))  # type: ignore[arg-type]
    assert store.publish(Model(), LINEAGE, {}) == "1"
    assert slept == [1.0, 2.0] and inner.versions() == ["1"]
    assert store.daemon.registry_failures == {"registration": 2}  # type: ignore[attr-defined]  # a metric


def test_a_bug_is_raised_at_once_not_retried_as_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = InMemoryModelStore()

    def broken(model: Any, lineage: Any, metrics: Any) -> str:
        raise TypeError("a programming error, not an MLflow outage")

    monkeypatch.setattr(inner, "publish", broken)
    slept: list[float] = []
    monkeypatch.setattr("pipeline.daemons.trainer.time.sleep", slept.append)
    store = IdempotentStore(inner, FakeDaemon(inner))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="programming error"):
        store.publish(Model(), LINEAGE, {})
    assert slept == [] and not store.daemon.registry_failures  # type: ignore[attr-defined]
