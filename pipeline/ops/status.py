"""`ctr status`: the whole pipeline on one screen (``--json`` for machines).

What it asks, each with a short timeout, so one service down never hangs the view:

- **services**: Kafka (a metadata request), Redis (``PING``), the MLflow server (``GET /health``);
- **lag** of the joiner's and the trainer's consumer groups, per partition, from the group's committed
  offsets and the topics' end offsets (what the daemons have made durable, not what they hold in memory);
- **throughput**: the joiner's and the trainer's ``/metrics`` (when ``daemon.*_metrics_port`` is set);
- **models**: the ``champion`` and ``challenger`` versions and the last blocks' lineage and metrics;
- **replicas** (``daemon.replica_urls`` or ``--replica``): the version each one serves, from its own
  ``GET /version``, and the freshness of that version: its last swap minus the moment the trainer
  closed the version's block (tag ``block_closed_at``).

Everything is collected into one plain dict (:func:`collect`); :func:`render` prints it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from pipeline.core.config import Config
from pipeline.ops.probes import TIMEOUT_S, error_text, http_json, http_text, mlflow_error, redact

__all__ = ["collect", "parse_prometheus"]


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` for every sample of a Prometheus text exposition, read by
    prometheus-client's parser; a line it refuses is skipped (one bad line must not hide the rest).

    >>> parse_prometheus('# HELP x y\\nctr_lag{topic="a",partition="0"} 3.0\\nup 1')
    [('ctr_lag', {'topic': 'a', 'partition': '0'}, 3.0), ('up', {}, 1.0)]
    """
    from prometheus_client.parser import text_string_to_metric_families

    def readable(line: str) -> bool:
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            return False
        return True

    good = "".join(line + "\n" for line in text.splitlines() if readable(line))
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(good)
        for s in family.samples
    ]


# -- services ------------------------------------------------------------------------------------
def _services(cfg: Config) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    try:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(**_kafka_kwargs(cfg))
        try:
            topics = admin.list_topics()
        finally:
            admin.close()
        out["kafka"] = {"up": True, "url": cfg.kafka.bootstrap_servers, "topics": len(topics)}
    except Exception as exc:
        out["kafka"] = {"up": False, "url": cfg.kafka.bootstrap_servers, "error": error_text(exc)}
    try:
        import redis

        client = redis.Redis.from_url(cfg.daemon.redis_url, socket_timeout=TIMEOUT_S)
        client.ping()
        out["redis"] = {"up": True, "url": redact(cfg.daemon.redis_url)}
    except Exception as exc:
        out["redis"] = {"up": False, "url": redact(cfg.daemon.redis_url), "error": error_text(exc)}
    uri = cfg.registry.tracking_uri
    if uri.startswith("http"):
        error = mlflow_error(uri)
        out["mlflow"] = {"up": error is None, "url": uri} | ({"error": error} if error else {})
    else:
        out["mlflow"] = {"up": True, "url": uri, "note": "local store (embedded profile)"}
    return out


def _kafka_kwargs(cfg: Config) -> dict[str, Any]:
    from pipeline.kafka.client import kafka_client_kwargs

    timeout_ms = int(TIMEOUT_S * 1000)
    return {
        **kafka_client_kwargs(cfg.kafka),
        "client_id": "ctr-status",
        "request_timeout_ms": timeout_ms,
        "bootstrap_timeout_ms": timeout_ms,
    }


# -- consumer groups -----------------------------------------------------------------------------
def _group_lag(cfg: Config) -> dict[str, Any]:
    """Per group: ``{"topic:partition": end - committed}`` and the total (-1: nothing committed)."""
    from kafka import KafkaConsumer, TopicPartition

    k = cfg.kafka
    groups = {
        "joiner": (f"{k.group_id_prefix}-joiner", [k.impressions_topic, k.clicks_topic]),
        "trainer": (f"{k.group_id_prefix}-trainer", [k.examples_topic]),
    }
    timeout_ms = int(TIMEOUT_S * 1000)
    out: dict[str, Any] = {}
    for name, (group, topics) in groups.items():
        # a consumer that only asks (never subscribes): it does not join the group or move anything
        kw = {**_kafka_kwargs(cfg), "request_timeout_ms": k.request_timeout_ms}
        consumer = KafkaConsumer(
            **kw, group_id=group, enable_auto_commit=False, allow_auto_create_topics=False
        )
        try:
            tps = [
                TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())
            ]
            committed = {tp: consumer.committed(tp) for tp in tps}
            ends = consumer.end_offsets(tps, timeout_ms=timeout_ms) if tps else {}
        finally:
            consumer.close()
        lag = {
            f"{tp.topic}:{tp.partition}": max(0, ends[tp] - off)
            for tp, off in committed.items()
            if off is not None and tp in ends
        }
        out[name] = {"group": group, "lag": lag, "total": sum(lag.values()) if lag else -1}
    return out


