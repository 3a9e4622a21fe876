"""`ctr serve`: wire one replica to the MLflow server, the Redis online store and its HTTP port."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from features.store import OnlineFeatureReader, connect_store
from pipeline.config import Config
from pipeline.events import Pseudonymizer
from serving_bridge.replica import Replica
from serving_bridge.server import ReplicaServer, kafka_partition, listen_for_swaps
from trainers.registry import MlflowModelStore

__all__ = ["run_replica"]

log = logging.getLogger(__name__)


def run_replica(cfg: Config, host: str, port: int, name: str) -> None:
    if not cfg.registry.tracking_uri:
        raise ValueError(
            "ctr serve needs an MLflow server: set CTR_REGISTRY_TRACKING_URI "
            "(e.g. http://127.0.0.1:15000; `make services-up` starts one)"
        )
    store = MlflowModelStore(cfg.registry, cfg.registry.tracking_uri)
    feast_dir = Path(cfg.daemon.state_dir).expanduser() / "joiner" / "feast"
    reader = None
    try:
        reader = OnlineFeatureReader(connect_store(feast_dir), cfg.features)
    except FileNotFoundError:
        log.warning(
            "serve: no feature store at %s yet (start `ctr joiner` first); scoring with default features",
            feast_dir,
        )
    partitions = cfg.kafka.partitions
    replica = Replica(
        name,
        store,
        reader,
        Pseudonymizer(cfg.validation.pseudonym_key, "u_"),
        alias=cfg.registry.champion_alias,
        poll_interval_s=cfg.serving.poll_interval_s,
        shard_of=lambda user: kafka_partition(user, partitions),
    ).start()
    stop = threading.Event()
    listen_for_swaps(cfg.daemon.redis_url, replica, stop)
    server = ReplicaServer(host, port, replica, cfg.serving.max_candidates)
    log.info("serve: replica %s on http://%s:%d", name, host, port)
    try:
        server.serve_until_signal()
    finally:
        stop.set()
        replica.stop()
