"""The real services answer the way the production profile uses them (`make services-up` starts them).

Kafka: acks=all produce of 10k messages to a 3-partition topic, consumed back in a consumer group
with manual commits; Kafka's own CLI (deploy/kafka/bin/*.sh: topics, console producer and consumer,
consumer groups) against the same broker. Redis: set/get. MLflow tracking server: experiment,
metric, model version uploaded through the artifact proxy, alias set and resolved, UI answering for
Host: localhost.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

N_MESSAGES = 10_000
PARTITIONS = 3
KAFKA_BIN = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "bin"


def test_kafka_produce_consume_manual_commit(kafka_bootstrap, kafka_topic, kafka_group, kafka_admin):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = kafka_topic(partitions=PARTITIONS)

    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5, retries=5)
    try:
        futures = [
            producer.send(
                topic,
                key=f"user-{i % 97}".encode(),
                value=json.dumps({"i": i, "user_id": f"user-{i % 97}"}).encode(),
            )
            for i in range(N_MESSAGES)
        ]
        producer.flush(timeout=60)
        metas = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)
    assert {m.partition for m in metas} == set(range(PARTITIONS)), "keys should spread over all partitions"

    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=kafka_group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=1000,
    )
    seen: list[int] = []
    per_partition_keys: dict[int, set[bytes]] = {p: set() for p in range(PARTITIONS)}
    try:
        deadline = time.monotonic() + 120
        while len(seen) < N_MESSAGES and time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=1000)
            for tp, records in batch.items():
                for r in records:
                    seen.append(json.loads(r.value)["i"])
                    per_partition_keys[tp.partition].add(r.key)
            if batch:
                consumer.commit()  # synchronous: offsets are durable before we go on
        end = consumer.end_offsets(tps)
        committed = {tp: consumer.committed(tp) for tp in tps}
    finally:
        consumer.close()

    assert len(seen) == N_MESSAGES, f"consumed {len(seen)} of {N_MESSAGES}"
    assert sorted(seen) == list(range(N_MESSAGES)), "every message exactly once"
    assert sum(end.values()) == N_MESSAGES
    assert committed == end, f"committed {committed} != end offsets {end}"
    # a key lives in exactly one partition (ordering per user holds)
    for p, keys in per_partition_keys.items():
        for q, other in per_partition_keys.items():
            if p < q:
                assert not keys & other
    # the group's offsets as the broker stores them (what a restarted daemon resumes from)
    stored = kafka_admin.list_group_offsets(kafka_group)[kafka_group]
    assert {tp: om.offset for tp, om in stored.items()} == end


def test_kafka_auto_topic_creation_is_off(kafka_bootstrap, kafka_admin):
    """Daemons create their topics explicitly; a typo must not silently create a new topic."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    name = f"it-should-not-exist-{time.time_ns()}"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_block_ms=3000)
    try:
        with pytest.raises(KafkaTimeoutError):
            producer.send(name, b"x").get(timeout=5)
    finally:
        producer.close(timeout=5)
    assert name not in kafka_admin.list_topics()


