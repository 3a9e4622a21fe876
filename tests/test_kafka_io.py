"""Kafka adapters without a broker: client settings, snapshots, the rate limiter, the offset book
that handles rebalances and checkpoint seeks, and example decoding. tests/integration/test_kafka_io.py
runs the same adapters against the real broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from pipeline.core.config import ConfigError, KafkaConfig
from pipeline.core.config_loader import load_config
from pipeline.core.events import DeadLetter, Impression, LabelledExample
from pipeline.kafka.io import RateLimiter, kafka_client_kwargs, parse_snapshot
from pipeline.kafka.offsets import OffsetBook
from pipeline.kafka.sources import decode_example

P0, P1 = TopicPartition("clicks", 0), TopicPartition("clicks", 1)


def test_plaintext_kwargs() -> None:
    kw = kafka_client_kwargs(KafkaConfig(bootstrap_servers=" a:1 ,b:2,", connect_timeout_ms=1_500))
    assert kw["bootstrap_servers"] == ["a:1", "b:2"]
    assert kw["security_protocol"] == "PLAINTEXT" and kw["bootstrap_timeout_ms"] == 1_500
    assert not any(k.startswith(("sasl", "ssl")) for k in kw)


def test_sasl_ssl_kwargs() -> None:
    cfg = KafkaConfig(
        security_protocol="sasl_ssl",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="ctr",
        sasl_password="s3cret",
        ssl_cafile="/etc/ca.pem",
    )
    kw = kafka_client_kwargs(cfg)
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kw["sasl_plain_username"], kw["sasl_plain_password"], kw["ssl_cafile"]) == (
        "ctr",
        "s3cret",
        "/etc/ca.pem",
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"bootstrap_servers": " , "}, "bootstrap_servers is empty"),
        ({"security_protocol": "TLS"}, "security_protocol"),  # refused by KafkaConfig itself now
        ({"security_protocol": "SASL_SSL", "sasl_username": "u", "sasl_password": "p"}, "sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"}, "sasl_password"),
        ({"sasl_mechanism": "PLAIN"}, "needs security_protocol SASL_SSL"),
        ({"ssl_cafile": "/ca.pem"}, "ssl_cafile is set but security_protocol is PLAINTEXT"),
    ],
)
def test_bad_security_settings_fail_loudly(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kafka_client_kwargs(KafkaConfig(**fields))  # type: ignore[arg-type]


def test_kafka_config_password_is_an_env_only_secret(tmp_path: Path) -> None:
    cfg = load_config(env={"CTR_KAFKA_SASL_PASSWORD": "pw", "CTR_KAFKA_PARTITIONS": "6"})
    assert cfg.kafka.sasl_password.get_secret_value() == "pw" and cfg.kafka.partitions == 6
    assert "pw" not in repr(cfg) and "sasl_password" not in cfg.to_dict()["kafka"]
    f = tmp_path / "ctr.toml"
    f.write_text("[kafka]\nsasl_password = 'pw'\n")
    with pytest.raises(ConfigError, match="CTR_KAFKA_SASL_PASSWORD"):
        load_config(f, env={})


def test_snapshot_keys_round_trip() -> None:
    assert parse_snapshot({"imp-x.y_z:0": 5, "clicks:12": 0}) == {
        TopicPartition("imp-x.y_z", 0): 5,
        TopicPartition("clicks", 12): 0,
    }


@pytest.mark.parametrize(
    "entry", [{"clicks": 1}, {":1": 1}, {"clicks:x": 1}, {"clicks:1": -1}, {"clicks:1": "7"}]
)
def test_bad_snapshot_entries_are_rejected(entry: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="not 'topic:partition'"):
        parse_snapshot(entry)


class FakeTime:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s


def test_rate_limiter_holds_the_rate() -> None:
    t = FakeTime()
    limiter = RateLimiter(1_000, burst=10, clock=t.clock, sleep=t.sleep)
    for _ in range(5_000):
        limiter.acquire()
    # the first `burst` events are free, the rest come at 1 per ms
    assert t.now == pytest.approx((5_000 - 10) / 1_000, rel=1e-6)


def test_rate_limiter_carries_small_debts_and_caps_bursts() -> None:
    t = FakeTime()
    limiter = RateLimiter(100_000, burst=1, min_sleep_s=0.001, clock=t.clock, sleep=t.sleep)
    for _ in range(101):  # 10 µs each after the 1 free token: carried until the debt is 1 ms
        limiter.acquire()
    assert t.slept == pytest.approx(0.001, rel=1e-6)
    t.now += 60.0  # a minute idle refills at most `burst` tokens
    limiter.acquire(2)
    assert limiter._tokens == pytest.approx(-1)
    with pytest.raises(ValueError, match="rate must be > 0"):
        RateLimiter(0)


def test_offset_book_applies_checkpoint_seeks_on_assignment() -> None:
    book = OffsetBook()
    assert book.seek({P0: 40, P1: 7}) == {}  # nothing owned yet: wait for the assignment
    assert book.assigned({P0}) == {P0: 40}
    assert book.positions == {P0: 40} and not book.take_disrupted()
    assert book.seek({P0: 45}) == {P0: 45}  # owned: seek at once
    assert book.assigned({P0, P1}) == {P1: 7}  # P1's checkpoint offset still waited for it


def test_rebalance_after_uncommitted_records_rewinds_what_is_kept() -> None:
    book = OffsetBook()
    book.assigned({P0, P1})
    book.yielded(P0, 100, 149)
    book.yielded(P1, 0, 9)
    book.committed({P0: 120})
    book.yielded(P0, 150, 199)
    assert book.assigned({P0}) == {P0: 120}  # P1 moved away; P0 replays from its last commit
    assert book.positions == {P0: 120} and book.restart == {P0: 120}
    assert book.take_disrupted() and not book.take_disrupted()


def test_rebalance_after_everything_was_committed_changes_nothing() -> None:
    book = OffsetBook()
    book.assigned({P0, P1})
    book.yielded(P0, 0, 49)
    book.committed({P0: 50})
    assert book.assigned({P0}) == {}
    assert book.positions == {P0: 50} and not book.take_disrupted()


def _record(value: bytes | None, offset: int = 3) -> ConsumerRecord:
    return ConsumerRecord("examples", 1, 0, offset, 0, 0, None, value, [], None, 0, 0, 0)


def _example(label: object = 1) -> bytes:
    imp = Impression("imp-1", 1_700_000_000_000, "u_1", "ad-1", {"slot": "0"}, {"bid_floor": 0.5})
    return LabelledExample(imp, label, 1_700_000_060_000, {"user_ctr_1h": 0.1}).to_json()  # type: ignore[arg-type]


def test_decode_example_round_trips() -> None:
    ex = decode_example(_record(_example()))
    assert isinstance(ex, LabelledExample)
    assert ex.example_id == "imp-1" and ex.label == 1 and ex.stream_features == {"user_ctr_1h": 0.1}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", "bad_json"),
        (b'{"a": "\xc3\x28"}', "bad_encoding"),  # not UTF-8
        (b"[1, 2]", "bad_type"),
        (json.dumps({"label": 1}).encode(), "missing_field"),
        (_example(label=2), "bad_value"),
        (_example(label=True), "bad_value"),
        (_example().replace(b'"label_ts":1700000060000', b'"label_ts":"soon"'), "bad_type"),
        (None, "bad_json"),
    ],
)
def test_malformed_examples_become_dead_letters(value: bytes | None, reason: str) -> None:
    dead = decode_example(_record(value, offset=17))
    assert isinstance(dead, DeadLetter), dead
    assert (dead.reason, dead.source, dead.partition, dead.offset) == (reason, "examples", 1, 17)
    assert dead.raw == (value or b"")[:1024]
