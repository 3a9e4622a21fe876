"""10,000 malformed and hostile events through the real topics: every one ends where the rules say.

The corpus (tests/hostile.py) is published to real Kafka topics between a valid stream; one
``ctr joiner`` process reads it. It must not crash; every event validation refuses is on the
dead-letter topic with its reason (counted per reason, exactly) and no raw user id; a click from
the wrong user is a ``user_mismatch`` dead letter; repeats are dropped and counted; clicks for
impressions that never come are held, then become ``orphan_click`` dead letters; and the
examples are exactly the valid impressions whose window closed, untouched by the garbage around them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from pipeline.core.config import Config, KafkaConfig
from pipeline.daemons.joiner_state import committed_states, state_topic
from pipeline.kafka.io import ensure_topics
from pipeline.kafka.read import examples_to_end
from tests.hostile import RAW_DEVICE, RAW_IP, corpus

pytestmark = pytest.mark.faults

WINDOW_MS, LAG_MS, HOLD_MS = 900_000, 60_000, 900_000
JOINER_RULES = {"duplicate_impression", "duplicate_click", "unknown_impression"}
USER_FIELD = re.compile(r'"user_id"\s*:\s*"([^"]*)')


def read_topic(bootstrap: str, topic: str) -> list[bytes]:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10_000
    )
    try:
        return [m.value for m in consumer]
    finally:
        consumer.close()


def test_hostile_corpus_through_kafka_ends_as_dead_letters_or_documented_rules(
    services: dict[str, str], kafka_admin: object, tmp_path: Path, fault_report: Callable[..., None]
) -> None:
    tag = uuid.uuid4().hex[:10]
    bootstrap = services["CTR_KAFKA_BOOTSTRAP_SERVERS"]
    k = KafkaConfig(
        bootstrap_servers=bootstrap,
        impressions_topic=f"hostile-imps-{tag}",
        clicks_topic=f"hostile-clicks-{tag}",
        examples_topic=f"hostile-examples-{tag}",
        dead_letter_topic=f"hostile-dead-{tag}",
        partitions=1,
        group_id_prefix=f"hostile-{tag}",
    )
    ensure_topics(k, [k.impressions_topic, k.clicks_topic], 1)
    now = int(time.time() * 1000)
    c = corpus(now, now - 45 * 60_000)
    assert c.hostile >= 10_000
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=1_048_576, linger_ms=20)
    topic = {"impression": k.impressions_topic, "click": k.clicks_topic}
    for kind, key, value in c.events:
        producer.send(topic[kind], key=key, value=value)
    producer.flush()
    producer.close()

    env = {
        **os.environ,
        "CTR_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "CTR_KAFKA_IMPRESSIONS_TOPIC": k.impressions_topic,
        "CTR_KAFKA_CLICKS_TOPIC": k.clicks_topic,
        "CTR_KAFKA_EXAMPLES_TOPIC": k.examples_topic,
        "CTR_KAFKA_DEAD_LETTER_TOPIC": k.dead_letter_topic,
        "CTR_KAFKA_PARTITIONS": "1",
        "CTR_KAFKA_GROUP_ID_PREFIX": k.group_id_prefix,
        "CTR_DAEMON_STATE_DIR": str(tmp_path / "state"),
        "CTR_DAEMON_REDIS_URL": services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15",
        "CTR_FEATURES_PROJECT": f"hostile_{tag}",
    }
    log = tmp_path / "joiner.log"
    with log.open("wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.ops.cli", "joiner", "--exit-when-idle", "8"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=out,
            timeout=600,
        )
    assert proc.returncode == 0, log.read_text()[-3000:]  # zero crashes
    counters = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    examples = [json.loads(v) for v in examples_to_end(bootstrap, k.examples_topic)]
    ids = [e["impression"]["impression_id"] for e in examples]
    lost, repeated = len(c.events) - counters["events"], len(ids) - len(set(ids))
    fault_report(f"hostile events through Kafka ({c.hostile:,})", 1, 1, lost, repeated, "dead letter or rule")
    assert counters["events"] == len(c.events)  # every message read once

    # dead letters: exactly one per refused event, with the reason the corpus says
    letters = [json.loads(v) for v in read_topic(bootstrap, k.dead_letter_topic)]
    by_reason = Counter(d["reason"] for d in letters)
    watermark = c.accepted_ts_max - LAG_MS
    orphans = sum(ts + HOLD_MS < watermark for ts in c.unknown_clicks)  # their hold ended: dead letters
    expected = {fate: n for fate, n in c.fates.items() if fate not in JOINER_RULES}
    assert dict(by_reason) == {**expected, **({"orphan_click": orphans} if orphans else {})}
    assert counters["dead_letters"] == len(letters)
    assert all(d["detail"] and d["source"] in {*topic.values(), "joiner"} for d in letters)
    # privacy: the dead-letter topic holds pseudonyms only, never a raw user id
    raw_users = [u for d in letters for u in USER_FIELD.findall(d["raw"])]
    assert raw_users and all(u.startswith("u_") for u in raw_users), raw_users[:5]
    assert not [d for d in letters if RAW_IP in d["raw"] or RAW_DEVICE in d["raw"]]  # nor a device id or IP
    assert sum('"device_ip":"d_' in d["raw"] for d in letters) > 100  # pseudonymized, not dropped

    # the documented joiner rules, from the counters of its committed state
    cfg = Config()
    cfg.kafka = k
    stats = committed_states(cfg)[0]["joiner"]["stats"]
    assert stats["duplicate_impressions"] == c.fates["duplicate_impression"]
    assert stats["duplicate_clicks"] == c.fates["duplicate_click"]
    assert stats["early_clicks"] == len(c.unknown_clicks) == c.fates["unknown_impression"]
    assert stats["orphan_clicks"] == orphans

    # the examples: exactly the valid impressions whose window closed, untouched by the garbage
    closed = {i for i, ts in c.valid_impressions.items() if ts + WINDOW_MS < watermark}
    assert len(ids) == len(set(ids)) and set(ids) == closed
    positives = {e["impression"]["impression_id"] for e in examples if e["label"] == 1}
    assert positives == {i for i in closed if int(i.removeprefix("imp")) % 10 == 0}
    kafka_admin.delete_topics(  # type: ignore[attr-defined]
        [k.impressions_topic, k.clicks_topic, k.examples_topic, k.dead_letter_topic, state_topic(cfg)]
    )
