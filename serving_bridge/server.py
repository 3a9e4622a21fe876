"""`ctr serve`: one replica as an HTTP/JSON process (production profile).

- ``POST /score`` ``{"user_id": str, "context": {str: str}, "items": [str, ...]}`` ->
  ``{"version", "arm", "replica", "probabilities"}``: one probability per candidate, the version
  that made them and the A/B arm. The body is validated against the ``ScoreRequest`` schema of the
  OpenAPI document (:mod:`serving_bridge.openapi`); bad input gets a 4xx and ``{"error": ...}``.
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from kafka.partitioner.default import murmur2

from pipeline import logs, systemd
from pipeline.config import ServingConfig
from pipeline.metrics import CONTENT_TYPE, Registry
from serving_bridge.ab import ABRouter
from serving_bridge.feature_fallback import FallbackFeatures
from serving_bridge.openapi import openapi_spec, request_schema, validate
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

    def __init__(
        self,
        host: str,
        port: int,
        router: ABRouter,
        cfg: ServingConfig | None = None,
        *,
        features: FallbackFeatures | None = None,
    ) -> None:
        super().__init__((host, port), _Handler)
        self.router = router
        self.cfg = cfg or ServingConfig()
        self.features = features
        self.spec = openapi_spec(self.cfg.max_candidates, auth=bool(self.cfg.auth_token))
        self.spec_body = json.dumps(self.spec).encode()
        self.schema = request_schema(self.spec)
        self._token = f"Bearer {self.cfg.auth_token}".encode() if self.cfg.auth_token else b""
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


class _Handler(BaseHTTPRequestHandler):
    server: ReplicaServer
    protocol_version = "HTTP/1.1"  # keep-alive: no TCP handshake and no new thread per request
    # Headers and body are two writes: with Nagle on, the body waits for the client's delayed ACK
    # of the headers (~40 ms on Linux) on a kept-alive connection.
    disable_nagle_algorithm = True
    timeout = 10  # an idle keep-alive connection is closed after this (and frees its thread)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: dict[str, Any] | bytes, *headers: tuple[str, str]) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, status: int, message: str, *headers: tuple[str, str]) -> None:
        """An error answered before the body was read: the connection cannot be reused."""
        self.close_connection = True
        self._send(status, {"error": message}, *headers)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        router = self.server.router
        if path == "/healthz":
            self._send(200, {"status": "ok"})
        elif path == "/readyz":
            ready = router.ready
            self._send(200 if ready else 503, {"ready": ready, "version": router.champion.version})
        elif path == "/version":
            challenger = router.challenger.version if router.challenger is not None else None
            self._send(
                200,
                {
                    "version": router.champion.version,
                    "challenger": challenger,
                    "replica": router.champion.name,
                },
            )
        elif path == "/openapi.json":
            self._send(200, self.server.spec_body)
        elif path == "/metrics":
            data = self.server.metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._send(
                404, {"error": f"no route GET {path}; try /score, /version, /readyz, /metrics, /openapi.json"}
            )

    def do_POST(self) -> None:
        started = time.perf_counter()
        try:
            self._post()
        finally:
            self.server.metrics.histogram("ctr_serving_request_seconds", "POST /score latency").observe(
                time.perf_counter() - started
            )

    def send_response(self, code: int, message: str | None = None) -> None:
        if self.command == "POST":  # count every answer to /score by status code
            self.server.metrics.counter(
                "ctr_serving_requests_total", "POST requests", code=str(int(code))
            ).inc()
        super().send_response(code, message)

    def _post(self) -> None:
        server = self.server
        if self.path.split("?", 1)[0] != "/score":
            self._refuse(404, f"no route POST {self.path}; POST /score")
            return
        if not server.authorized(self.headers.get("Authorization")):
            self._refuse(401, "missing or wrong bearer token", ("WWW-Authenticate", 'Bearer realm="ctr"'))
            return
        raw_length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") or raw_length is None:
            self._refuse(411, "send the JSON body with a Content-Length (no chunked encoding)")
            return
        try:
            length = int(raw_length)
            if length < 0:
                raise ValueError(raw_length)
        except ValueError:
            self._refuse(400, f"bad Content-Length {raw_length!r}")
            return
        if length > server.cfg.max_body_bytes:
            self._refuse(413, f"body of {length} bytes; at most {server.cfg.max_body_bytes}")
            return
        if not server.try_admit():
            retry = str(max(1, round(server.cfg.retry_after_s)))
            self._refuse(503, "overloaded: too many requests in flight; retry later", ("Retry-After", retry))
            return
        try:
            self._score(self.rfile.read(length))
        finally:
            server.release()

    def _score(self, body: bytes) -> None:
        server = self.server
        try:
            req = json.loads(body)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            self._send(400, {"error": f"body is not valid JSON: {exc}"})
            return
        try:
            validate(server.schema, req)
        except ValueError as exc:
            self._send(400, {"error": str(exc)})
            return
        router = server.router
        if not router.ready:
            self._send(503, {"error": "no model loaded yet"}, ("Retry-After", "1"))
            return
        try:
            result, arm = router.score(req["user_id"], req.get("context", {}), req["items"])
        except Exception:  # a model bug: answer (and count) a 500, keep the connection and the server
            log.exception("serve: scoring failed for a valid request")
            self._send(500, {"error": "internal error while scoring; see the replica's log"})
            return
        server.metrics.counter(
            "ctr_serving_scored_total", "scored requests by arm and version", arm=arm, version=result.version
        ).inc()
        self._send(
            200,
            {
                "version": result.version,
                "arm": arm,
                "replica": result.replica,
                "probabilities": result.probabilities,
            },
        )
