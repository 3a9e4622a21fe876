"""Kafka client settings, topic creation and :class:`KafkaSink`, the idempotent producer.

Every client (admin, producer, consumer) is built from one :class:`~pipeline.core.config.KafkaConfig` by
:func:`kafka_client_kwargs`, so security settings live in one place. A broker that cannot be reached
fails within ``connect_timeout_ms`` with :class:`KafkaUnavailableError` naming the address, never a
hang. :mod:`pipeline.kafka.io` (the consuming side) re-exports everything here.

kafka-python's ``KafkaProducer.flush()`` returns normally when sends *failed* (errors only reach the
per-record futures); :class:`KafkaSink` collects them so its ``flush()`` raises, and a caller that
commits offsets only after a successful flush never commits past a lost record.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, TopicAlreadyExistsError
from kafka.partitioner import DefaultPartitioner

from pipeline.core.config import KafkaConfig
from pipeline.core.events import DeadLetter
from pipeline.core.partitioning import KeyHashes
from pipeline.kafka.compat import patch_join_in_flight

__all__ = [
    "FencedMemberError",
    "KafkaSink",
    "KafkaSinkError",
    "KafkaUnavailableError",
    "KeyHashPartitioner",
    "connect",
    "ensure_topics",
    "kafka_client_kwargs",
]

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")  # the user/password mechanisms
_C = TypeVar("_C")
log = logging.getLogger(__name__)
patch_join_in_flight()  # kafka-python 3.0.x loses a rejoin's assignment when a poll times out mid-join


class KafkaUnavailableError(ConnectionError):
    """No broker answered at the configured bootstrap address within ``connect_timeout_ms``."""


class FencedMemberError(RuntimeError):
    """Another process joined the consumer group with this daemon's ``group_instance_id``: this one
    must stop (it no longer owns its partitions, whatever the client believes)."""


class KafkaSinkError(RuntimeError):
    """Records sent to Kafka were not acknowledged; offsets covering them must not be committed."""


def kafka_client_kwargs(cfg: KafkaConfig) -> dict[str, Any]:
    """Keyword arguments every kafka-python client takes: brokers, timeouts, TLS and SASL.

    >>> kafka_client_kwargs(KafkaConfig(bootstrap_servers="a:9092, b:9092"))["bootstrap_servers"]
    ['a:9092', 'b:9092']
    """
    servers = [s.strip() for s in cfg.bootstrap_servers.split(",") if s.strip()]
    if not servers:
        raise ValueError("KafkaConfig.bootstrap_servers is empty; expected host:port[,host:port]")
    protocol = cfg.security_protocol.upper()
    if protocol not in _PROTOCOLS:
        raise ValueError(
            f"KafkaConfig.security_protocol={cfg.security_protocol!r}; expected one of {_PROTOCOLS}"
        )
    kw: dict[str, Any] = {
        "bootstrap_servers": servers,
        "client_id": cfg.client_id,
        "security_protocol": protocol,
        "request_timeout_ms": cfg.request_timeout_ms,
        "bootstrap_timeout_ms": cfg.connect_timeout_ms,
    }
    mechanism = cfg.sasl_mechanism.upper()
    if protocol.startswith("SASL_"):
        if mechanism not in _SASL:
            raise ValueError(
                f"KafkaConfig.sasl_mechanism={cfg.sasl_mechanism!r} with {protocol}; expected one of {_SASL}"
            )
        if not cfg.sasl_username or not cfg.sasl_password:
            raise ValueError(
                f"KafkaConfig: {protocol} needs sasl_username and sasl_password (CTR_KAFKA_SASL_PASSWORD)"
            )
        kw.update(
            sasl_mechanism=mechanism,
            sasl_plain_username=cfg.sasl_username,
            sasl_plain_password=cfg.sasl_password.get_secret_value(),
        )
    elif mechanism:
        raise ValueError(
            f"KafkaConfig.sasl_mechanism={mechanism!r} needs security_protocol SASL_SSL or SASL_PLAINTEXT"
        )
    if cfg.ssl_cafile:
        if not protocol.endswith("SSL"):
            raise ValueError(f"KafkaConfig.ssl_cafile is set but security_protocol is {protocol}")
        kw["ssl_cafile"] = cfg.ssl_cafile
    return kw


@functools.cache
def _check_crc32c() -> None:
    if importlib.util.find_spec("crc32c") is None:
        log.warning(
            "the crc32c package is not installed: kafka-python computes record CRCs in pure Python, "
            "which makes producing ~3x and consuming (check_crcs) ~6x slower"
        )


def connect(factory: Callable[..., _C], cfg: KafkaConfig, what: str, **extra: Any) -> _C:
    """Build a kafka-python client, turning "no broker answered" into :class:`KafkaUnavailableError`."""
    _check_crc32c()
    try:
        return factory(**kafka_client_kwargs(cfg), **extra)
    except (KafkaTimeoutError, KafkaConnectionError) as exc:
        raise KafkaUnavailableError(
            f"{what}: no Kafka broker answered at {cfg.bootstrap_servers} ({cfg.security_protocol}) within "
            f"{cfg.connect_timeout_ms} ms; is Kafka running (deploy/services.sh status)? {exc}"
        ) from exc


def ensure_topics(
    cfg: KafkaConfig,
    names: Iterable[str],
    partitions: int | None = None,
    configs: dict[str, str] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet (``partitions`` defaults to ``cfg.partitions``;
    ``configs``: topic settings of the ones created, e.g. ``{"cleanup.policy": "compact"}``).

    Idempotent and safe to race: a topic another process created meanwhile counts as existing.
    Returns the names it created. Existing topics are left as they are, whatever their partitions.
    """
    wanted = list(dict.fromkeys(names))
    n = cfg.partitions if partitions is None else partitions
    admin = connect(KafkaAdminClient, cfg, "ensure_topics")
    try:
        missing = [t for t in wanted if t not in set(admin.list_topics())]
        created: list[str] = []
        if missing:
            spec = {
                "num_partitions": n,
                "replication_factor": cfg.replication_factor,
                "configs": configs or {},
            }
            result = admin.create_topics({t: dict(spec) for t in missing}, raise_errors=False)
            for topic in result["topics"]:
                code = topic["error_code"]
                if code == 0:
                    created.append(topic["name"])
                elif code != TopicAlreadyExistsError.errno:
                    raise KafkaError(f"ensure_topics: creating {topic['name']!r} failed: {topic}")
        if wanted:
            admin.wait_for_topics(wanted, timeout_ms=cfg.request_timeout_ms)  # leaders elected
        return created
    finally:
        admin.close()