# -- daemons' metrics ----------------------------------------------------------------------------
_DAEMON_SERIES = {
    "joiner": (
        "ctr_joiner_events_total",
        "ctr_joiner_examples_total",
        "ctr_joiner_events_per_second",
        "ctr_joiner_examples_per_second",
        "ctr_joiner_join_rate",
        "ctr_joiner_partitions",
    ),
    "trainer": (
        "ctr_trainer_examples_total",
        "ctr_trainer_examples_per_second",
        "ctr_trainer_champion_version",
        "ctr_trainer_progressive_auc",
        "ctr_trainer_progressive_logloss",
    ),
}


def _daemons(cfg: Config) -> dict[str, Any]:
    d = cfg.daemon
    out: dict[str, Any] = {}
    for name, port in (("joiner", d.joiner_metrics_port), ("trainer", d.trainer_metrics_port)):
        if not port:
            out[name] = {"up": None, "note": f"daemon.{name}_metrics_port is 0: no metrics to read"}
            continue
        url = f"http://{d.metrics_host}:{port}/metrics"
        try:
            samples = parse_prometheus(http_text(url))
        except Exception as exc:
            out[name] = {"up": False, "url": url, "error": error_text(exc)}
            continue
        wanted = _DAEMON_SERIES[name]
        values = {n.removeprefix(f"ctr_{name}_"): v for n, labels, v in samples if n in wanted and not labels}
        dead = sum(v for n, labels, v in samples if n == "ctr_dead_letters_total")
        out[name] = {"up": True, "url": url, **values, "dead_letters": dead}
        clicks = {labels["outcome"]: v for n, labels, v in samples if n == "ctr_joiner_clicks_total"}
        if clicks:  # late, early, orphan, duplicate, attributed (the joiner only)
            out[name]["clicks"] = clicks
    return out


# -- models and replicas -------------------------------------------------------------------------
def _models(cfg: Config, last: int) -> dict[str, Any]:
    from trainers.registry import MlflowModelStore
    from trainers.version_page import tag_time

    store = MlflowModelStore(cfg.registry, cfg.registry.tracking_uri)
    versions = store.versions()
    blocks = []
    for v in versions[-last:]:
        tags = store.lineage(v)
        blocks.append(
            {
                "version": v,
                "block": _num(tags.get("block")),
                "examples": _num(tags.get("examples")),
                "online_auc": _num(tags.get("metric.online.auc")),
                "online_logloss": _num(tags.get("metric.online.logloss")),
                "holdout_auc": _num(tags.get("metric.holdout.auc")),
                # the model's share of what it serves at its block's start; the running click rate's the rest
                "model_weight": _num(tags.get("metric.blend.model_weight")),
                "block_closed_at": tag_time(tags.get("block_closed_at")),  # ISO 8601 tag -> epoch s
                "gate": tags.get("gate_reason", ""),
            }
        )
    return {
        "name": cfg.registry.model_name,
        "champion": store.resolve(cfg.registry.champion_alias),
        "challenger": store.resolve("challenger"),
        "versions": len(versions),
        "last_blocks": blocks,
    }


def _num(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is None or math.isfinite(value) else None


def _replicas(urls: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for url in urls:
        base = url.rstrip("/")
        entry: dict[str, Any] = {"url": base}
        try:
            answer = http_json(base + "/version")
            entry.update(up=True, version=answer.get("version"), replica=answer.get("replica"))
            entry["challenger"] = answer.get("challenger")
            samples = parse_prometheus(http_text(base + "/metrics"))
            swaps = [
                v
                for n, labels, v in samples
                if n == "ctr_serving_last_swap_timestamp_seconds"
                and labels.get("arm", "champion") == "champion"
            ]
            entry["last_swap_at"] = max(swaps) if swaps else None
        except Exception as exc:
            entry.update(up=False, error=error_text(exc))
        out.append(entry)
    return out


def collect(cfg: Config, replica_urls: Sequence[str] = (), last_blocks: int = 5) -> dict[str, Any]:
    """Everything ``ctr status`` shows, as plain JSON-able data; parts that fail carry ``error``."""
    status: dict[str, Any] = {"at": time.time(), "services": _services(cfg)}
    up = {name: s["up"] for name, s in status["services"].items()}
    try:
        status["consumers"] = _group_lag(cfg) if up["kafka"] else {"error": "Kafka is down"}
    except Exception as exc:
        status["consumers"] = {"error": error_text(exc)}
    status["daemons"] = _daemons(cfg)
    try:
        status["models"] = _models(cfg, last_blocks) if up["mlflow"] else {"error": "MLflow is down"}
    except Exception as exc:
        status["models"] = {"error": error_text(exc)}
    replicas = _replicas(list(replica_urls) or list(cfg.daemon.replica_urls))
    closed = {b["version"]: b["block_closed_at"] for b in status["models"].get("last_blocks", [])}
    for r in replicas:
        at, swap = closed.get(r.get("version")), r.get("last_swap_at")
        r["freshness_s"] = round(swap - at, 3) if at is not None and swap is not None and swap >= at else None
    status["replicas"] = replicas
    return status


# -- the screen ----------------------------------------------------------------------------------
