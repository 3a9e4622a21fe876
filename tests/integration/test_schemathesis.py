"""schemathesis (an outside client) against a running ``ctr serve`` with a champion, every check on.

The replica is a real process (uvicorn, the bearer token from ``CTR_SERVING_AUTH_TOKEN``, features
from Feast on Redis), its champion a tiny DeepFM published to the MLflow server. schemathesis reads
its ``/openapi.json`` over HTTP and runs each operation through its phases (the document's
examples, coverage of the schema's edges and of undeclared methods, then fuzzing) with positive
and negative inputs, checking every answer against the document: status codes and content types
declared, bodies that match their schemas, 4xx for invalid input, 401 without the token, 405 with
``Allow`` for a method the path does not declare, no 5xx. Generation is deterministic (a fixed seed)
and bounded (:data:`MAX_EXAMPLES` per operation), so the test is repeatable and takes well under a
minute here.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from mlflow import MlflowClient
from schemathesis.config import SchemathesisConfig

from pipeline.core.config import RegistryConfig
from serving_bridge.openapi import openapi_spec
from serving_bridge.replica_processes import ReplicaProcesses
from trainers.registry import MlflowModelStore
from trainers.testing import tiny_learner

TOKEN = "schemathesis-t0k"
MAX_EXAMPLES = 40  # per operation and phase: enough to find the classes of failure, bounded in time
MAX_CANDIDATES = 16  # the replica's serving.max_candidates: small, so the edges of items are reached


CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": 14,
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True},
        "checks": {"enabled": True},
        "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
    }
)
# The document the replica serves (test_the_tested_document_is_the_one_served): loaded here, at
# collection, so pytest has one test per operation. schemathesis's lazy loader
# (schemathesis.pytest.from_fixture, which would fetch it from the running replica) breaks on
# pytest 9.2 (it sets the node's removed ``_nodeid``).
SPEC = openapi_spec(MAX_CANDIDATES, auth=True)
schema = schemathesis.openapi.from_dict(SPEC, config=CONFIG)


@pytest.fixture(scope="module")
def replica(services: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a ``ctr serve`` process serving a champion, with a bearer token (one per module:
    every operation's test talks to it)."""
    tmp = tmp_path_factory.mktemp("schemathesis")
    uri = services["CTR_REGISTRY_TRACKING_URI"]
    name = f"it-schemathesis-{uuid.uuid4().hex[:12]}"
    reg = RegistryConfig(model_name=name, experiment=name)
    store = MlflowModelStore(reg, uri)
    env = {
        **services,
        "CTR_REGISTRY_MODEL_NAME": name,
        "CTR_REGISTRY_EXPERIMENT": name,
        "CTR_DAEMON_STATE_DIR": str(tmp / "state"),
        "CTR_SERVING_AUTH_TOKEN": TOKEN,
        "CTR_SERVING_MAX_CANDIDATES": str(MAX_CANDIDATES),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    fleet = ReplicaProcesses.start(1, env, tmp / "logs")  # it imports while the champion is published
    try:
        version = store.publish(tiny_learner(0, n=200), {"block": 0}, {"logloss": 0.5})
        store.set_alias("champion", version)
        assert fleet.wait_until_all(str(version), 180), fleet.logs()
        yield fleet.urls[0]
    finally:
        fleet.stop()
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.delete_registered_model(name)
        client.delete_experiment(store.experiment_id)
    assert fleet.procs[0].returncode == 0, fleet.logs()


def test_the_tested_document_is_the_one_served(replica: str) -> None:
    with urllib.request.urlopen(f"{replica}/openapi.json", timeout=10) as resp:
        assert json.loads(resp.read()) == SPEC


@schema.parametrize()
def test_every_operation_passes_every_schemathesis_check(case: Any, replica: str) -> None:
    case.call_and_validate(base_url=replica, timeout=30)
