"""The request handler of a ``ctr serve`` replica: routes and JSON answers (moved out of server.py)."""

from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from pipeline.metrics import CONTENT_TYPE
from serving_bridge.openapi import validate

if TYPE_CHECKING:
    from serving_bridge.server import ReplicaServer

__all__ = ["ReplicaHandler"]

log = logging.getLogger(__name__)


class ReplicaHandler(BaseHTTPRequestHandler):
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
