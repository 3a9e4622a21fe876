"""Fixtures for integration tests against the real services (Kafka, Redis, MLflow tracking server).

The session fixture `services` runs `deploy/services.sh up` once (idempotent: a no-op plus health
checks when they already run; first time on a machine it fetches Kafka from Maven Central and
installs Redis from Debian) and reads the addresses `deploy/services.sh env` prints, under the names
the config reads (CTR_KAFKA_BOOTSTRAP_SERVERS, CTR_DAEMON_REDIS_URL, CTR_REGISTRY_TRACKING_URI). Each
test that uses them has them in its environment (so `load_config()` and the processes it starts use
them); other tests do not. Services are left running afterwards.

Set CTR_SERVICES_EXTERNAL=1 (with the three CTR_* URLs) to test against services started elsewhere.

Every test gets its own resources: uuid-named Kafka topics and consumer groups (deleted after the
test), a uuid Redis key prefix in a test database (keys deleted after), a uuid MLflow experiment and
registered-model name (deleted after).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# kafka-python 3.0.x reads its protocol schemas with importlib.resources.read_text at import time,
# which warns (DeprecationWarning attributed to importlib.resources._legacy, so pyproject's
# "ignore::DeprecationWarning:kafka.*" does not catch it; ~100 lines per session). Import it once
# here with that warning silenced; later imports are cached.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import kafka  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
SERVICES_SH = REPO / "deploy" / "services.sh"
URL_VARS = ("CTR_KAFKA_BOOTSTRAP_SERVERS", "CTR_DAEMON_REDIS_URL", "CTR_REGISTRY_TRACKING_URI")
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/integration needs the services: mark it so `-m "not integration"` skips it."""
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)


