"""One engine: a stream through `ctr backtest` and through the daemons over real Kafka, Redis and
MLflow gives byte-identical examples (stream features included), the same blocks, the same
block metrics and the same item rows for serving.

The stream is the simulator's (its arrival order has duplicates, clicks before their impression
and clicks past the window), with clicks produced keyed by something else than their user (so on
another partition: ``kafka_key`` in the JSONL), clicks that were never for any impression (orphans) and one
closing impression per partition two hours later, so every real window closes in both runs (the
daemons never flush open windows; a backtest does at its end). The JSONL file is backtested, and
the same file goes to Kafka with `ctr produce --source`, where `ctr joiner` and `ctr trainer` run
until idle. Only full blocks are compared: a backtest also scores its last, partial block.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import mlflow
import pytest
import redis

from features.item_stage import ItemStage
from features.store import OnlineFeatureReader, connect_store
from pipeline.core.config import Config, KafkaConfig
from pipeline.core.events import LabelledExample
from pipeline.core.partitioning import partition_of
from pipeline.kafka.io import ensure_topics
from pipeline.kafka.read import examples_to_end, read_to_end
from pipeline.sources.jsonl_mapping import write_jsonl
from pipeline.sources.simulator import Simulator
from serving_bridge.online_offset import offset_key
from trainers.version_page import iso_time

PARTITIONS, IMPRESSIONS, BLOCK = 3, 9_000, 2_000
HOUR_MS = 3_600_000


def write_stream(path: Path, conversions: bool = False) -> int:
    # 5 impressions/s: 30 min of event time, so the item stage (counting what came before the
    # impression minus the attribution window and lag, 16 min) has something to count
    sim = dataclasses.replace(Config().simulator, events_per_s=5.0)
    if conversions:  # a fifth of the clicks convert, within minutes: corrections inside the stream
        sim = dataclasses.replace(sim, conversion_rate=0.2, conversion_delay_median_s=120.0)
    events = list(Simulator(sim, seed=21).stream(IMPRESSIONS))
    last = max(e["ts"] for _, e in events)
    clicks = [e for kind, e in events if kind == "click"]
    for n, click in enumerate(clicks[:: len(clicks) // 30][:30]):  # produced keyed by something else
        user = click["user_id"]
        key = next(
            f"k{n}-{i}"
            for i in range(100)
            if partition_of(f"k{n}-{i}", PARTITIONS) != partition_of(user, PARTITIONS)
        )
        events.append(("click", {**click, "click_id": f"wrong-{n}", "kafka_key": key}))
    for n in range(40):  # clicks for impressions that never come: orphan_click dead letters
        user = events[n * 50][1]["user_id"]
        events.append(
            ("click", {"click_id": f"ghost-c{n}", "impression_id": f"ghost{n}", "ts": last, "user_id": user})
        )
    for p in range(PARTITIONS):  # a closing impression per partition, 2 h later: every window closes
        user = next(f"closer{i}" for i in range(1_000) if partition_of(f"closer{i}", PARTITIONS) == p)
        imp = {"impression_id": f"closing-{p}", "ts": last + 2 * HOUR_MS, "user_id": user, "item_id": "x"}
        events.append(("impression", imp))
    return write_jsonl(events, path)


class Command:
    """One ``ctr`` command in its own process, stderr to ``log``; :meth:`output` waits for it.

    Commands that do not read each other's output run side by side (the backtest beside the
    daemons, the trainer on one rank beside the one on two): most of each is start-up and waiting."""

    started: ClassVar[list[Command]] = []  # killed after each test if still running (a failed assertion)

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.ops.cli", *args], env=env, stdout=subprocess.PIPE, stderr=err
            )
        Command.started.append(self)

    def output(self, timeout: float = 900) -> str:
        """Its stdout, once it exited 0 (its log's tail otherwise)."""
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, self.log.read_text()[-3000:]
        return out.decode()


def run(args: list[str], env: dict[str, str], log: Path) -> str:
    return Command(args, env, log).output()


@pytest.fixture(autouse=True)
def no_command_left() -> Iterator[None]:
    yield
    for command in Command.started:
        if command.proc.poll() is None:
            command.proc.kill()
            command.proc.communicate()
    Command.started.clear()


def example_id(line: str | bytes) -> str:
    ex = json.loads(line)
    return ex["impression"]["impression_id"] + ("#cv" if ex.get("correction") else "")


# din: the behaviour sequences too (in the examples' stream features, the joiner's changelog and its
# Feast rows), and a model that attends over them; esmm: conversions on their own topic, joined
# (corrections among the examples, held in the joiner's changelog), and a model that learns them;
# each on one rank and on two
@pytest.mark.parametrize("model", ["deepfm", "din", "esmm"])
def test_backtest_and_daemons_give_the_same_examples_blocks_and_metrics(
    model: str, services: dict[str, str], kafka_admin: object, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:10]
    stream = tmp_path / "stream.jsonl"
    write_stream(stream, conversions=model == "esmm")
    k = KafkaConfig(
        bootstrap_servers=services["CTR_KAFKA_BOOTSTRAP_SERVERS"],
        impressions_topic=f"parity-imps-{tag}",
        clicks_topic=f"parity-clicks-{tag}",
        conversions_topic=f"parity-conversions-{tag}",
        examples_topic=f"parity-examples-{tag}",
        dead_letter_topic=f"parity-dead-{tag}",
        partitions=PARTITIONS,
    )
    ensure_topics(k, [k.impressions_topic, k.clicks_topic, k.conversions_topic, k.examples_topic], PARTITIONS)
    env = {
        **os.environ,
        "CTR_KAFKA_BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "CTR_KAFKA_IMPRESSIONS_TOPIC": k.impressions_topic,
        "CTR_KAFKA_CLICKS_TOPIC": k.clicks_topic,
        "CTR_KAFKA_CONVERSIONS_TOPIC": k.conversions_topic,
        "CTR_JOINER_CONVERSION_WINDOW_S": "1800" if model == "esmm" else "0",
        # labels final 3 min after their impression (window + watermark lag), in blocks of 400 s:
        # the online offset is refitted within each block, so the metrics compare it too
        "CTR_JOINER_ATTRIBUTION_WINDOW_S": "120",
        "CTR_TRAINER_ONLINE_OFFSET_EVERY": "250",
        "CTR_KAFKA_EXAMPLES_TOPIC": k.examples_topic,
        "CTR_KAFKA_DEAD_LETTER_TOPIC": k.dead_letter_topic,
        "CTR_KAFKA_PARTITIONS": str(PARTITIONS),
        "CTR_KAFKA_GROUP_ID_PREFIX": f"parity-{tag}",
        "CTR_DAEMON_STATE_DIR": str(tmp_path / "state"),
        "CTR_DAEMON_REDIS_URL": services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15",
        "CTR_FEATURES_PROJECT": f"parity_{tag}",
        "CTR_REGISTRY_TRACKING_URI": services["CTR_REGISTRY_TRACKING_URI"],
        "CTR_REGISTRY_MODEL_NAME": f"parity-model-{tag}",
        "CTR_REGISTRY_EXPERIMENT": f"parity-exp-{tag}",
        "CTR_TRAINER_TRAIN_EVERY": str(BLOCK),
        # steps of batch_size, as the daemons' 100k-row blocks are learned: trainer.min_steps would
        # learn these 2k-row blocks in 32 steps of 57 rows, over which the two-rank run's float
        # rounding (sums in another order) grows to ~3e-4 of AUC, past the tolerance below
        "CTR_TRAINER_MIN_STEPS": "0",
        "CTR_TRAINER_HASH_BUCKETS": str(1 << 16),
        "CTR_TRAINER_THREADS": "1",
        "CTR_TRAINER_SEED": "7",
        "CTR_TRAINER_MODEL": model,
        "CTR_FEATURES_SEQUENCE_LENGTH": "20" if model == "din" else "0",
        "CTR_TRAINER_SEQUENCE_LENGTH": "10",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    # the backtest, on the embedded profile (its own local registry)
    backtest_env = {n: v for n, v in env.items() if n != "CTR_REGISTRY_TRACKING_URI"}
    out = tmp_path / "backtest"
    backtest = Command(
        ["backtest", "--source", str(stream), "--out", str(out), "--examples-out", str(out / "ex.jsonl")],
        backtest_env,
        tmp_path / "bt.log",
    )

    # the daemons, over Kafka, Redis and the MLflow server
    run(["produce", "--source", str(stream)], env, tmp_path / "produce.log")
    # each starts with all of its input on Kafka: it exits once its group read everything (and the
    # joiner holds no event in a task's merge), so a short idle costs nothing in exactness
    run(["joiner", "--exit-when-idle", "2"], env, tmp_path / "joiner.log")
    # The trainer on two ranks too (trainer.ranks: torchrun, each rank half of every table's rows)
    # from the same examples, beside the one on one rank: compared below.
    ranked = env | {
        "CTR_TRAINER_RANKS": "2",
        "CTR_KAFKA_GROUP_ID_PREFIX": f"parity-ranks-{tag}",
        "CTR_DAEMON_STATE_DIR": str(tmp_path / "state-ranks"),
        "CTR_REGISTRY_MODEL_NAME": f"parity-model-ranks-{tag}",
    }
    on_two_ranks = Command(["trainer", "--exit-when-idle", "3"], ranked, tmp_path / "trainer-ranks.log")
    trained = json.loads(
        run(["trainer", "--exit-when-idle", "3"], env, tmp_path / "trainer.log").splitlines()[-1]
    )
    backtest.output()
    replayed = {example_id(line): line.encode() for line in (out / "ex.jsonl").read_text().splitlines()}
    with (out / "metrics.csv").open() as f:  # a block: BLOCK click examples and their corrections
        backtest_blocks = [
            row for row in csv.DictReader(f) if int(row["examples"]) - int(row.get("corrections", 0)) == BLOCK
        ]

    messages = examples_to_end(k.bootstrap_servers, k.examples_topic)
    produced = {example_id(m): m for m in messages}

    closing = {f"closing-{p}" for p in range(PARTITIONS)}
    assert len(produced) == len(messages) > 8_000  # no example twice
    assert produced == {i: v for i, v in replayed.items() if i not in closing}  # byte-identical
    sequences = [json.loads(v)["stream_features"].get("user_clicked_items") for v in produced.values()]
    assert (max(map(len, sequences)) > 1) if model == "din" else sequences == [None] * len(sequences)
    corrections = [json.loads(v)["conversion"] for i, v in produced.items() if i.endswith("#cv")]
    assert (len(corrections) > 300 and 0 < sum(corrections) < len(corrections)) == (model == "esmm")
    clicks = len(produced) - len(corrections)
    assert trained["blocks"] == len(backtest_blocks) == clicks // BLOCK >= 4
    # the item rows the trainer pushed for serving are the item stage's over the same examples in the
    # merge order (the backtest's examples file is in that order; its closing examples aside)
    item_cfg = Config()
    item_cfg.joiner.conversion_window_s = float(env["CTR_JOINER_CONVERSION_WINDOW_S"])
    item_cfg.joiner.attribution_window_s = float(env["CTR_JOINER_ATTRIBUTION_WINDOW_S"])
    stage = ItemStage.of(item_cfg)
    stage.attach([LabelledExample.from_json(v) for i, v in replayed.items() if i not in closing])
    want = {row["item_id"]: row for row in stage.drain_rows()}
    served = OnlineFeatureReader(connect_store(tmp_path / "state" / "trainer" / "feast")).get("-", [*want])
    names = [n for n in served[0] if n.startswith("item_")]
    assert len(want) > 100 and [[f[n] for n in names] for f in served] == [
        [want[i][n] for n in names] for i in want
    ]
    # the same dead letters, by reason (orphan clicks included)
    letters = Counter(
        json.loads(r.value)["reason"] for r in read_to_end(k.bootstrap_servers, k.dead_letter_topic)
    )
    with (out / "dead_letters.jsonl").open() as f:
        assert letters == Counter(json.loads(line)["reason"] for line in f)
    assert letters["orphan_click"] == 40 and letters["wrong_partition"] == 30
    uri = services["CTR_REGISTRY_TRACKING_URI"]  # the registry too: an earlier test may have set a global one
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    versions = {int(v.tags["block"]): v for v in client.search_model_versions(f"name = 'parity-model-{tag}'")}
    compared = 0
    for row in backtest_blocks:
        block = int(row["block"])
        if row["gate_accepted"] != "1":
            assert block not in versions
            continue
        compared += 1
        tags = versions[block].tags
        assert int(tags["examples"]) == int(row["examples"])
        assert (tags["event_time_min"], tags["event_time_max"]) == (  # ISO 8601 in tags, epoch ms in rows
            iso_time(int(row["event_time_min"]) / 1000),
            iso_time(int(row["event_time_max"]) / 1000),
        )
        assert float(tags["metric.online.auc"]) == pytest.approx(float(row["online_auc"]), abs=1e-9)
        assert float(tags["metric.online.logloss"]) == pytest.approx(float(row["online_logloss"]), abs=1e-9)
    assert compared >= 2 and compared == len(versions)
    # what the trainer served the champion with (its online offset) reached Redis for the replicas
    champion = client.get_model_version_by_alias(f"parity-model-{tag}", "champion").version
    board = redis.Redis.from_url(env["CTR_DAEMON_REDIS_URL"])
    offsets = board.hgetall(offset_key(env["CTR_FEATURES_PROJECT"], f"parity-model-{tag}"))
    assert list(offsets) == [champion.encode()] and math.isfinite(float(offsets[champion.encode()]))
    # and its mixture with the click rate beside it: [log odds, clicks, rows behind the rate]
    blends = board.hgetall(offset_key(env["CTR_FEATURES_PROJECT"], f"parity-model-{tag}") + ":blend")
    assert list(blends) == [champion.encode()]
    log_odds, clicks, rows = json.loads(blends[champion.encode()])
    assert abs(log_odds) <= 10.0 and 0 < clicks < rows

    # The trainer on two ranks: the same blocks, one version per accepted block, the same metrics
    # but for float rounding (an AUC moves by 1 / (positives x negatives) when two scores 1e-8 apart swap).
    out2 = on_two_ranks.output()
    assert json.loads(out2.splitlines()[-1])["blocks"] == trained["blocks"]
    ranked_versions = {
        int(v.tags["block"]): v.tags
        for v in client.search_model_versions(f"name = 'parity-model-ranks-{tag}'")
    }
    assert ranked_versions.keys() == versions.keys()  # accepted the same blocks, registered each once
    for block, tags in ranked_versions.items():
        one = versions[block].tags
        # the same parent (numbered alike in its own registered model) and Kafka offsets
        assert (tags["lineage_key"], tags["position"]) == (one["lineage_key"], one["position"])
        assert float(tags["metric.online.auc"]) == pytest.approx(float(one["metric.online.auc"]), abs=1e-4)
        assert float(tags["metric.online.logloss"]) == pytest.approx(
            float(one["metric.online.logloss"]), abs=1e-6
        )
    kafka_admin.delete_topics(  # type: ignore[attr-defined]
        [k.impressions_topic, k.clicks_topic, k.conversions_topic, k.examples_topic, k.dead_letter_topic]
    )
