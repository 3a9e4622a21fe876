"""`ctr serve`: one replica as an HTTP/JSON process (production profile).

- ``POST /score`` ``{"user_id": str, "context": {str: str}, "items": [str, ...]}`` ->
  ``{"version", "arm", "replica", "probabilities"}``: one probability per candidate, the version
  that made them and the A/B arm. The body is validated against the ``ScoreRequest`` schema of the
  OpenAPI document (:mod:`serving_bridge.openapi`); bad input gets a 4xx and ``{"error": ...}``
  (hostile requests too: :mod:`serving_bridge.http_handler`).
- ``GET /openapi.json`` that document; ``GET /healthz`` 200 while the process runs;
  ``GET /readyz`` 200 once a champion is loaded, else 503; ``GET /version``; ``GET /metrics``.

Overload: at most ``serving.max_in_flight`` requests are scored at once; one more is answered
``503`` with ``Retry-After`` at once instead of queueing without bound, so latency stays bounded
and the server recovers as soon as the load drops. Optional bearer token on ``/score``
(``CTR_SERVING_AUTH_TOKEN``); the probes, ``/metrics`` and ``/openapi.json`` stay open.

The replica watches its aliases by polling MLflow and by a Redis pub/sub message the trainer
publishes after moving the alias (:data:`NOTIFY_CHANNEL`), whichever comes first.
"""

from __future__ import annotations

import hmac
import json
import logging
import select
import signal
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any, Protocol

from kafka.partitioner.default import murmur2

from pipeline.core import logs, systemd
from pipeline.core.config import ServingConfig
from pipeline.core.metrics import Registry
from serving_bridge.ab import ABRouter
from serving_bridge.feature_fallback import FallbackFeatures
from serving_bridge.http_handler import ReplicaHandler
from serving_bridge.openapi import openapi_spec, request_schema
from serving_bridge.serving_metrics import collect_replica_metrics

__all__ = ["NOTIFY_CHANNEL", "ReplicaServer", "kafka_partition", "listen_for_swaps"]

log = logging.getLogger(__name__)
NOTIFY_CHANNEL = "ctr:champion-moved"


class _Notifiable(Protocol):
    def notify(self) -> None: ...


def kafka_partition(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` (to find a user's joiner shard)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def listen_for_swaps(redis_url: str, replica: _Notifiable, stop: threading.Event) -> threading.Thread:
    """Wake ``replica`` whenever the trainer (or an operator) announces an alias move on Redis."""
    import redis

    def run() -> None:
        while not stop.is_set():
            try:
                pubsub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(NOTIFY_CHANNEL)
                while not stop.is_set():
                    if pubsub.get_message(timeout=0.5) is not None:
                        replica.notify()
            except Exception:  # Redis away: polling still works; retry the subscription
                log.warning("swap notifications unavailable; relying on polling", exc_info=True)
                stop.wait(2.0)

    thread = threading.Thread(target=run, name="swap-notify", daemon=True)
    thread.start()
    return thread


class ReplicaServer(ThreadingHTTPServer):
    # Request threads are joined on close: in-flight requests finish before the process exits.
    daemon_threads = False
    block_on_close = True
    request_queue_size = 256  # listen backlog: the default 5 drops SYNs under a burst (1 s retries)
    body_timeout_s = 2.0  # a POST body not complete this long after its headers gets 408

    def __init__(
        self,
        host: str,
        port: int,
        router: ABRouter,
        cfg: ServingConfig | None = None,
        *,
        features: FallbackFeatures | None = None,
    ) -> None:
        super().__init__((host, port), ReplicaHandler)
        self.router = router
        self.cfg = cfg or ServingConfig()
        self.features = features
        self.spec = openapi_spec(self.cfg.max_candidates, auth=bool(self.cfg.auth_token))
        self.spec_body = json.dumps(self.spec).encode()
        self.schema = request_schema(self.spec)
        self._token = (
            f"Bearer {self.cfg.auth_token.get_secret_value()}".encode() if self.cfg.auth_token else b""
        )
        self._admit = threading.Lock()
        self.in_flight = 0  # POST /score requests being processed now
        self._status_version: str | None = None  # the version last reported to systemd
        self.metrics = Registry()
        self.metrics.on_scrape(lambda: collect_replica_metrics(self))

    @property
    def replica(self) -> Any:
        """The champion replica (its version is "the" version of this process)."""
        return self.router.champion

    def authorized(self, header: str | None) -> bool:
        return not self._token or hmac.compare_digest((header or "").encode(), self._token)

    def try_admit(self) -> bool:
        """Take one of ``max_in_flight`` slots without waiting; False = overloaded."""
        with self._admit:
            if self.in_flight >= self.cfg.max_in_flight:
                return False
            self.in_flight += 1
            return True

    def release(self) -> None:
        with self._admit:
            self.in_flight -= 1

    def serve_until_signal(self) -> None:
        """Serve until SIGTERM/SIGINT; in-flight requests finish before the process exits."""

        def stop(*_: Any) -> None:
            systemd.stopping("serve: stopping after in-flight requests")
            threading.Thread(target=self.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        # Ready = the port is bound (it is, since __init__). Not "a model is loaded": on a fresh
        # deployment no champion exists yet, and systemd would fail the start. Load balancers ask
        # GET /readyz, which answers 503 until a model is loaded.
        host, port = self.server_address[:2]
        systemd.ready(f"serve: listening on {host!s}:{port}; version {self.replica.version}")
        self._status_version = self.replica.version
        self.serve_forever(poll_interval=0.2)
        self.answer_backlog()
        self.server_close()

    def answer_backlog(self, max_s: float = 1.0) -> int:
        """Answer the connections the kernel completed before the stop (closing the listener would
        reset them, mid-request for their clients), for at most ``max_s``; returns how many."""
        answered, deadline = 0, time.monotonic() + max_s
        while time.monotonic() < deadline and select.select([self], [], [], 0)[0]:
            try:
                request, address = self.get_request()
            except OSError:  # the client gave up meanwhile
                break
            self.process_request(request, address)  # a thread, as serve_forever does
            answered += 1
        return answered

    def service_actions(self) -> None:
        """Called by ``serve_forever`` on every poll: feed the watchdog, report a swap."""
        systemd.watchdog()
        version = self.replica.version
        if version != self._status_version:
            self._status_version = version
            logs.set_context(version=version)
            systemd.status(f"serve: serving version {version}")
