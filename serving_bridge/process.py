"""`ctr serve`: wire one replica to the MLflow server, the Redis online store and its HTTP port."""

from __future__ import annotations

import functools
import gc
import logging
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from features.store import OnlineFeatureReader, connect_store
from pipeline.core.checkpoints import file_lock
from pipeline.core.config import Config
from pipeline.core.pseudonyms import Pseudonymizer
from serving_bridge.ab import ABRouter
from serving_bridge.feature_fallback import FallbackFeatures, read_async
from serving_bridge.model_cache import ModelHelper, PreparedModelStore
from serving_bridge.online_offset import RedisOffsets, offset_key
from serving_bridge.replica import Replica
from serving_bridge.server import ReplicaServer, bind, listen_for_swaps, serve_workers
from serving_bridge.worker_slot import WorkerSlot
from trainers.registry import MlflowModelStore

__all__ = [
    "BackgroundFeatureReader",
    "StoreNotOpen",
    "feature_reader",
    "freeze_after_swap",
    "run_replica",
    "serve_replica",
    "tune_for_latency",
]

log = logging.getLogger(__name__)
FEATURE_PATHS = ("redis", "feast")


def feature_reader(cfg: Config, feast_dir: Path) -> Any:
    """The reader ``serving.feature_path`` names, over the Feast store in ``feast_dir``.

    Returns once the reader has read from the online store (an unknown entity), so the first
    Redis connection is made here, by :class:`BackgroundFeatureReader`'s thread, not by a request.
    """
    path = cfg.serving.feature_path
    if path not in FEATURE_PATHS:
        raise ValueError(f"serving.feature_path = {path!r} must be one of {FEATURE_PATHS}")
    store = connect_store(feast_dir)
    online = store.config.online_store
    # the direct path knows a single Redis only (not redis_cluster / redis_sentinel): SDK otherwise
    if path == "redis" and getattr(online, "type", "") == "redis" and online.redis_type == "redis":
        from features.redis_reader import RedisFeatureReader

        timeout = cfg.serving.feature_timeout_s
        reader = RedisFeatureReader.for_store(
            store, cfg.features, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        reader.get("", [""])  # connect now (raises while Redis is away: the opener retries)
        return reader
    return OnlineFeatureReader(store, cfg.features)  # its constructor reads once too


class StoreNotOpen(RuntimeError):
    """A read before the replica has opened the joiner's Feast store (defaults are served)."""


class BackgroundFeatureReader:
    """Opens the joiner's Feast store on a background thread; reads fail fast until it is open.

    A replica may start before the joiner has set the store up (or while it is doing so, holding
    the folder's set-up lock), and Redis may be away when it does: opening the store and making
    the first Redis connection can take seconds. None of that happens on a request: until the
    store is open, :meth:`get` raises :class:`StoreNotOpen` at once and :class:`FallbackFeatures`
    scores with default features. The thread retries every ``retry_s`` until it succeeds.
    """

    def __init__(self, connect: Any, feast_dir: Path, retry_s: float = 1.0) -> None:
        self._connect, self._dir, self.retry_s = connect, feast_dir, retry_s
        self._reader: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_open(self) -> bool:
        return self._reader is not None

    def open_once(self) -> bool:
        """One attempt to open the store (blocking); True once it is open. Raises what it met."""
        if self._reader is None:
            if not (self._dir / "feature_store.yaml").is_file():
                return False
            with file_lock(self._dir / ".setup.lock"):  # waits for a set-up in progress
                reader = self._connect()
            self._reader = reader
            log.info("serve: reading features from the store at %s", self._dir)
        return True

    def start(self) -> BackgroundFeatureReader:
        self._thread = threading.Thread(target=self._run, name="feature-store-open", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        said: str | None = None  # the last reason logged: once per reason, not every retry
        while not self._stop.is_set():
            try:
                if self.open_once():
                    return
                reason = f"no feature store at {self._dir} yet (start `ctr joiner`)"
            except Exception as exc:  # Redis away, a half-written store: retry
                reason = f"cannot open the feature store at {self._dir} yet: {exc!r}"
            if reason != said:
                log.warning("serve: %s; default features until then", reason)
                said = reason
            self._stop.wait(self.retry_s)

    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        return self._open().get(user_id, item_ids)

    async def aget(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        """:meth:`get` on the event loop: the direct reader's own ``aget``; Feast's SDK (which
        blocks) on a thread."""
        return await read_async(self._open(), user_id, item_ids)

    async def awarm(self, connections: int) -> bool:
        """Open the direct reader's asyncio connections on the running loop; False while the store
        is not open yet (nothing to warm: the SDK path has no asyncio connections)."""
        reader = self._reader
        if reader is None:
            return False
        if hasattr(reader, "awarm"):
            await reader.awarm(connections)
        return True

    def _open(self) -> Any:
        reader = self._reader
        if reader is None:
            raise StoreNotOpen(f"the feature store at {self._dir} is not open yet")
        return reader


def run_replica(cfg: Config, host: str, port: int, name: str) -> None:
    """``ctr serve``: one process, or ``serving.workers`` processes sharing the port."""
    if not cfg.registry.tracking_uri:
        raise ValueError(
            "ctr serve needs an MLflow server: set CTR_REGISTRY_TRACKING_URI "
            "(e.g. http://127.0.0.1:15000; `make services-up` starts one)"
        )
    path = cfg.serving.feature_path
    if path not in FEATURE_PATHS:  # here, not in the opener's retry loop
        raise ValueError(f"serving.feature_path = {path!r} must be one of {FEATURE_PATHS}")
    listener = bind(host, port)
    workers = cfg.serving.workers
    log.info(
        "serve: replica %s on http://%s:%d (features: %s, challenger share %.2f, %d worker(s))",
        name,
        host,
        port,
        path,
        cfg.serving.challenger_share,
        workers,
    )
    fresh = not cfg.serving.model_dir
    models = Path(
        tempfile.mkdtemp(prefix="ctr-serve-models-") if fresh else cfg.serving.model_dir
    ).expanduser()
    try:
        if workers <= 1:
            serve_replica(cfg, name, listener, notify=True, models=models)
        else:
            worker = functools.partial(serve_replica, cfg, name, models=models)
            serve_workers(workers, listener, worker, hang_s=cfg.serving.worker_hang_s)
    finally:
        if fresh:
            shutil.rmtree(models, ignore_errors=True)


def tune_for_latency() -> None:
    """Interpreter settings of a serving process, once its modules are imported.

    - ``gc.freeze()``: the ~400,000 objects of the imports (torch, MLflow, Feast) move to a
      generation the collector never scans. Otherwise each full collection walks them all, 100-230
      ms here with the GIL held, and the allocations of a model load (each swap) trigger one: a
      stall of every request in flight. They are long-lived; what they free they free by refcount.
      :func:`freeze_after_swap` does the same for what a swap leaves (a model, lazy imports).
    - ``sys.setswitchinterval(0.0005)``: a thread holding the GIL (a swap loading a version, a
      metrics scrape) hands it to the event loop within 0.5 ms instead of Python's default 5 ms.
    """
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(0.0005)


def freeze_after_swap() -> None:
    """After a swap: the young generations collected (a few ms), then everything left frozen.

    What this costs: a reference cycle that had already reached the oldest generation when this
    runs is never collected. Full collections here found 0-35 such objects each, so a swap may
    keep a few KB that a full collection would have freed; in exchange no request waits 50-100 ms
    for the collector to walk the new model's objects (measured in a ``ctr serve`` process under
    load, the first swaps after start-up).
    """
    gc.collect(1)
    gc.freeze()


def serve_replica(
    cfg: Config,
    name: str,
    listener: socket.socket,
    slot: WorkerSlot | None = None,
    *,
    notify: bool = False,
    models: Path,
) -> None:
    """One serving process on ``listener``: its models, alias watchers and feature reader
    (``slot``: a worker's heartbeat and connection count, :mod:`serving_bridge.worker_slot`;
    ``notify``: systemd's main process; ``models``: the folder of prepared versions its host's
    workers share)."""
    if cfg.serving.torch_threads > 0:
        # 100 rows per request are too few to split across cores; parallel requests use them instead
        import torch

        torch.set_num_threads(cfg.serving.torch_threads)
    state_dir = Path(cfg.daemon.state_dir).expanduser()
    # versions are downloaded and traced by a helper process, not beside the requests
    # (serving_bridge.model_cache); forked first, before this process has threads or connections
    helper = ModelHelper(cfg.registry, cfg.registry.tracking_uri).start("fork", not_inherited=[listener])
    store = PreparedModelStore(
        MlflowModelStore(cfg.registry, cfg.registry.tracking_uri),
        models / cfg.registry.model_name,
        helper,
        inference=cfg.serving.inference,
    )
    feast_dir = state_dir / "joiner" / "feast"
    reader = BackgroundFeatureReader(
        lambda: feature_reader(cfg, feast_dir), feast_dir, retry_s=cfg.serving.feature_retry_s
    ).start()
    features = FallbackFeatures(
        reader,
        cfg.features,
        retry_s=cfg.serving.feature_retry_s,
        timeout_s=cfg.serving.feature_timeout_s,
        workers=cfg.serving.max_in_flight,
        failures_to_back_off=cfg.serving.feature_failures_to_back_off,
    )
    pseudonymize = Pseudonymizer(cfg.validation.pseudonym_key.get_secret_value(), "u_")
    offsets = RedisOffsets(cfg.daemon.redis_url, offset_key(cfg.features.project, cfg.registry.model_name))

    def replica(alias: str) -> Replica:
        return Replica(
            name,
            store,
            features,
            pseudonymize,
            alias=alias,
            poll_interval_s=cfg.serving.poll_interval_s,
            inference="eager",  # as the store loads it: traced already when serving.inference says so
            offsets=offsets,
        )

    challenger = replica(cfg.serving.challenger_alias) if cfg.serving.challenger_share > 0 else None
    router = ABRouter(replica(cfg.registry.champion_alias), challenger, cfg.serving.challenger_share).start()
    stop = threading.Event()
    listen_for_swaps(cfg.daemon.redis_url, router, stop)
    server = ReplicaServer(
        "", 0, router, cfg.serving, features=features, listener=listener, notify=notify, slot=slot
    )
    tune_for_latency()
    try:
        server.serve_until_signal()
    finally:
        stop.set()
        reader.stop()
        router.stop()
        features.close()
        store.close()