class KeyHashPartitioner(DefaultPartitioner):
    """kafka-python's default partitioner, key hashes cached (:class:`~pipeline.core.partitioning.KeyHashes`).

    The partition is exactly the default one, :func:`pipeline.core.partitioning.partition_of`.
    """

    def __init__(self, max_keys: int = 1_000_000) -> None:
        self._hash = KeyHashes(max_keys)

    def partition(self, topic, key, serialized_key, value, serialized_value, cluster):
        if serialized_key is None:  # no key: the default's random choice
            return super().partition(topic, key, serialized_key, value, serialized_value, cluster)
        partitions = cluster.partitions_for_topic(topic)
        if partitions is None:
            raise ValueError(f"Topic {topic} not found in ClusterMetadata")
        return sorted(partitions)[self._hash(serialized_key) % len(partitions)]


class KafkaSink:
    """An idempotent producer (acks=all) to ``topic``; ``flush()`` raises if any send failed.

    ``send`` only enqueues; ``flush`` blocks until every record sent so far is acknowledged by all
    in-sync replicas and raises :class:`KafkaSinkError` if any of them failed, so the caller commits
    its input offsets only after ``flush`` returns. After a failure the sink carries on with a new
    producer: resend the whole uncommitted input (downstream dedup by id makes repeats harmless) or
    exit and let the restart replay it. ``write(letter)`` makes it a
    :class:`pipeline.replay.loop.DeadLetterSink`.
    """

    def __init__(self, cfg: KafkaConfig, topic: str) -> None:
        self.cfg, self.topic = cfg, topic
        self._window: list[Any] = []  # the futures of the records sent since the last flush
        self._producer: KafkaProducer | None = self._new_producer()

    @property
    def sent(self) -> int:
        """Records sent since the last flush."""
        return len(self._window)

    def _new_producer(self) -> KafkaProducer:
        return connect(
            KafkaProducer,
            self.cfg,
            f"KafkaSink({self.topic})",
            acks="all",
            enable_idempotence=True,  # explicit: a conflicting setting raises instead of disabling it
            linger_ms=self.cfg.linger_ms,
            batch_size=self.cfg.producer_batch_bytes,
            compression_type=self.cfg.compression_type or None,
            delivery_timeout_ms=self.cfg.delivery_timeout_ms,
            max_block_ms=self.cfg.connect_timeout_ms,  # send() to a missing topic fails, not waits 60 s
            partitioner=KeyHashPartitioner(),
        )

    def send(
        self,
        key: bytes | None,
        value: bytes,
        topic: str | None = None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        """Enqueue one record (to ``topic`` if given, else the sink's topic).

        ``timestamp_ms``: the record's CreateTime (default: now), e.g. a replayed event's entry time.
        ``partition``: this partition, not the key's (the joiner writes task p's examples to p).
        """
        if self._producer is None:  # the last one failed (broker away): connect again now
            self._producer = self._new_producer()
        try:
            future = self._producer.send(
                topic or self.topic, key=key, value=value, timestamp_ms=timestamp_ms, partition=partition
            )
            self._window.append(future)
        except KafkaTimeoutError as exc:
            raise KafkaSinkError(
                f"KafkaSink: no metadata for topic {topic or self.topic!r}; does it exist?"
            ) from exc

    def write(self, letter: DeadLetter) -> None:
        """Send a dead letter (the sink's topic is then the dead-letter topic)."""
        self.send(None, letter.to_json())

    def discard(self) -> None:
        """Forget the records sent since the last flush (the caller will send them again)."""
        self._window = []

    def flush(self, timeout_s: float | None = None) -> int:
        """Block until everything sent is acknowledged; returns how many records that was."""
        window, self._window = self._window, []
        if self._producer is None:
            return 0  # nothing was sent since the failed producer was dropped
        # The per-record futures are the truth: kafka-python's flush() returns normally when sends
        # failed, and after a batch is split (MESSAGE_TOO_LARGE) it can return, or raise
        # UnknownError("Future not done"), before the split halves are done: wait for those too.
        for _ in range(3):
            try:
                self._producer.flush(timeout=timeout_s)
            except KafkaTimeoutError:
                break
            except KafkaError:
                pass
            if all(f.is_done for f in window):
                break
        failed = [f.exception for f in window if f.is_done and f.failed()]
        undone = sum(not f.is_done for f in window)
        if not failed and not undone:
            return len(window)
        # kafka-python 3.0: once a record is refused (e.g. too large), the idempotent producer fails
        # every later record of that partition. Start afresh; the caller resends what it sent.
        self._producer.close(timeout=min(timeout_s or 5.0, 5.0))
        self._producer = None  # a fresh one at the next send (now the broker may be away)
        first = failed[0] if failed else KafkaTimeoutError(f"not acknowledged within {timeout_s} s")
        raise KafkaSinkError(
            f"KafkaSink({self.topic}): {len(failed) + undone} of {len(window)} records sent since the "
            f"last flush failed ({undone} unacknowledged); first error: {first!r}"
        ) from first

    def close(self, timeout_s: float = 10.0) -> None:
        if self._producer is not None:
            self._producer.close(timeout=timeout_s)

    def __enter__(self) -> KafkaSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
