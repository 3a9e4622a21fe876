"""The implementations that need the real services through their contract checks (:mod:`pipeline.checks`):
Kafka consumer-group sources, the MLflow model store (bare and as the trainer daemon wraps it) and
the online feature readers on Redis."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pipeline.checks import check_feature_reader, check_group_source, check_model_store
from pipeline.checks.sources import Position
from pipeline.core.config import FeatureConfig, KafkaConfig, RegistryConfig, SimulatorConfig
from pipeline.daemons.idempotent_store import IdempotentStore
from pipeline.kafka.example_records import position
from pipeline.kafka.io import KafkaSink, publish_stream
from pipeline.kafka.sources import ExampleBatch, KafkaEventSource, KafkaExampleSource
from pipeline.sources.simulator import Simulator
from tests.integration.test_redis_reader import feast_store  # noqa: F401  (a fixture, reused)
from tests.test_trainer_daemon import FakeDaemon
from trainers.registry import MlflowModelStore
from trainers.testing import synthetic_examples, tiny_learner


@pytest.fixture
def two_groups(kafka_group: str, kafka_admin: Any) -> Iterator[tuple[str, str]]:
    """The test's consumer group and a second one (deleted after; the first by its fixture)."""
    seek = f"{kafka_group}-seek"
    yield kafka_group, seek
    try:
        kafka_admin.delete_groups([seek])
    except Exception as e:  # a failed cleanup must not hide the test's own result
        print(f"warning: could not delete consumer group {seek}: {e!r}")


def test_kafka_event_source_contract(kafka_cfg: KafkaConfig, two_groups: tuple[str, str]) -> None:
    events = list(Simulator(SimulatorConfig(), 5).stream(80))
    produced = sum(publish_stream(kafka_cfg, events).values())
    topics = {kafka_cfg.impressions_topic: "impression", kafka_cfg.clicks_topic: "click"}

    def make(group: str) -> KafkaEventSource:
        return KafkaEventSource(kafka_cfg, topics, group, batch_size=9)  # type: ignore[arg-type]

    check_group_source(make, two_groups, produced)


def example_positions(batch: ExampleBatch) -> list[Position]:
    """Examples and dead letters alike (both move the snapshot past their offset), in position order
    (a batch keeps them in two lists; here every record holds one example or one dead letter)."""
    out: list[Position] = [
        (w, at, ex.to_json()) for (w, at, _), ex in zip(batch.where, batch.examples, strict=True)
    ]
    out += [(f"{d.source}:{d.partition}", position(d.offset, 0), d.raw) for d in batch.dead]
    return sorted(out, key=lambda p: (p[0], p[1]))


def test_kafka_example_source_contract(kafka_cfg: KafkaConfig, two_groups: tuple[str, str]) -> None:
    sink = KafkaSink(kafka_cfg, kafka_cfg.examples_topic)
    values = [ex.to_json() for ex in synthetic_examples(60, seed=3)]
    values[10:10] = [b"not json", b'{"impression": {}}']  # dead letters count as delivered too
    for k, value in enumerate(values):
        sink.send(f"u{k % 7}".encode(), value)
    assert sink.flush() == len(values)
    sink.close()

    def make(group: str) -> KafkaExampleSource:
        return KafkaExampleSource(kafka_cfg, group, batch_size=8)

    check_group_source(make, two_groups, len(values), positions=example_positions)


# -- MLflow ----------------------------------------------------------------------------------------
def mlflow_store(scope: Any) -> MlflowModelStore:
    return MlflowModelStore(
        RegistryConfig(model_name=scope.model_name, experiment=scope.experiment_name), scope.uri
    )


def idempotent_mlflow(scope: Any) -> IdempotentStore:
    inner = mlflow_store(scope)
    return IdempotentStore(inner, FakeDaemon(inner))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make_store",
    [
        pytest.param(mlflow_store, id="mlflow"),
        pytest.param(idempotent_mlflow, id="trainer-daemon-idempotent"),
    ],
)
def test_mlflow_model_store_contract(make_store: Callable[[Any], Any], mlflow_scope: Any) -> None:
    check_model_store(make_store(mlflow_scope), lambda seed: tiny_learner(seed, n=200), timeout_s=30)


# -- feature readers on Redis ----------------------------------------------------------------------
@pytest.mark.parametrize("path", ["redis", "feast"])
def test_feature_reader_contract_on_redis(path: str, feast_store: tuple[Any, str]) -> None:  # noqa: F811
    from features.redis_reader import RedisFeatureReader
    from features.store import FeatureWriter, OnlineFeatureReader

    store, _ = feast_store
    reader = RedisFeatureReader.for_store(store) if path == "redis" else OnlineFeatureReader(store)
    check_feature_reader(reader, FeatureWriter(store, offline=False))


@pytest.mark.parametrize("path", ["redis", "feast"])
def test_feature_reader_contract_with_behaviour_sequences(
    path: str, services: dict[str, str], tmp_path
) -> None:
    """The user's list features come back in the same read, the ttl applied at the read's time."""
    from features.redis_reader import RedisFeatureReader
    from features.store import FeatureWriter, OnlineFeatureReader, open_store

    cfg = FeatureConfig(sequence_length=3)
    url = services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15"
    store = open_store(tmp_path / "feast", "production", url, f"it_seq_{uuid.uuid4().hex[:10]}", cfg=cfg)
    reader = RedisFeatureReader.for_store(store, cfg) if path == "redis" else OnlineFeatureReader(store, cfg)
    check_feature_reader(reader, FeatureWriter(store, cfg, offline=False), cfg=cfg)
