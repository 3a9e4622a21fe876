"""`ctr serve`: one replica as an HTTP process (production profile).

Minimal JSON API (the full scoring API with OpenAPI, metrics and A/B comes with the serving issue):

- ``GET /healthz`` 200 while the process runs;
- ``GET /readyz`` 200 once a model is loaded, else 503;
- ``GET /version`` the version this replica serves;
- ``GET /metrics`` Prometheus text: served version, swaps, requests by code, latency histogram;
- ``POST /score`` ``{"user_id": str, "context": {str: str}, "items": [str]}`` ->
  ``{"version", "replica", "probabilities"}``; bad input gets 400 with a message.

The replica watches the ``champion`` alias by polling MLflow and by a Redis pub/sub message the
trainer publishes after moving the alias (:data:`NOTIFY_CHANNEL`), whichever comes first.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kafka.partitioner.default import murmur2

from pipeline import logs, systemd
from pipeline.metrics import CONTENT_TYPE, Registry
from serving_bridge.replica import Replica

__all__ = ["NOTIFY_CHANNEL", "ReplicaServer", "kafka_partition", "listen_for_swaps"]

log = logging.getLogger(__name__)
NOTIFY_CHANNEL = "ctr:champion-moved"


def kafka_partition(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` (to find a user's joiner shard)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def listen_for_swaps(redis_url: str, replica: Replica, stop: threading.Event) -> threading.Thread:
    """Wake ``replica`` whenever the trainer announces an alias move on Redis."""
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

    def __init__(self, host: str, port: int, replica: Replica, max_candidates: int) -> None:
        super().__init__((host, port), _Handler)
        self.replica = replica
        self.max_candidates = max_candidates
        self._status_version: str | None = None  # the version last reported to systemd
        self.metrics = Registry()
        self.metrics.on_scrape(self._collect_metrics)

    def _collect_metrics(self) -> None:
        m, r = self.metrics, self.replica
        version = r.version
        m.clear("ctr_serving_version")  # one series: the version served now
        if version is not None:
            # the version as a label (registry versions are strings) and, when numeric, as the value
            m.gauge(
                "ctr_serving_version",
                "the model version this replica serves",
                replica=r.name,
                version=version,
            ).set(int(version) if version.isdigit() else 1)
        m.gauge("ctr_serving_ready", "1 once a model is loaded", replica=r.name).set(int(r.ready))
        m.counter("ctr_serving_swaps_total", "hot swaps to a new version", replica=r.name).set(len(r.swaps))
        m.counter("ctr_serving_load_errors_total", "versions that failed to load", replica=r.name).set(
            r.load_errors
        )
        if r.swaps:
            m.gauge(
                "ctr_serving_last_swap_timestamp_seconds", "wall time of the last swap", replica=r.name
            ).set(r.swaps[-1][1])

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
        self.server_close()

    def service_actions(self) -> None:
        """Called by ``serve_forever`` on every poll: feed the watchdog, report a swap."""
        systemd.watchdog()
        version = self.replica.version
        if version != self._status_version:
            self._status_version = version
            logs.set_context(version=version)
            systemd.status(f"serve: serving version {version}")


class _Handler(BaseHTTPRequestHandler):
    server: ReplicaServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        replica = self.server.replica
        if self.path == "/healthz":
            self._send(200, {"status": "ok"})
        elif self.path == "/readyz":
            ready = replica.ready
            self._send(200 if ready else 503, {"ready": ready, "version": replica.version})
        elif self.path == "/version":
            self._send(200, {"version": replica.version, "replica": replica.name})
        elif self.path == "/metrics":
            data = self.server.metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._send(404, {"error": f"no route {self.path}; try /score, /version, /readyz, /metrics"})

    def do_POST(self) -> None:
        started = time.perf_counter()
        try:
            self._post()
        finally:
            m = self.server.metrics
            m.histogram("ctr_serving_request_seconds", "POST /score latency").observe(
                time.perf_counter() - started
            )

    def send_response(self, code: int, message: str | None = None) -> None:
        if self.command == "POST":  # count every answer to /score by status code
            self.server.metrics.counter(
                "ctr_serving_requests_total", "POST requests", code=str(int(code))
            ).inc()
        super().send_response(code, message)

    def _post(self) -> None:
        if self.path != "/score":
            self._send(404, {"error": f"no route {self.path}; POST /score"})
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if length > 1_000_000:
                raise ValueError("request body over 1 MB")
            req = json.loads(self.rfile.read(length) or b"null")
            user, context, items = _parse(req, self.server.max_candidates)
        except (ValueError, TypeError) as exc:
            self._send(400, {"error": str(exc)})
            return
        replica = self.server.replica
        if not replica.ready:
            self.send_response(HTTPStatus.SERVICE_UNAVAILABLE)
            self.send_header("Retry-After", "1")
            self.end_headers()
            return
        result = replica.score(user, context, items)
        self._send(
            200, {"version": result.version, "replica": result.replica, "probabilities": result.probabilities}
        )


def _parse(req: Any, max_candidates: int) -> tuple[str, dict[str, str], list[str]]:
    if not isinstance(req, dict):
        raise ValueError("body must be a JSON object with user_id, context and items")
    unknown = set(req) - {"user_id", "context", "items"}
    if unknown:
        raise ValueError(f"unknown fields: {sorted(unknown)}")
    user, context, items = req.get("user_id"), req.get("context", {}), req.get("items")
    if not isinstance(user, str) or not user:
        raise ValueError("user_id must be a non-empty string")
    if not isinstance(context, dict) or not all(isinstance(v, str) for v in context.values()):
        raise ValueError("context must be an object of string values")
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise ValueError("items must be a non-empty list of strings")
    if len(items) > max_candidates:
        raise ValueError(f"{len(items)} items; at most {max_candidates} per request")
    return user, context, items
