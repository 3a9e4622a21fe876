"""The request handler of a ``ctr serve`` replica: routes, JSON answers, and hostile requests.

Every answer is JSON with a ``Content-Length``, errors included: the standard library's own error
pages (a bad request line, headers too long, an unknown method) go through :meth:`send_error`,
which answers ``{"error": ...}`` too. What a hostile client gets:

- a method other than GET and POST: ``405`` with ``Allow`` (the standard library says 501, HTML);
- a body shorter than its ``Content-Length``: ``408`` once ``server.body_timeout_s`` has passed
  since the body started (a total deadline, so a trickle of bytes does not extend it), ``400`` if
  the client closes first; the connection is closed either way;
- JSON nested deeper than the parser's recursion limit: ``400`` (the parser's RecursionError would
  otherwise drop the connection without an answer);
- a string that is not valid Unicode (a lone surrogate, ``"\\ud800"``): ``400``, from the validator;
- HTTP/1.0 with ``Connection: keep-alive`` (``ab -k``): the answer says ``Connection: keep-alive``
  and the connection stays open (an HTTP/1.0 client otherwise waits for the server to close).
"""

from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from pipeline.core.metrics import CONTENT_TYPE
from serving_bridge.openapi import validate

if TYPE_CHECKING:
    from serving_bridge.server import ReplicaServer

__all__ = ["ReplicaHandler"]

log = logging.getLogger(__name__)
_JSON = "application/json"
_GET_PATHS = "/healthz, /readyz, /version, /metrics, /openapi.json; or POST /score"


class ReplicaHandler(BaseHTTPRequestHandler):
    server: ReplicaServer
    protocol_version = "HTTP/1.1"  # keep-alive: no TCP handshake and no new thread per request
    # Headers and body are two writes: with Nagle on, the body waits for the client's delayed ACK
    # of the headers (~40 ms on Linux) on a kept-alive connection.
    disable_nagle_algorithm = True
    timeout = 10  # an idle keep-alive connection is closed after this (and frees its thread)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(
        self, status: int, body: dict[str, Any] | bytes, *headers: tuple[str, str], ctype: str = _JSON
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        elif self.request_version == "HTTP/1.0":  # kept open only on its Connection: keep-alive
            self.send_header("Connection", "keep-alive")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _refuse(self, status: int, message: str, *headers: tuple[str, str]) -> None:
        """An error answered before the body was read: the connection cannot be reused."""
        self.close_connection = True
        self._send(status, {"error": message}, *headers)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's errors as JSON; its 501 for an unknown method as a 405."""
        path = (getattr(self, "path", None) or "").split("?", 1)[0]
        headers: tuple[tuple[str, str], ...] = ()
        if code == 501:  # http.server's answer to a method without a do_<METHOD>
            allowed = "POST" if path == "/score" else "GET"
            code, message = 405, f"method {self.command} not allowed on {path or '/'}; allowed: {allowed}"
            headers = (("Allow", allowed),)
        if self.request_version == "HTTP/0.9" and len(getattr(self, "requestline", "").split()) >= 3:
            self.request_version = "HTTP/1.0"  # a bad version word, not a 0.9 client: send a status line
        self.log_error("code %d, message %s", code, message)
        self._refuse(code, message or self.responses.get(code, ("error",))[0], *headers)

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
            self._send(200, self.server.metrics.render().encode(), ctype=CONTENT_TYPE)
        elif path == "/score":
            self._send(405, {"error": "POST /score"}, ("Allow", "POST"))
        else:
            self._send(404, {"error": f"no route GET {path}; try {_GET_PATHS}"})

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
        body = self._read_body(length)  # before admission: a slow client holds no scoring slot
        if body is None:
            return
        if not server.try_admit():
            retry = str(max(1, round(server.cfg.retry_after_s)))
            self._refuse(503, "overloaded: too many requests in flight; retry later", ("Retry-After", retry))
            return
        try:
            self._score(body)
        finally:
            server.release()

    def _read_body(self, length: int) -> bytes | None:
        """``length`` bytes within ``server.body_timeout_s`` in all; None once a 4xx is answered."""
        limit = self.server.body_timeout_s
        deadline, chunks, got = time.monotonic() + limit, [], 0
        try:
            while got < length:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)
                chunk = self.rfile.read1(min(length - got, 1 << 16))
                if not chunk:
                    self._refuse(
                        400, f"the body ended after {got} of the {length} bytes of its Content-Length"
                    )
                    return None
                chunks.append(chunk)
                got += len(chunk)
        except TimeoutError:
            self._refuse(408, f"got {got} of the {length} bytes of the body's Content-Length in {limit} s")
            return None
        finally:
            self.connection.settimeout(self.timeout)
        return b"".join(chunks)

    def _score(self, body: bytes) -> None:
        server = self.server
        try:
            req = json.loads(body)
            validate(server.schema, req)
        except RecursionError:
            self._send(400, {"error": "body is not valid JSON: nested too deeply"})
            return
        except json.JSONDecodeError as exc:
            self._send(400, {"error": f"body is not valid JSON: {exc}"})
            return
        except ValueError as exc:  # UnicodeDecodeError (not UTF-8), or the schema's message
            message = f"body is not valid JSON: {exc}" if isinstance(exc, UnicodeDecodeError) else str(exc)
            self._send(400, {"error": message})
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
