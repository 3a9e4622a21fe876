"""The scoring replica's ASGI application (Starlette): routes, admission, JSON answers.

- ``POST /score`` ``{"user_id", "context", "items", "dense"}`` -> ``{"version", "arm", "replica",
  "probabilities"}`` (an item is an id or ``{"id", "dense"}``), validated by the pydantic models
  of :mod:`serving_bridge.openapi`; a multi-task model's answer has ``"conversion_probabilities"``
  too (pCVR per candidate), a click-only model's has no such key;
- ``GET /openapi.json`` (generated from those models), ``/healthz``, ``/readyz`` (503 until a model
  is loaded), ``/version``, ``/metrics``.

The event loop does all of a request: it parses, admits, awaits the feature read
(:meth:`Replica.ascore`: redis.asyncio, under ``serving.feature_timeout_s``), runs the forward
(~0.4 ms for 100 rows) and answers. No thread: in one process threads only queue for the GIL
(a pool of eight spent a third of the replica's py-spy samples waiting for it; one scoring thread
beside the loop cost 5-10% more CPU per request than none, and longer tails). Processes
(``serving.workers``) use the other cores. A forward that hangs stops its process's loop and its
``/healthz``; with one process systemd's watchdog (pinged from that loop) then restarts it; the
parent of several workers replaces one whose loop has not ticked for ``serving.worker_hang_s``. At most
``serving.max_in_flight`` requests are admitted at once: one more is answered ``503`` with
``Retry-After`` at once, so latency stays bounded under overload. A request takes the model
reference once (:meth:`Replica.ascore`), so it finishes on the version it started with whatever
swaps meanwhile.

Every answer, errors included, is JSON: an undeclared method is ``405`` with ``Allow`` (HEAD too:
no route declares it), an unknown path ``404``; a body is refused before it is read when it is
chunked (``411``) or larger than ``serving.max_body_bytes`` (``413``), and must arrive in full
within :attr:`ScoringApp.body_timeout_s` (``408``; ``400`` if the client closes first), before a
scoring slot is taken. A refused request closes its connection (its body may be unread).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from pipeline.core.config import ServingConfig
from pipeline.core.metrics import CONTENT_TYPE, LATENCY_BUCKETS_S, Registry, multiprocess_dir
from serving_bridge.feature_fallback import FallbackFeatures
from serving_bridge.openapi import (
    HealthBody,
    ItemRequest,
    ReadyBody,
    ScoreResponse,
    VersionBody,
    component_schemas,
    error_message,
    openapi_spec,
    score_request_model,
)
from serving_bridge.serving_metrics import collect_replica_metrics
from serving_bridge.worker_metrics import WorkerStates

__all__ = ["ScoringApp"]

log = logging.getLogger(__name__)
_JSON = "application/json"
_GET_PATHS = "/healthz, /readyz, /version, /metrics, /openapi.json; or POST /score"


def _json(status: int, body: dict[str, Any], *headers: tuple[str, str], close: bool = False) -> Response:
    extra = dict(headers)
    if close:
        extra["connection"] = "close"
    return Response(json.dumps(body).encode(), status, extra or None, _JSON)


def _model(status: int, body: BaseModel) -> Response:
    return Response(body.model_dump_json().encode(), status, media_type=_JSON)


def _error(status: int, message: str, *headers: tuple[str, str], close: bool = False) -> Response:
    return _json(status, {"error": message}, *headers, close=close)


class ScoringApp:
    """The ASGI app of one replica process; ``router`` scores, ``features`` is reported in /metrics."""

    body_timeout_s = 2.0  # a POST body not complete this long after its headers gets 408

    def __init__(
        self,
        router: Any,
        cfg: ServingConfig | None = None,
        *,
        features: FallbackFeatures | None = None,
        worker: int = 0,
    ) -> None:
        self.router = router
        self.cfg = cfg or ServingConfig()
        self.features = features
        self.request_model = score_request_model(self.cfg.max_candidates)
        self.spec = openapi_spec(self.cfg.max_candidates, auth=bool(self.cfg.auth_token))
        self.spec_body = json.dumps(self.spec).encode()
        self.schema = component_schemas("ScoreRequest", self.request_model)["ScoreRequest"]
        token = self.cfg.auth_token.get_secret_value() if self.cfg.auth_token else ""
        self._token = f"Bearer {token}".encode() if token else b""
        self.in_flight = 0  # POST /score requests admitted now (changed on the event loop only)
        self.open_connections: Callable[[], int] | None = None  # set by the server it runs in
        folder = multiprocess_dir()  # set: one of several workers of a `ctr serve`
        # with several workers: this one's index (serving_bridge.worker_slot) labels its state
        self.metrics = Registry({"worker": str(worker)} if folder else None)
        self.metrics.on_scrape(lambda: collect_replica_metrics(self))
        # counted as requests happen, by prometheus-client itself: with serving.workers > 1
        # (PROMETHEUS_MULTIPROC_DIR set by the parent) these add up across the worker processes
        prom = None if folder else self.metrics.prometheus
        self.latency = Histogram(
            "ctr_serving_request_seconds", "POST /score latency", buckets=LATENCY_BUCKETS_S, registry=prom
        )
        self.requests = Counter("ctr_serving_requests", "POST requests", ["code"], registry=prom)
        self.scored = Counter(
            "ctr_serving_scored", "scored requests by arm and version", ["arm", "version"], registry=prom
        )
        self.exposition = self.metrics.prometheus
        self.worker_states: WorkerStates | None = None
        if folder:
            self.exposition = CollectorRegistry()
            MultiProcessCollector(self.exposition)
            # every worker's state (version, swaps, in flight, ...), each labelled with its index
            self.worker_states = WorkerStates(self.metrics, folder, str(worker))
            self.exposition.register(self.worker_states)
        routes = [
            Route("/score", self.score, methods=["POST"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]
        for route in routes:
            assert route.methods is not None
            route.methods.discard("HEAD")  # Starlette adds HEAD to GET routes; the API declares none
        self.starlette = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error})

    @property
    def replica(self) -> Any:
        """The champion replica (its version is "the" version of this process)."""
        return self.router.champion

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("http_version") != "1.0":
            await self.starlette(scope, receive, send)
            return
        # HTTP/1.0 closes after each answer unless the client asked for keep-alive and we say so
        asked = any(k == b"connection" and b"keep-alive" in v.lower() for k, v in scope.get("headers", ()))

        async def send_10(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"connection" for k, _ in headers):
                    headers.append((b"connection", b"keep-alive" if asked else b"close"))
                message = {**message, "headers": headers}
            await send(message)

        await self.starlette(scope, receive, send_10)

    # -- errors ------------------------------------------------------------------------------------
    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        method, path = request.method, request.url.path
        if exc.status_code == 405:
            allowed = "POST" if path == "/score" else "GET"
            message = f"method {method} not allowed on {path}; allowed: {allowed}"
            response = _error(405, message, ("Allow", allowed), close=method not in ("GET", "POST"))
        elif exc.status_code == 404:
            response = _error(404, f"no route {method} {path}; try {_GET_PATHS}", close=method == "POST")
        else:
            response = _error(exc.status_code, str(exc.detail), close=True)
        if method == "POST":
            self._count(response.status_code)
        return response

    def _count(self, status: int) -> None:
        self.requests.labels(code=str(status)).inc()

    # -- GET ---------------------------------------------------------------------------------------
    # each body is its model of serving_bridge.openapi, as the document describes it
    async def healthz(self, request: Request) -> Response:
        return _model(200, HealthBody(status="ok"))

    async def readyz(self, request: Request) -> Response:
        ready = self.router.ready
        return _model(200 if ready else 503, ReadyBody(ready=ready, version=self.router.champion.version))

    async def version(self, request: Request) -> Response:
        router = self.router
        challenger = router.challenger.version if router.challenger is not None else None
        champion = router.champion
        return _model(
            200, VersionBody(version=champion.version, challenger=challenger, replica=champion.name)
        )

    async def openapi(self, request: Request) -> Response:
        return Response(self.spec_body, 200, media_type=_JSON)

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.exposition), 200, media_type=CONTENT_TYPE)

    # -- POST /score -------------------------------------------------------------------------------
    async def score(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await self._score(request)
        finally:
            self.latency.observe(time.perf_counter() - started)
        self._count(response.status_code)
        return response

    async def _score(self, request: Request) -> Response:
        headers, cfg = request.headers, self.cfg
        if self._token and not hmac.compare_digest(headers.get("authorization", "").encode(), self._token):
            bearer = ("WWW-Authenticate", 'Bearer realm="ctr"')
            return _error(401, "missing or wrong bearer token", bearer, close=True)
        raw_length = headers.get("content-length")
        if headers.get("transfer-encoding") or raw_length is None:
            return _error(411, "send the JSON body with a Content-Length (no chunked encoding)", close=True)
        try:
            length = int(raw_length)
            if length < 0:
                raise ValueError(raw_length)
        except ValueError:
            return _error(400, f"bad Content-Length {raw_length!r}", close=True)
        if length > cfg.max_body_bytes:
            return _error(413, f"body of {length} bytes; at most {cfg.max_body_bytes}", close=True)
        body = await self._read_body(request, length)  # before admission: a slow client holds no slot
        if isinstance(body, Response):
            return body
        if self.in_flight >= cfg.max_in_flight:
            retry = str(max(1, round(cfg.retry_after_s)))
            return _error(503, "overloaded: too many requests in flight; retry later", ("Retry-After", retry))
        self.in_flight += 1
        try:
            return await self._scored(body)
        finally:
            self.in_flight -= 1

    async def _read_body(self, request: Request, length: int) -> bytes | Response:
        """``length`` bytes within :attr:`body_timeout_s` in all, or the 4xx that answers instead."""
        chunks: list[bytes] = []
        got, limit = 0, self.body_timeout_s
        try:
            async with asyncio.timeout(limit):
                async for chunk in request.stream():
                    chunks.append(chunk)
                    got += len(chunk)
        except ClientDisconnect:  # gone: nobody reads this answer
            return _error(400, f"the client left after {got} of the {length} bytes", close=True)
        except TimeoutError:
            return _error(
                408, f"got {got} of the {length} bytes of the body's Content-Length in {limit} s", close=True
            )
        if got < length:
            return _error(
                400, f"the body ended after {got} of the {length} bytes of its Content-Length", close=True
            )
        return b"".join(chunks)

    async def _scored(self, body: bytes) -> Response:
        try:
            req = self.request_model.model_validate_json(body)
        except ValidationError as exc:
            return _error(400, error_message(exc))
        router = self.router
        if not router.ready:
            return _error(503, "no model loaded yet", ("Retry-After", "1"))
        try:
            user_id: str = req.user_id  # type: ignore[attr-defined]
            context: dict[str, str] = req.context  # type: ignore[attr-defined]
            asked: list[str | ItemRequest] = req.items  # type: ignore[attr-defined]
            items = [it if isinstance(it, str) else it.id for it in asked]
            dense: dict[str, float] = req.dense  # type: ignore[attr-defined]
            rows: list[dict[str, float]] | None = None  # no dense inputs: all missing, as in training
            if dense or not all(isinstance(it, str) for it in asked):
                rows = [dense if isinstance(it, str) else dense | it.dense for it in asked]
            result, arm = await router.ascore(user_id, context, items, rows)
        except Exception:  # a model bug: answer (and count) a 500, keep the connection and the server
            log.exception("serve: scoring failed for a valid request")
            return _error(500, "internal error while scoring; see the replica's log")
        self.scored.labels(arm=arm, version=result.version).inc()
        answer = ScoreResponse(
            version=result.version,
            arm=arm,
            replica=result.replica,
            probabilities=result.probabilities,
            conversion_probabilities=result.conversions,
        )
        # exclude_none: a click-only model's answer has no conversion_probabilities (the schema's
        # optional, non-nullable field); no other field of ScoreResponse can be None
        return Response(answer.model_dump_json(exclude_none=True).encode(), 200, media_type=_JSON)
