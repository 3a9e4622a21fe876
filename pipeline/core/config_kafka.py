"""The ``[kafka]`` section of :class:`pipeline.core.config.Config`: brokers, topics, client tuning.

Its own module only to keep ``config.py`` small; import it from :mod:`pipeline.core.config`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic.dataclasses import dataclass

from pipeline.core.config_types import (
    CHECKED,
    Compression,
    Count,
    Natural,
    SaslMechanism,
    Section,
    SecurityProtocol,
)

__all__ = ["KafkaConfig"]


@dataclass(config=CHECKED, repr=False)
class KafkaConfig(Section):
    bootstrap_servers: str = "127.0.0.1:19092"  # comma-separated host:port list (deploy/services.sh's broker)
    impressions_topic: str = "impressions"  # raw impressions, JSON, keyed by user id
    clicks_topic: str = "clicks"  # raw clicks, JSON, keyed by user id
    conversions_topic: str = "conversions"  # raw conversions, JSON, keyed by user id
    examples_topic: str = "examples"  # the joiner's labelled examples, as JSON lines
    # most examples in one record of the examples topic (pipeline.kafka.example_records): records,
    # not bytes, are what kafka-python pays for; 1 = one example per record, as before 2026-12
    examples_per_record: Annotated[int, Field(ge=1, le=10_000)] = 500
    dead_letter_topic: str = "dead-letters"  # rejected events with a reason
    partitions: Count = 3  # partitions of the topics ensure_topics creates (same for all: co-partitioning)
    replication_factor: Count = 1  # replicas of the topics ensure_topics creates (3 on a real cluster)
    # the joiner's state (pending impressions, feature counters, dedup ids): a compacted changelog
    # topic with as many partitions as the inputs; empty = "<group_id_prefix>-joiner-<examples_topic>-state"
    joiner_state_topic: str = ""
    # a checkpoint's transaction (state records + input offsets) that takes longer is aborted by the
    # broker; also how long a joiner that died mid-checkpoint can delay its partitions' next owner
    transaction_timeout_ms: Count = 30_000
    group_id_prefix: str = "ctr"  # each daemon's consumer group is "<prefix>-<daemon>"
    client_id: str = "ctr-online"  # names this client in broker logs and quotas
    security_protocol: SecurityProtocol = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: SaslMechanism = ""  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512; empty = no SASL
    sasl_username: str = ""  # SASL user name (with sasl_mechanism)
    # SASL password. Secret: set it in the environment (CTR_KAFKA_SASL_PASSWORD), never in the file.
    sasl_password: SecretStr = SecretStr("")
    ssl_cafile: str = ""  # CA bundle that signed the brokers' certificates; empty = the system CAs
    connect_timeout_ms: Count = 10_000  # a client that reaches no broker fails after this
    request_timeout_ms: Count = 30_000  # one broker request fails after this
    delivery_timeout_ms: Count = 120_000  # a produced record not acknowledged within this fails
    linger_ms: Natural = 5  # the producer waits this long to fill a batch (throughput vs latency)
    producer_batch_bytes: Count = 262_144  # producer batch size per partition; bigger = faster in Python
    compression_type: Compression = ""  # producer compression: gzip | snappy | lz4 | zstd; empty = none
    poll_timeout_ms: Natural = 500  # longest one poll waits: the idle-batch period and stop() latency
    max_poll_records: Count = 5_000  # most records in one consumed batch
    max_poll_interval_ms: Count = 600_000  # a consumer that does not poll for this long leaves its group
    # Static group membership (KIP-345): a daemon restarted with the same id gets its partitions back
    # at once, where a new member waits until the broker expires the dead one (45 s). Unique per
    # daemon process within its group (the systemd units use the host name); empty = dynamic member.
    group_instance_id: str = ""
    check_crcs: bool = True  # verify record CRCs when consuming (pure Python, slow, without crc32c)

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        """Kafka's names are upper case; ``sasl_ssl`` has always been accepted (kafka_client_kwargs)."""
        return value.upper() if isinstance(value, str) else value