def _unique(request: pytest.FixtureRequest, prefix: str) -> str:
    test = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name).strip("-")[:40]
    return f"{prefix}-{test}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def services() -> Iterator[dict[str, str]]:
    """Start (or just health-check) the local services once per session; yield their URLs."""
    if os.environ.get("CTR_SERVICES_EXTERNAL") == "1":
        missing = [v for v in URL_VARS if not os.environ.get(v)]
        if missing:
            pytest.fail(f"CTR_SERVICES_EXTERNAL=1 but {', '.join(missing)} not set")
        yield {v: os.environ[v] for v in URL_VARS}
        return
    env = {**os.environ, "CTR_VENV": os.environ.get("CTR_VENV", sys.prefix)}
    up = subprocess.run(
        [str(SERVICES_SH), "up"], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    if up.returncode != 0:
        pytest.fail(
            f"`deploy/services.sh up` failed (rc {up.returncode}):\n{up.stderr[-4000:]}{up.stdout[-2000:]}",
            pytrace=False,
        )
    printed = subprocess.run(
        [str(SERVICES_SH), "env"], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    urls = dict(re.findall(r"^export (CTR_[A-Z_]+)=(.*)$", printed, flags=re.M))
    assert set(URL_VARS) <= urls.keys(), printed
    yield {k: urls[k] for k in URL_VARS}


@pytest.fixture(autouse=True)
def _services_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that uses the services gets their addresses in its environment, for this test only:
    they are the config's own names, and a session-wide export would point the unit tests that run
    after this directory (the embedded profile: no tracking server) at the MLflow server."""
    if "services" in request.fixturenames:
        for k, v in request.getfixturevalue("services").items():
            monkeypatch.setenv(k, v)


# ------------------------------------------------------------------------------------------- Kafka
@pytest.fixture(scope="session")
def kafka_bootstrap(services: dict[str, str]) -> str:
    return services["CTR_KAFKA_BOOTSTRAP_SERVERS"]


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> Iterator[object]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="ctr-integration-tests")
    yield admin
    admin.close()


@pytest.fixture
def kafka_topic(request: pytest.FixtureRequest, kafka_admin) -> Iterator[Callable[..., str]]:
    """Factory: `kafka_topic(partitions=3)` creates a uuid-named topic; all are deleted after the test."""
    created: list[str] = []

    def make(partitions: int = 1, **configs: str) -> str:
        name = _unique(request, "it")
        kafka_admin.create_topics(
            {name: {"num_partitions": partitions, "replication_factor": 1, "configs": configs}},
            wait_for_metadata=True,  # every partition has a leader before the test produces
        )
        created.append(name)
        return name

    yield make
    if created:
        try:
            kafka_admin.delete_topics(created)
        except Exception as e:  # a failed cleanup must not hide the test's own result
            print(f"warning: could not delete topics {created}: {e!r}")


@pytest.fixture
def kafka_group(request: pytest.FixtureRequest, kafka_admin) -> Iterator[str]:
    """A uuid consumer-group id, deleted after the test (its consumers must be closed by then)."""
    group = _unique(request, "it-group")
    yield group
    try:
        kafka_admin.delete_groups([group])
    except Exception as e:
        print(f"warning: could not delete consumer group {group}: {e!r}")


@pytest.fixture
def kafka_cfg(kafka_bootstrap: str, kafka_topic: Callable[..., str]) -> object:
    """A KafkaConfig on the test broker whose four topics are fresh uuid topics (3 partitions each,
    1 for dead letters), with short poll and connect timeouts."""
    from pipeline.core.config import KafkaConfig

    return KafkaConfig(
        bootstrap_servers=kafka_bootstrap,
        impressions_topic=kafka_topic(partitions=3),
        clicks_topic=kafka_topic(partitions=3),
        examples_topic=kafka_topic(partitions=3),
        dead_letter_topic=kafka_topic(partitions=1),
        joiner_state_topic=kafka_topic(partitions=3, **{"cleanup.policy": "compact"}),
        poll_timeout_ms=200,
        connect_timeout_ms=5_000,
    )


# ------------------------------------------------------------------------------------------- Redis
@dataclass
class RedisNamespace:
    client: object  # redis.Redis, decode_responses=True
    prefix: str  # every key a test writes starts with this

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"


@pytest.fixture
def redis_ns(request: pytest.FixtureRequest, services: dict[str, str]) -> Iterator[RedisNamespace]:
    """A Redis client on the test database (CTR_TEST_REDIS_DB, default 15, never the production db 0)
    and a uuid key prefix; the prefix's keys are deleted after the test."""
    import redis

    db = int(os.environ.get("CTR_TEST_REDIS_DB", "15"))
    client = redis.Redis.from_url(services["CTR_DAEMON_REDIS_URL"], db=db, decode_responses=True)
    ns = RedisNamespace(client=client, prefix=f"{_unique(request, 'it')}:")
    yield ns
    keys = list(client.scan_iter(match=f"{ns.prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


# ------------------------------------------------------------------------------------------ MLflow
@pytest.fixture(scope="session")
def mlflow_uri(services: dict[str, str]) -> str:
    return services["CTR_REGISTRY_TRACKING_URI"]


@dataclass
class MlflowScope:
    uri: str
    experiment_name: str
    model_name: str


@pytest.fixture
def mlflow_scope(request: pytest.FixtureRequest, mlflow_uri: str) -> Iterator[MlflowScope]:
    """Points mlflow at the tracking server; a uuid experiment and registered-model name, removed after."""
    import mlflow
    from mlflow import MlflowClient

    old_tracking, old_registry = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    mlflow.set_tracking_uri(mlflow_uri)
    mlflow.set_registry_uri(mlflow_uri)
    scope = MlflowScope(mlflow_uri, _unique(request, "it-exp"), _unique(request, "it-model"))
    yield scope
    client = MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    try:
        if client.search_model_versions(f"name='{scope.model_name}'"):
            client.delete_registered_model(scope.model_name)
        exp = client.get_experiment_by_name(scope.experiment_name)
        if exp is not None:
            client.delete_experiment(exp.experiment_id)
    except Exception as e:
        print(f"warning: mlflow cleanup failed: {e!r}")
    finally:
        mlflow.set_tracking_uri(old_tracking)
        mlflow.set_registry_uri(old_registry)
