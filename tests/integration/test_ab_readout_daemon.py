"""The live A/B readout through `ctr trainer` on real Kafka and an MLflow server: every example's
served version and score reach the version's readout exactly once, across a restart, and `ctr ab`
reads back what a readout of the same examples computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest
from kafka import KafkaProducer

from pipeline.core.config import RegistryConfig
from pipeline.core.events import LabelledExample
from pipeline.ops.cli import main as ctr_main
from serving_bridge.ab import arm_of
from trainers.ab_readout import ABReadout
from trainers.model_registry import ModelRegistry
from trainers.testing import synthetic_examples

BLOCK = 2_000


def served(n: int, seed: int, start: int) -> list[LabelledExample]:
    """Examples whose impressions name the version that served them (by user, as the A/B router
    splits) and its score: version 2 ranks well, version 1 is noise."""
    rng = np.random.default_rng(seed)
    out = []
    for ex in synthetic_examples(n, seed=seed, start_index=start):
        version = "1" if arm_of(ex.impression.user_id, 0.3) == "challenger" else "2"
        logit = -2.0 + (2.0 * ex.label if version == "2" else 0.0) + rng.normal(0, 1)
        score = round(float(1 / (1 + np.exp(-logit))), 6)
        imp = msgspec.structs.replace(ex.impression, model_version=version, score=score)
        out.append(msgspec.structs.replace(ex, impression=imp))
    return out


def test_the_trainer_daemon_publishes_each_versions_readout(
    services: dict[str, str],
    kafka_topic: Callable[..., str],
    mlflow_scope,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
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
        "CTR_TRAINER_DEVICE": "cpu",
        "CTR_TRAINER_THREADS": "1",
        "CTR_TRAINER_GATE_TOLERANCE": "1.0",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }

    def produce(batch: list[LabelledExample]) -> None:
        producer = KafkaProducer(bootstrap_servers=services["CTR_KAFKA_BOOTSTRAP_SERVERS"])
        for ex in batch:
            producer.send(examples, key=ex.impression.user_id.encode(), value=ex.to_json())
        producer.flush()
        producer.close()

    def trainer() -> None:
        cmd = [sys.executable, "-m", "pipeline.ops.cli", "trainer", "--exit-when-idle", "5"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-4000:]

    first, second = served(2 * BLOCK, seed=21, start=0), served(BLOCK, seed=22, start=2 * BLOCK)
    produce(first)
    trainer()  # blocks 1 and 2: versions 1 and 2
    produce(first[:500] + second)  # a joiner replay of 500 examples (dropped as duplicates), then block 3
    trainer()  # a restart: the readout continues from the checkpoint
    store = ModelRegistry(
        RegistryConfig(model_name=mlflow_scope.model_name), env["CTR_REGISTRY_TRACKING_URI"]
    )
    assert store.resolve("champion") == "3"
    store.set_alias("champion", "2")  # the versions that served: 2 the champion, 1 the challenger
    store.set_alias("challenger", "1")

    expected = ABReadout()
    for ex in first + second:
        expected.add(ex.impression.model_version, ex.label, ex.impression.score)
    want = expected.summary()
    for key in ("CTR_REGISTRY_TRACKING_URI", "CTR_REGISTRY_MODEL_NAME"):
        monkeypatch.setenv(key, env[key])
    assert ctr_main(["ab", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    got = {a["version"]: a["readout"] for a in d["arms"]}
    assert set(got) == {"1", "2"}
    for version in ("1", "2"):
        assert got[version]["examples"] == want[version]["examples"]  # each example once
        assert got[version]["clicks"] == want[version]["clicks"]
        for key, value in want[version].items():
            assert got[version][key] == pytest.approx(value, rel=1e-9, nan_ok=True), (version, key)
    assert d["challenger_vs_champion"]["verdict"]["auc"] == "champion better"
    run_id = store.client.get_model_version(store.name, "2").run_id
    history = store.client.get_metric_history(run_id, "ab_examples")
    assert [m.step for m in history] == [2, 3]  # block 2 (its registration) and block 3 (after the restart)