def kafka_cli(tool: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run deploy/kafka/bin/<tool>.sh (Kafka's own CLI, from Maven Central); fail with its stderr."""
    done = subprocess.run(
        [str(KAFKA_BIN / f"{tool}.sh"), *args], input=stdin, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"{tool} {' '.join(args)}: rc {done.returncode}\n{done.stderr[-3000:]}"
    return done


def test_kafka_cli_lists_and_describes_topics(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=2)
    listed = kafka_cli("kafka-topics", "--bootstrap-server", kafka_bootstrap, "--list").stdout
    assert topic in listed.splitlines(), listed
    described = kafka_cli(
        "kafka-topics", "--bootstrap-server", kafka_bootstrap, "--describe", "--topic", topic
    )
    assert re.search(rf"Topic: {re.escape(topic)}\s.*PartitionCount: 2\s", described.stdout), described.stdout
    # kafka-configs: a topic created with no settings deletes nothing by time (log.retention.ms=-1 in
    # deploy/kafka/server.properties: replays produce with event time as the record timestamp)
    configs = kafka_cli(
        "kafka-configs", "--bootstrap-server", kafka_bootstrap, "--describe", "--all",
        "--entity-type", "topics", "--entity-name", topic,
    ).stdout  # fmt: skip
    retention = re.search(r"^\s*retention\.ms=(\S+) ", configs, flags=re.M)
    assert retention, configs
    assert retention.group(1) == "-1", (
        f"retention.ms={retention.group(1)}: a broker started before deploy/kafka/server.properties set "
        "log.retention.ms=-1? Restart it: deploy/services.sh stop kafka && make services-up"
    )


def test_kafka_cli_console_round_trip_and_group_lag(kafka_bootstrap, kafka_topic, kafka_group, kafka_admin):
    """kafka-console-producer -> kafka-console-consumer in a group -> kafka-consumer-groups: lag 0."""
    topic = kafka_topic(partitions=2)
    lines = [f"user-{i % 7}:{json.dumps({'i': i})}" for i in range(50)]
    produced = kafka_cli(
        "kafka-console-producer", "--bootstrap-server", kafka_bootstrap, "--topic", topic,
        "--property", "parse.key=true", "--property", "key.separator=:",
        stdin="\n".join(lines) + "\n",
    )  # fmt: skip
    assert produced.stdout.strip(" >\n") == "", produced.stdout  # no prompt noise, no errors
    consumed = kafka_cli(
        "kafka-console-consumer", "--bootstrap-server", kafka_bootstrap, "--topic", topic,
        "--group", kafka_group, "--from-beginning", "--max-messages", str(len(lines)),
        "--timeout-ms", "60000", "--property", "print.key=true", "--property", "key.separator=:",
    )  # fmt: skip
    assert sorted(consumed.stdout.splitlines()) == sorted(lines)  # stdout is the records only
    assert "Processed a total of 50 messages" in consumed.stderr
    # the same offsets through kafka-python: the CLI talked to the broker the tests use
    stored = kafka_admin.list_group_offsets(kafka_group)[kafka_group]
    assert sum(om.offset for om in stored.values()) == len(lines)

    described = kafka_cli(
        "kafka-consumer-groups", "--bootstrap-server", kafka_bootstrap, "--describe", "--group", kafka_group
    ).stdout
    rows = [r.split() for r in described.splitlines() if r.startswith(kafka_group + " ")]
    assert sorted(int(r[2]) for r in rows) == [0, 1], described  # one row per partition
    assert all(r[1] == topic and r[3] == r[4] and r[5] == "0" for r in rows), described  # LAG 0


def test_redis_set_get(redis_ns):
    r = redis_ns.client
    assert r.ping()
    k = redis_ns.key("user:42")
    r.hset(k, mapping={"clicks_1h": "3", "impressions_1h": "17"})
    r.set(redis_ns.key("plain"), "v1", ex=60)
    assert r.hgetall(k) == {"clicks_1h": "3", "impressions_1h": "17"}
    assert r.get(redis_ns.key("plain")) == "v1"
    assert 0 < r.ttl(redis_ns.key("plain")) <= 60


class _ConstantCTR:
    """A trivial pyfunc model (defined at module level so cloudpickle can find it)."""

    def __init__(self, p: float) -> None:
        self.p = p

    def predict(self, context, model_input, params=None):
        return [self.p] * len(model_input)


def test_mlflow_tracking_registry_alias(mlflow_scope):
    import mlflow
    import pandas as pd
    from mlflow import MlflowClient

    class ConstantCTR(_ConstantCTR, mlflow.pyfunc.PythonModel):
        pass

    client = MlflowClient(tracking_uri=mlflow_scope.uri, registry_uri=mlflow_scope.uri)
    exp_id = client.create_experiment(mlflow_scope.experiment_name)
    with mlflow.start_run(experiment_id=exp_id) as run:
        mlflow.log_metric("auc", 0.75, step=1)
        mlflow.log_param("events", 100_000)
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=ConstantCTR(0.031),
            pip_requirements=["mlflow"],  # no requirement inference (slow, not under test)
            registered_model_name=mlflow_scope.model_name,
        )
    # artifacts went through the server's proxy, not to a local path of this process
    assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri
    assert client.get_run(run.info.run_id).data.metrics["auc"] == pytest.approx(0.75)
    assert info.registered_model_version is not None

    version = str(info.registered_model_version)
    client.set_registered_model_alias(mlflow_scope.model_name, "champion", version)
    resolved = client.get_model_version_by_alias(mlflow_scope.model_name, "champion")
    assert resolved.version == version
    assert resolved.run_id == run.info.run_id

    model = mlflow.pyfunc.load_model(f"models:/{mlflow_scope.model_name}@champion")
    assert list(model.predict(pd.DataFrame({"x": [1, 2, 3]}))) == pytest.approx([0.031] * 3)


def _get(url: str, host: str) -> int:
    req = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_mlflow_ui_and_host_check(mlflow_uri):
    port = mlflow_uri.rsplit(":", 1)[1]
    assert _get(f"{mlflow_uri}/", "localhost") == 200
    assert _get(f"{mlflow_uri}/", f"localhost:{port}") == 200
    assert _get(f"{mlflow_uri}/health", "localhost") == 200
    # loopback only: a foreign Host header (DNS rebinding) is refused
    assert _get(f"{mlflow_uri}/", "evil.example.com") in (400, 403)
