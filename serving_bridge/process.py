"""`ctr serve`: wire one replica to the MLflow server, the Redis online store and its HTTP port."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from features.store import OnlineFeatureReader, connect_store
from pipeline.checkpoints import file_lock
from pipeline.config import Config
from pipeline.events import Pseudonymizer
from serving_bridge.ab import ABRouter
from serving_bridge.feature_fallback import FallbackFeatures
from serving_bridge.replica import Replica
from serving_bridge.server import ReplicaServer, kafka_partition, listen_for_swaps
from trainers.registry import MlflowModelStore

__all__ = ["feature_reader", "run_replica"]

log = logging.getLogger(__name__)
FEATURE_PATHS = ("redis", "feast")


def feature_reader(cfg: Config, feast_dir: Path) -> Any:
    """The reader ``serving.feature_path`` names, over the Feast store in ``feast_dir``."""
    path = cfg.serving.feature_path
    if path not in FEATURE_PATHS:
        raise ValueError(f"serving.feature_path = {path!r} must be one of {FEATURE_PATHS}")
    store = connect_store(feast_dir)
    online = store.config.online_store
    # the direct path knows a single Redis only (not redis_cluster / redis_sentinel): SDK otherwise
    if path == "redis" and getattr(online, "type", "") == "redis" and online.redis_type == "redis":
        from features.redis_reader import RedisFeatureReader

        timeout = cfg.serving.feature_timeout_s
        return RedisFeatureReader.for_store(
            store, cfg.features, socket_timeout=timeout, socket_connect_timeout=timeout
        )
    return OnlineFeatureReader(store, cfg.features)


class LazyFeatureReader:
    """Connects to the joiner's Feast store at the first read, and again after a failed connect.

    A replica may start before the joiner has set the store up (or while it is doing so): until
    then each read raises, and :class:`FallbackFeatures` scores with default features and retries.
    The connect waits for a set-up in progress (the joiner holds the folder's set-up lock).
    """

    def __init__(self, connect: Any, feast_dir: Path) -> None:
        self._connect, self._dir, self._reader = connect, feast_dir, None
        self._lock = threading.Lock()

    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        if self._reader is None:
            with self._lock:
                if self._reader is None:
                    if not (self._dir / "feature_store.yaml").is_file():
                        raise FileNotFoundError(f"no feature store at {self._dir} yet (start `ctr joiner`)")
                    with file_lock(self._dir / ".setup.lock"):
                        self._reader = self._connect()
                    log.info("serve: reading features from the store at %s", self._dir)
        return self._reader.get(user_id, item_ids)  # type: ignore[attr-defined]


def run_replica(cfg: Config, host: str, port: int, name: str) -> None:
    if not cfg.registry.tracking_uri:
        raise ValueError(
            "ctr serve needs an MLflow server: set CTR_REGISTRY_TRACKING_URI "
            "(e.g. http://127.0.0.1:15000; `make services-up` starts one)"
        )
    if cfg.serving.torch_threads > 0:
        # 100 rows per request are too few to split across cores; parallel requests use them instead
        import torch

        torch.set_num_threads(cfg.serving.torch_threads)
    store = MlflowModelStore(cfg.registry, cfg.registry.tracking_uri)
    feast_dir = Path(cfg.daemon.state_dir).expanduser() / "joiner" / "feast"
    reader = LazyFeatureReader(lambda: feature_reader(cfg, feast_dir), feast_dir)
    features = FallbackFeatures(reader, cfg.features, retry_s=cfg.serving.feature_retry_s)
    partitions = cfg.kafka.partitions
    pseudonymize = Pseudonymizer(cfg.validation.pseudonym_key, "u_")

    def replica(alias: str) -> Replica:
        return Replica(
            name,
            store,
            features,
            pseudonymize,
            alias=alias,
            poll_interval_s=cfg.serving.poll_interval_s,
            shard_of=lambda user: kafka_partition(user, partitions),
        )

    challenger = replica(cfg.serving.challenger_alias) if cfg.serving.challenger_share > 0 else None
    router = ABRouter(replica(cfg.registry.champion_alias), challenger, cfg.serving.challenger_share).start()
    stop = threading.Event()
    listen_for_swaps(cfg.daemon.redis_url, router, stop)
    server = ReplicaServer(host, port, router, cfg.serving, features=features)
    log.info(
        "serve: replica %s on http://%s:%d (features: %s, challenger share %.2f)",
        name,
        host,
        port,
        type(reader).__name__ if reader else "defaults",
        router.challenger_share,
    )
    try:
        server.serve_until_signal()
    finally:
        stop.set()
        router.stop()
