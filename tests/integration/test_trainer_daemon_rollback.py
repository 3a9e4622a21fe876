"""`ctr trainer` over a rollback, on real Kafka, MLflow and Redis: it adopts the rolled-back
champion, refuses to move the alias with a candidate that does not beat it, and checkpoints the
adopted champion so that a restart keeps fine-tuning it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaProducer

from pipeline.core.config import RegistryConfig
from serving_bridge.rollback import rollback
from trainers.learner import TorchLearner
from trainers.registry import MlflowModelStore
from trainers.testing import synthetic_examples

BLOCK = 2_000


def produce(bootstrap: str, topic: str, start: int, n: int, seed: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for ex in synthetic_examples(n, seed=seed, start_index=start):
        producer.send(topic, key=ex.impression.user_id.encode(), value=ex.to_json())
    producer.flush()
    producer.close()


@pytest.mark.parametrize("ranks", ["1", "2"])  # 2: rank 0 downloads the adopted version for both
def test_the_trainer_daemon_adopts_a_rollback_and_checkpoints_the_adopted_champion(
    services: dict[str, str], kafka_topic: Callable[..., str], mlflow_scope, tmp_path: Path, ranks: str
) -> None:
    examples, dead = kafka_topic(partitions=1), kafka_topic(partitions=1)
    env = {
        **os.environ,
        "CTR_KAFKA_BOOTSTRAP_SERVERS": services["CTR_KAFKA_BOOTSTRAP_SERVERS"],
        "CTR_KAFKA_EXAMPLES_TOPIC": examples,
        "CTR_KAFKA_DEAD_LETTER_TOPIC": dead,
        "CTR_KAFKA_PARTITIONS": "1",
        "CTR_KAFKA_GROUP_ID_PREFIX": f"it-{uuid.uuid4().hex[:10]}",
        "CTR_DAEMON_STATE_DIR": str(tmp_path / "state"),
        "CTR_DAEMON_REDIS_URL": services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15",
        "CTR_REGISTRY_TRACKING_URI": services["CTR_REGISTRY_TRACKING_URI"],
        "CTR_REGISTRY_MODEL_NAME": mlflow_scope.model_name,
        "CTR_REGISTRY_EXPERIMENT": mlflow_scope.experiment_name,
        "CTR_TRAINER_MODEL": "lr",
        "CTR_TRAINER_TRAIN_EVERY": str(BLOCK),
        "CTR_TRAINER_HASH_BUCKETS": str(1 << 14),
        "CTR_TRAINER_BATCH_SIZE": "256",
        "CTR_TRAINER_HOLDOUT_FRACTION": "0.2",
        "CTR_TRAINER_DEVICE": "cpu",
        "CTR_TRAINER_THREADS": "1",
        "CTR_TRAINER_GATE_TOLERANCE": "1.0",
        "CTR_TRAINER_RANKS": ranks,
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }

    def trainer(**extra: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.ops.cli", "-v", "trainer", "--exit-when-idle", "5"],
            env=env | extra,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stderr

    store = MlflowModelStore(
        RegistryConfig(model_name=mlflow_scope.model_name, experiment=mlflow_scope.experiment_name),
        services["CTR_REGISTRY_TRACKING_URI"],
    )
    produce(services["CTR_KAFKA_BOOTSTRAP_SERVERS"], examples, 0, 2 * BLOCK, seed=11)
    trainer()
    assert store.versions() == ["1", "2"] and store.resolve("champion") == "2"

    rollback(store, "1", "version 2 looks wrong", by="it")
    produce(services["CTR_KAFKA_BOOTSTRAP_SERVERS"], examples, 2 * BLOCK, BLOCK, seed=12)
    log = trainer(CTR_TRAINER_GATE_TOLERANCE="-0.5")  # no candidate can beat the champion
    assert "points at version 1, not 2" in log and "block 3 refused" in log, log[-4000:]
    assert store.versions() == ["1", "2"] and store.resolve("champion") == "1"

    state = tmp_path / "state" / "trainer"
    assert json.loads((state / "meta.json").read_text())["champion_version"] == "1"
    probe = synthetic_examples(300, seed=99, start_index=10 * BLOCK)
    checkpointed = TorchLearner.load(state / "learner")
    assert (checkpointed.predict(probe) == store.load("1").predict(probe)).all()
