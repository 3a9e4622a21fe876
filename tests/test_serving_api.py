"""The scoring API in-process: validation, auth, overload, A/B arms, feature fallback, OpenAPI.

The model store and the learner are small doubles here (this is the HTTP layer's unit test);
tests/integration/test_serving_fleet.py runs real `ctr serve` processes over MLflow and Redis.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.config import ConfigError, ServingConfig
from pipeline.core.config_loader import load_config
from pipeline.core.pseudonyms import Pseudonymizer
from serving_bridge.ab import ABRouter, arm_of
from serving_bridge.app import ScoringApp
from serving_bridge.feature_fallback import FallbackFeatures
from serving_bridge.replica import Replica
from serving_bridge.server import ReplicaServer
from tests.test_model_cache import esmm_learner
from trainers.testing import tiny_learner


class ConstantModel:
    """Scores every row with one probability; keeps the features of the last request it scored."""

    def __init__(self, p: float) -> None:
        self.p = p
        self.seen_features: list[dict[str, float]] = []
        self.seen_dense: list[dict[str, float]] = []

    def predict_request(
        self,
        user: str,
        items: Sequence[str],
        context: Any,
        feats: Sequence[dict[str, float]],
        dense: Sequence[dict[str, float]] | None = None,
    ) -> list[float]:
        if user != "u_warmup":  # the replica's warm-up request at load
            self.seen_features = list(feats)
            self.seen_dense = [{} for _ in items] if dense is None else [dict(d) for d in dense]
        return [self.p] * len(items)


class DictStore:
    def __init__(self, models: dict[str, ConstantModel], aliases: dict[str, str]) -> None:
        self.models, self.aliases = models, aliases

    def resolve(self, alias: str) -> str | None:
        return self.aliases.get(alias)

    def load(self, version: str) -> ConstantModel:
        return self.models[version]


class BrokenModel(ConstantModel):
    def predict_request(self, user: str, items: Sequence[str], *args: Any) -> list[float]:
        if user != "u_warmup":
            raise RuntimeError("a model bug")
        return super().predict_request(user, items, *args)


class BrokenReader:
    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        raise ConnectionError("redis is away")


class Client:
    def __init__(self, port: int) -> None:
        self.port = port

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        ctype = resp.getheader("Content-Type", "")
        # resp.headers: names are case-insensitive (uvicorn sends them in lower case)
        return resp.status, resp.headers, json.loads(raw) if "json" in ctype else raw.decode()

    def score(self, body: Any, **headers: str) -> tuple[int, Any, Any]:
        return self.request("POST", "/score", body, headers)


@contextmanager
def serve(
    store: DictStore,
    cfg: ServingConfig,
    reader: Any = None,
    challenger: bool = False,
    *,
    retry_s: float = 60.0,
    timeout_s: float | None = None,
) -> Iterator[tuple[Client, ScoringApp]]:
    """A real server (uvicorn on a free port, in a thread): its transport is part of what is tested."""
    with serve_replica(store, cfg, reader, challenger, retry_s=retry_s, timeout_s=timeout_s) as server:
        yield Client(server.port), server.app


@contextmanager
def serve_replica(
    store: DictStore,
    cfg: ServingConfig,
    reader: Any = None,
    challenger: bool = False,
    *,
    retry_s: float = 60.0,
    timeout_s: float | None = None,
) -> Iterator[ReplicaServer]:
    features = FallbackFeatures(reader, retry_s=retry_s, timeout_s=timeout_s)
    pseudo = Pseudonymizer("test-key")

    def replica(alias: str) -> Replica:
        return Replica("r1", store, features, pseudo, alias=alias, poll_interval_s=0.05)

    router = ABRouter(
        replica("champion"), replica("challenger") if challenger else None, cfg.challenger_share
    )
    router.start()
    for r in router.replicas:
        r.check_once()
    server = ReplicaServer("127.0.0.1", 0, router, cfg, features=features, notify=False).start()
    try:
        yield server
    finally:
        server.stop()
        router.stop()
        features.close()


@pytest.fixture
def api() -> Iterator[tuple[Client, ScoringApp]]:
    store = DictStore({"3": ConstantModel(0.25)}, {"champion": "3"})
    with serve(store, ServingConfig(max_candidates=5)) as api:
        yield api


GOOD = {"user_id": "alice", "context": {"site": "s1"}, "items": ["a", "b", "c"]}


def test_a_good_request_gets_one_probability_per_candidate_and_the_version(api) -> None:
    client, _ = api
    status, _, body = client.score(GOOD)
    assert status == 200
    assert body == {"version": "3", "arm": "champion", "replica": "r1", "probabilities": [0.25] * 3}
    assert client.score({"user_id": "bob", "items": ["x"]})[0] == 200  # context is optional


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        ([1, 2], "body: must be an object, got an array"),
        ({**GOOD, "extra": 1}, "unknown field(s) ['extra']"),
        ({"items": ["a"]}, "missing required field(s) ['user_id']"),
        ({**GOOD, "user_id": 7}, "user_id: must be a string, got a number"),
        ({**GOOD, "user_id": ""}, "user_id: must not be empty"),
        ({**GOOD, "items": "a"}, "items: must be an array, got a string"),
        ({**GOOD, "items": []}, "items: at least 1 entries, got 0"),
        (
            {**GOOD, "items": ["a", None]},
            "items[1]: an item is an id (string) or an object {id, dense}, got null",
        ),
        ({**GOOD, "items": list("abcdef")}, "items: at most 5 entries, got 6"),
        ({**GOOD, "context": {"site": 1}}, "context.site: must be a string, got a number"),
        ({**GOOD, "context": ["site"]}, "context: must be an object, got an array"),
        ({**GOOD, "user_id": True}, "user_id: must be a string, got a boolean"),
        # a lone surrogate escape: the JSON parser refuses it, before any field is read
        ({**GOOD, "user_id": "\ud800"}, "body is not valid Unicode text"),
        ({**GOOD, "items": ["a", "x\udfff"]}, "body is not valid Unicode text"),
        ({**GOOD, "context": {"site\ud800": "s1"}}, "body is not valid Unicode text"),
        (b'{"user_id": "u", "items": ' + b"[" * 100_000, "nested too deeply"),  # under the size limit
    ],
)
def test_bad_requests_get_400_with_a_message(api, body: Any, message: str) -> None:
    client, _ = api
    status, _, answer = client.score(body)
    assert status == 400
    assert message in answer["error"]


def test_transport_errors_get_their_own_4xx(api) -> None:
    client, server = api
    server.cfg.max_body_bytes = 100
    assert client.score({**GOOD, "items": ["x" * 200]})[0] == 413
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=10)
    conn.putrequest("POST", "/score")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["error"]
    conn.close()
    assert client.request("POST", "/nowhere", GOOD)[0] == 404
    assert client.request("GET", "/nowhere")[0] == 404
    assert client.request("GET", "/healthz")[0] == 200  # still healthy after all that


def test_openapi_document_is_served_and_is_what_validates(api) -> None:
    client, server = api
    status, _, spec = client.request("GET", "/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    request = spec["components"]["schemas"]["ScoreRequest"]
    assert request["properties"]["items"]["maxItems"] == 5  # follows serving.max_candidates
    assert request is not server.schema and request == server.schema  # served = the one in use
    assert set(spec["paths"]) >= {"/score", "/healthz", "/readyz", "/metrics", "/openapi.json"}


def test_bearer_token_guards_score_but_not_the_probes() -> None:
    store = DictStore({"1": ConstantModel(0.5)}, {"champion": "1"})
    with serve(store, ServingConfig(auth_token="s3cret")) as (client, _):
        status, headers, body = client.score(GOOD)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer") and body["error"]
        assert client.score(GOOD, Authorization="Bearer wrong")[0] == 401
        assert client.score(GOOD, Authorization="s3cret")[0] == 401
        assert client.score(GOOD, Authorization="Bearer s3cret")[0] == 200
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert client.request("GET", path)[0] == 200


class GatedReader:
    """An online store whose reads wait (on the event loop, as the real one does) until released."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        raise AssertionError("the serving path reads with aget")

    async def aget(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        import asyncio

        self.entered.release()
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        return [{"user_ctr_1h": 0.5} for _ in item_ids]


def test_overload_gets_503_with_retry_after_and_the_server_recovers() -> None:
    reader, model = GatedReader(), ConstantModel(0.5)
    store = DictStore({"1": model}, {"champion": "1"})
    with serve(store, ServingConfig(max_in_flight=2, retry_after_s=2), reader=reader) as (client, server):
        results: list[int] = []

        def hold() -> None:
            results.append(client.score(GOOD)[0])

        held = [threading.Thread(target=hold) for _ in range(2)]
        for t in held:
            t.start()
        for _ in held:  # both slots taken: the two requests are reading their features
            assert reader.entered.acquire(timeout=30)
        status, headers, body = client.score(GOOD)
        assert status == 503 and headers["Retry-After"] == "2" and "overloaded" in body["error"]
        assert client.request("GET", "/healthz")[0] == 200  # probes are not admission-controlled
        reader.release.set()
        for t in held:
            t.join(30)
        assert results == [200, 200]
        assert client.score(GOOD)[0] == 200  # healthy again once the load drops
        metrics = client.request("GET", "/metrics")[2]
        assert 'ctr_serving_requests_total{code="503"} 1.0' in metrics
        assert server.in_flight == 0


def test_no_model_yet_is_503_and_not_ready() -> None:
    with serve(DictStore({}, {}), ServingConfig()) as (client, _):
        status, headers, _ = client.score(GOOD)
        assert status == 503 and headers["Retry-After"] == "1"
        assert client.request("GET", "/readyz")[0] == 503
        assert client.request("GET", "/healthz")[0] == 200


def test_challenger_scores_its_share_of_users_by_a_stable_hash() -> None:
    store = DictStore(
        {"1": ConstantModel(0.1), "2": ConstantModel(0.9)}, {"champion": "1", "challenger": "2"}
    )
    users = [f"user-{i}" for i in range(60)]
    with serve(store, ServingConfig(challenger_share=0.5), challenger=True) as (client, _):
        answers = {u: client.score({"user_id": u, "items": ["a"]})[2] for u in users}
        for u, body in answers.items():
            arm = arm_of(u, 0.5)
            assert body["arm"] == arm
            assert (body["version"], body["probabilities"]) == (
                ("2", [0.9]) if arm == "challenger" else ("1", [0.1])
            )
        arms = [b["arm"] for b in answers.values()]
        assert 10 < arms.count("challenger") < 50  # both arms get traffic
        assert client.score({"user_id": users[0], "items": ["a"]})[2]["arm"] == answers[users[0]]["arm"]
        metrics = client.request("GET", "/metrics")[2]
        n = arms.count("challenger") + (answers[users[0]]["arm"] == "challenger")
        assert f'ctr_serving_scored_total{{arm="challenger",version="2"}} {float(n)}' in metrics
        assert client.request("GET", "/version")[2]["challenger"] == "2"
        assert 'ctr_serving_version{replica="r1",version="1"} 1.0' in metrics  # the champion's
        assert 'ctr_serving_challenger_version{replica="r1",version="2"} 2.0' in metrics


def test_challenger_share_without_a_challenger_version_scores_with_the_champion() -> None:
    store = DictStore({"1": ConstantModel(0.1)}, {"champion": "1"})
    with serve(store, ServingConfig(challenger_share=1.0), challenger=True) as (client, _):
        assert client.score(GOOD)[2]["arm"] == "champion"


def test_online_store_failure_scores_with_default_features_and_counts_it() -> None:
    model = ConstantModel(0.3)
    store = DictStore({"1": model}, {"champion": "1"})
    with serve(store, ServingConfig(), reader=BrokenReader()) as (client, server):
        for _ in range(2):  # a failure or two is that request on defaults, not an outage
            assert client.score(GOOD)[0] == 200
            assert "ctr_serving_feature_store_up 1" in client.request("GET", "/metrics")[2]
        assert model.seen_features and model.seen_features[0]["user_impressions_1h"] == 0.0
        assert model.seen_features[0]["item_ctr_1h"] == pytest.approx(0.05)  # the prior, not 0
        for _ in range(3):  # the 3rd failure in a row: the store is not asked again for 60 s
            assert client.score(GOOD)[0] == 200
        assert server.features is not None and server.features.failures == 3
        metrics = client.request("GET", "/metrics")[2]
        assert "ctr_serving_feature_fallbacks_total 5.0" in metrics
        assert "ctr_serving_feature_store_up 0" in metrics


def test_auth_token_is_a_secret_read_from_the_environment_only(tmp_path) -> None:
    toml = tmp_path / "ctr.toml"
    toml.write_text('[serving]\nauth_token = "in-a-file"\n')
    with pytest.raises(ConfigError, match="CTR_SERVING_AUTH_TOKEN"):
        load_config(toml, env={})
    cfg = load_config(env={"CTR_SERVING_AUTH_TOKEN": "t0k"})
    assert cfg.serving.auth_token.get_secret_value() == "t0k"
    assert "auth_token" not in cfg.to_dict()["serving"] and "t0k" not in repr(cfg)


def test_a_failing_model_answers_500_and_the_server_stays_up() -> None:
    with serve(DictStore({"1": BrokenModel(0.5)}, {"champion": "1"}), ServingConfig()) as (client, _):
        status, _, body = client.score(GOOD)
        assert status == 500 and "internal error" in body["error"]
        assert client.request("GET", "/healthz")[0] == 200


class StoreReader:
    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        return [{"user_ctr_1h": 0.5} for _ in item_ids]


class HangingReader:
    """An online store that accepts a read and never answers (until ``release`` is set)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        self.calls += 1
        assert self.release.wait(60)
        return [{"user_ctr_1h": 0.5} for _ in item_ids]


class SometimesLateReader:
    """An online store whose ``late`` next reads stall past the feature timeout."""

    def __init__(self) -> None:
        self.late = 0
        self.calls = 0

    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]:
        self.calls += 1
        if self.late:
            self.late -= 1
            time.sleep(0.3)
        return [{"user_ctr_1h": 0.5} for _ in item_ids]


def test_one_late_feature_read_scores_that_request_with_defaults_and_the_next_reads_the_store() -> None:
    """A read late by a stall (the VM descheduled the replica) is not an outage: backing off on it
    put the next second of requests on default features."""
    reader, model = SometimesLateReader(), ConstantModel(0.3)
    store = DictStore({"1": model}, {"champion": "1"})
    with serve(store, ServingConfig(), reader=reader, timeout_s=0.1) as (client, server):
        for late in (1, 2):
            reader.late = late
            for _ in range(late):
                assert client.score(GOOD)[0] == 200
                assert model.seen_features[0]["user_ctr_1h"] == pytest.approx(0.05)  # defaults
            assert client.score(GOOD)[0] == 200
            assert model.seen_features[0]["user_ctr_1h"] == 0.5  # asked again at once: the store's
        assert server.features is not None
        assert (server.features.failures, server.features.fallbacks, reader.calls) == (3, 3, 5)
        assert "ctr_serving_feature_store_up 1" in client.request("GET", "/metrics")[2]


def test_a_replica_started_before_the_joiner_connects_to_the_store_once_it_exists(tmp_path: Path) -> None:
    """Until the joiner has set up its Feast store every read fails (defaults are served); after, the
    reader opens it and reads from it."""
    from serving_bridge.process import BackgroundFeatureReader

    feast_dir = tmp_path / "feast"
    connects: list[int] = []

    def connect() -> StoreReader:
        connects.append(1)
        return StoreReader()

    opener = BackgroundFeatureReader(connect, feast_dir)
    features = FallbackFeatures(opener, retry_s=0.0)
    assert features.get("u", ["a"])[0]["user_ctr_1h"] != 0.5 and features.fallbacks == 1  # defaults
    assert not opener.open_once()  # no store yet
    feast_dir.mkdir()
    (feast_dir / "feature_store.yaml").write_text("project: x\n")
    assert opener.open_once() and opener.open_once()
    assert features.get("u", ["a", "b"]) == [{"user_ctr_1h": 0.5}] * 2
    assert connects == [1]  # connected once, then reused


def test_a_hanging_online_store_read_scores_with_defaults_after_the_feature_timeout() -> None:
    """A read that never returns (Redis blackholed, a client retrying with back-off) must not hold
    the request: it is answered with default features, counted as a fallback."""
    hanging, model = HangingReader(), ConstantModel(0.3)
    store = DictStore({"1": model}, {"champion": "1"})
    with serve(store, ServingConfig(), reader=hanging, timeout_s=0.05) as (client, server):
        try:
            status, _, body = client.score(GOOD)  # the reader holds for 60 s, the client waits 30
            assert status == 200 and body["probabilities"] == [0.3] * 3
            assert model.seen_features[0]["user_ctr_1h"] == pytest.approx(0.05)  # the default
            assert server.features is not None
            assert (server.features.fallbacks, server.features.failures) == (1, 1)
            for _ in range(2):  # two more late reads in a row: then the store is left alone
                assert client.score(GOOD)[0] == 200
            assert client.score(GOOD)[0] == 200 and hanging.calls == 3  # not asked again for retry_s
            assert (server.features.fallbacks, server.features.failures) == (4, 3)
            assert "ctr_serving_feature_store_up 0" in client.request("GET", "/metrics")[2]
        finally:
            hanging.release.set()


def test_requests_score_with_defaults_while_the_store_is_being_opened(tmp_path: Path) -> None:
    """Opening the store (the joiner's set-up lock, the first Redis connection) happens on the
    opener's thread: a request meanwhile gets default features at once, then the store's."""
    from serving_bridge.process import BackgroundFeatureReader

    feast_dir = tmp_path / "feast"
    feast_dir.mkdir()
    (feast_dir / "feature_store.yaml").write_text("project: x\n")
    entered, release = threading.Event(), threading.Event()

    def connect() -> StoreReader:  # e.g. the first Redis connection while Redis is away
        entered.set()
        assert release.wait(60)
        return StoreReader()

    opener = BackgroundFeatureReader(connect, feast_dir, retry_s=0.01).start()
    model = ConstantModel(0.3)
    store = DictStore({"1": model}, {"champion": "1"})
    with serve(store, ServingConfig(), reader=opener, retry_s=0.0, timeout_s=5.0) as (client, server):
        try:
            assert entered.wait(30)
            assert client.score(GOOD)[0] == 200  # while connect() is blocked
            assert model.seen_features[0]["user_ctr_1h"] == pytest.approx(0.05)
            assert server.features is not None and server.features.fallbacks == 1
        finally:
            release.set()
        for _ in range(3000):
            if opener.is_open:
                break
            threading.Event().wait(0.01)
        assert client.score(GOOD)[0] == 200 and model.seen_features[0]["user_ctr_1h"] == 0.5
    opener.stop()


@contextmanager
def silent_redis() -> Iterator[tuple[Any, Any]]:
    """(listener, a Feast store stand-in pointing at it): a "Redis" that accepts and never answers."""
    import socket
    from types import SimpleNamespace

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        host, port = listener.getsockname()
        online = SimpleNamespace(type="redis", redis_type="redis", connection_string=f"{host}:{port}")
        yield listener, SimpleNamespace(config=SimpleNamespace(online_store=online, project="p"))
    finally:
        listener.close()


def test_the_direct_redis_reader_does_not_retry_a_failed_read() -> None:
    """redis-py retries a failed command 3 times with back-off (seconds) by default; a serving read
    must fail at once. Against a Redis that accepts and never answers: one connection, not four."""
    from features.redis_reader import RedisFeatureReader

    with silent_redis() as (listener, store):
        reader = RedisFeatureReader.for_store(store, socket_timeout=0.05, socket_connect_timeout=0.05)
        with pytest.raises(Exception, match=r"[Tt]imeout"):
            reader.get("u", ["a"])
        listener.settimeout(0.2)
        accepted = []
        try:
            while True:
                accepted.append(listener.accept()[0])
        except TimeoutError:
            pass
        assert len(accepted) == 1
        for conn in accepted:
            conn.close()


def test_an_async_read_from_a_redis_that_never_answers_ends_at_the_feature_deadline() -> None:
    """The serving path (FallbackFeatures.aget -> RedisFeatureReader.aget) has no per-read socket
    timeout: the request's deadline bounds it. Against a Redis that accepts and never answers,
    each request gets default features within about the deadline, and the abandoned connection
    is closed (its late replies must never answer a later request)."""
    import asyncio

    from features.redis_reader import RedisFeatureReader

    with silent_redis() as (_, store):
        reader = RedisFeatureReader.for_store(store, socket_timeout=30, socket_connect_timeout=1)
        features = FallbackFeatures(reader, retry_s=0.0, timeout_s=0.05)

        async def two_requests() -> tuple[list[list[dict[str, float]]], float]:
            started = time.monotonic()
            rows = [await features.aget("u", ["a", "b"]) for _ in range(2)]
            return rows, time.monotonic() - started

        rows, took = asyncio.run(two_requests())
        defaults = features._defaults
        assert rows == [[defaults, defaults]] * 2
        assert (features.fallbacks, features.failures) == (2, 2)
        assert took < 10  # the deadline (0.05 s each), not the 30 s socket timeout
        assert reader.aclient.connection_pool._in_use_connections == set()
        assert all(not c.is_connected for c in reader.aclient.connection_pool._available_connections)


def test_a_request_queued_when_the_replica_stops_is_answered_not_reset() -> None:
    """SIGTERM stops the accept loop; a connection the kernel already accepted (in the listen
    backlog) is answered before the listener closes, instead of being reset mid-request."""
    import asyncio

    store = DictStore({"3": ConstantModel(0.25)}, {"champion": "3"})
    with serve_replica(store, ServingConfig()) as server:
        loop = server.server.servers[0].get_loop()
        asyncio.run_coroutine_threadsafe(server.server.stop_accepting(), loop).result(
            10
        )  # SIGTERM's first step
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", "/score", body=json.dumps(GOOD).encode())  # ... but the kernel takes this
        server.stop()
        assert server.server.backlog_answered == 1
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["probabilities"] == [0.25] * 3
        conn.close()


class RawConn:
    """One TCP connection that writes bytes as given and reads whole responses (several in a row)."""

    def __init__(self, port: int) -> None:
        import socket

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], Any]:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"closed without a (whole) response: {self.buf!r}"
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers["content-length"])
        while len(self.buf) < length:
            assert self._fill(), "closed mid-body"
        body, self.buf = self.buf[:length], self.buf[length:]
        assert headers["content-type"] == "application/json" or not body.startswith(b"{"), headers
        return int(status_line.split()[1]), headers, json.loads(body) if body else None

    def closed_by_server(self) -> bool:
        return not self.buf and not self._fill()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("method", ["TRACE", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "BREW"])
@pytest.mark.parametrize(("path", "allowed"), [("/score", "POST"), ("/healthz", "GET")])
def test_undeclared_methods_get_405_with_allow_and_a_json_message(api, method, path, allowed) -> None:
    client, _ = api
    status, headers, body = client.request(method, path)
    assert status == 405 and headers["Allow"] == allowed
    assert f"method {method} not allowed on {path}" in body["error"]
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=30)
    conn.request("HEAD", "/healthz")  # no do_HEAD: 405 too, without a body
    resp = conn.getresponse()
    assert resp.status == 405 and resp.getheader("Allow") == "GET" and resp.read() == b""
    conn.close()
    assert client.request("GET", "/score")[1]["Allow"] == "POST"


def test_malformed_request_lines_get_json_errors(api) -> None:
    client, _ = api
    conn = RawConn(client.port)
    conn.sock.sendall(b"GET /healthz HTTP/9.9\r\n\r\n")
    status, headers, body = conn.response()
    assert status == 505 and body["error"] and headers["connection"] == "close"
    conn.close()


def test_a_body_shorter_than_its_content_length_gets_408_not_a_hang(api) -> None:
    client, server = api
    server.body_timeout_s = 0.2  # a deadline for the whole body; the client below never sends it
    conn = RawConn(client.port)
    conn.sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b'{"user_id"')
    status, headers, body = conn.response()
    assert status == 408 and "got 10 of the 100 bytes" in body["error"] and headers["connection"] == "close"
    assert conn.closed_by_server() and server.in_flight == 0  # the slow body held no scoring slot
    conn.close()
    conn = RawConn(client.port)  # the client closes its side first: 400, not a parse of half a body
    conn.sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    conn.sock.shutdown(1)  # SHUT_WR
    status, _, body = conn.response()
    assert status == 400 and "ended after 1 of the 100 bytes" in body["error"]
    conn.close()
    assert client.score(GOOD)[0] == 200


def test_http_1_0_keep_alive_is_honoured_as_ab_k_sends_it(api) -> None:
    """`ab -k` speaks HTTP/1.0 with Connection: keep-alive and waits for the server to close unless
    the answer says keep-alive: two requests on one connection, each answered at once."""
    client, _ = api
    body = json.dumps(GOOD).encode()
    request = (
        b"POST /score HTTP/1.0\r\nConnection: Keep-Alive\r\nHost: x\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    conn = RawConn(client.port)
    for _ in range(2):
        conn.sock.sendall(request)
        status, headers, answer = conn.response()
        assert status == 200 and answer["probabilities"] == [0.25] * 3
        assert headers["connection"] == "keep-alive" and int(headers["content-length"]) > 0
    conn.close()
    conn = RawConn(client.port)  # plain HTTP/1.0: answered, then closed by the server
    conn.sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    status, headers, _ = conn.response()
    assert status == 200 and headers["connection"] == "close" and conn.closed_by_server()
    conn.close()


def test_a_bad_feature_path_stops_ctr_serve_at_start_not_in_the_opener_thread() -> None:
    from serving_bridge.process import run_replica

    cfg = load_config(env={"CTR_REGISTRY_TRACKING_URI": "http://127.0.0.1:9"})
    cfg.serving.feature_path = "x"  # type: ignore[assignment]  # load_config refuses it (test_config.py)
    with pytest.raises(ValueError, match="feature_path = 'x' must be one of"):
        run_replica(cfg, "127.0.0.1", 0, "r1")


def test_dense_inputs_reach_the_model_per_item_and_bad_ones_are_a_400() -> None:
    model = ConstantModel(0.3)
    with serve(DictStore({"1": model}, {"champion": "1"}), ServingConfig()) as (client, _):
        items = [{"id": "a", "dense": {"x": 0.5}}, "b"]
        assert client.score({**GOOD, "items": items, "dense": {"bid_floor": 2, "x": 1.5}})[0] == 200
        assert model.seen_dense == [{"bid_floor": 2.0, "x": 0.5}, {"bid_floor": 2.0, "x": 1.5}]
        assert client.score({**GOOD, "items": ["a", "b"]})[0] == 200
        assert model.seen_dense == [{}, {}]  # none sent: missing, as training has it
        status, _, answer = client.score({**GOOD, "dense": {"x": "1"}})
        assert status == 400 and answer["error"].startswith("dense.x: must be a number")
        status, _, answer = client.score({**GOOD, "items": [{"id": "a", "dense": {"x": True}}]})
        assert status == 400 and "items[0]" in answer["error"] and "ItemRequest" not in answer["error"]


def test_a_multi_task_model_answers_conversion_probabilities_and_a_click_only_one_leaves_them_out() -> None:
    """ESMM's answer has pCVR per candidate beside pCTR (what its replica scored); after a swap to a
    DeepFM the key is gone. Both answers match the served document's ScoreResponse, which lists the
    field as optional and not nullable."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    models: dict[str, Any] = {"1": esmm_learner(seed=1), "2": tiny_learner(seed=1)}
    store = DictStore(models, {"champion": "1"})
    with serve(store, ServingConfig(max_candidates=5)) as (client, app):
        spec = client.request("GET", "/openapi.json")[2]
        schema = spec["components"]["schemas"]["ScoreResponse"]
        field = schema["properties"]["conversion_probabilities"]
        assert "conversion_probabilities" not in schema["required"] and "probabilities" in schema["required"]
        assert field["type"] == "array" and field["items"] == {"type": "number"}
        assert "anyOf" not in field and "default" not in field and "absent" in field["description"].lower()
        valid = jsonschema_rs.Draft202012Validator(schema)

        status, _, body = client.score(GOOD)
        assert status == 200 and body["version"] == "1"
        valid.validate(body)
        replica = app.router.champion
        scored = replica.score(GOOD["user_id"], GOOD["context"], GOOD["items"])
        assert body["probabilities"] == scored.probabilities
        assert body["conversion_probabilities"] == scored.conversions
        assert len(body["conversion_probabilities"]) == 3
        assert all(0.0 <= p <= 1.0 for p in body["conversion_probabilities"])

        store.aliases["champion"] = "2"
        assert replica.check_once()
        status, _, body = client.score(GOOD)
        assert status == 200 and body["version"] == "2" and len(body["probabilities"]) == 3
        assert "conversion_probabilities" not in body
        valid.validate(body)
