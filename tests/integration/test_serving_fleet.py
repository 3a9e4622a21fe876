"""A fleet of `ctr serve` processes under steady load while the champion moves (real MLflow + Redis).

Two replicas, each its own process and port, read features from a Feast store on the test Redis
db and watch the registry (1 s poll + the Redis notification the trainer publishes). Client threads
keep scoring on loopback while three new versions are promoted one after the other and then the
alias is moved back to an older one (a rollback). Every response is counted: none may fail, each
must name a version that was champion at some point, and the replicas end on the final champion.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import redis
from mlflow import MlflowClient

from features.aggregations import StreamingFeatures
from features.store import FeatureWriter, open_store
from pipeline.core.config import Config, FeatureConfig, RegistryConfig
from pipeline.core.pseudonyms import Pseudonymizer
from serving_bridge.online_offset import RedisOffsets, offset_key, shift_probabilities
from serving_bridge.server import NOTIFY_CHANNEL
from trainers.online_offset import LiveServing
from trainers.online_residual import SparseResidual
from trainers.registry import MlflowModelStore
from trainers.testing import tiny_learner

REPLICAS = 2
CLIENT_THREADS = 4
ITEMS = [f"item{i}" for i in range(20)]
USERS = [f"user-{i}" for i in range(50)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def _post(port: int, body: bytes) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/score", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@dataclass
class Response:
    port: int
    sent_at: float  # monotonic
    status: int  # 0 = no HTTP answer (connection error)
    version: str | None


@dataclass
class Load:
    """``CLIENT_THREADS`` threads scoring round-robin over the replicas with keep-alive connections."""

    ports: list[int]
    responses: list[Response] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for k in range(CLIENT_THREADS):
            t = threading.Thread(target=self._run, args=(k,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def _run(self, k: int) -> None:
        conns = {p: http.client.HTTPConnection("127.0.0.1", p, timeout=10) for p in self.ports}
        n = 0
        while not self.stop.is_set():
            port = self.ports[(k + n) % len(self.ports)]
            user = USERS[(k * 7 + n) % len(USERS)]
            body = json.dumps({"user_id": user, "context": {"site": "s1"}, "items": ITEMS}).encode()
            sent = time.monotonic()
            try:
                conns[port].request("POST", "/score", body=body, headers={"Content-Type": "application/json"})
                resp = conns[port].getresponse()
                answer = json.loads(resp.read())
                ok = resp.status == 200 and len(answer["probabilities"]) == len(ITEMS)
                self.responses.append(
                    Response(port, sent, resp.status if ok else -resp.status, answer.get("version"))
                )
            except (OSError, http.client.HTTPException, ValueError):
                self.responses.append(Response(port, sent, 0, None))
                conns[port].close()  # reconnects on the next request
            n += 1
            time.sleep(0.005)
        for c in conns.values():
            c.close()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def _version_of(port: int) -> str | None:
    try:
        status, body = _get(port, "/version")
    except OSError:
        return None
    return json.loads(body)["version"] if status == 200 else None


@pytest.fixture
def fleet_env(services: dict[str, str], mlflow_scope, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment of the replicas: the scope's model, a Feast store with some features on db 15."""
    redis_url = services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15"
    project = f"it_{uuid.uuid4().hex[:12]}"
    state = tmp_path / "state"
    store = open_store(state / "joiner" / "feast", "production", redis_url, project)
    cfg = Config()
    pseudo = Pseudonymizer(cfg.validation.pseudonym_key.get_secret_value(), "u_")
    sf = StreamingFeatures(FeatureConfig())
    for k, user in enumerate(USERS[:25]):  # half the users and some items have features
        for item in ITEMS[: 5 + k % 10]:
            sf.record_impression(pseudo(user), item, 1_767_225_600_000 + k)
    FeatureWriter(store, offline=False).push(*sf.drain_dirty())
    yield {
        **os.environ,
        "CTR_REGISTRY_TRACKING_URI": mlflow_scope.uri,
        "CTR_REGISTRY_MODEL_NAME": mlflow_scope.model_name,
        "CTR_REGISTRY_EXPERIMENT": mlflow_scope.experiment_name,
        "CTR_DAEMON_REDIS_URL": redis_url,
        "CTR_DAEMON_STATE_DIR": str(state),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"*{project}".encode(), count=1000))
    if keys:
        client.delete(*keys)


def test_fleet_serves_every_request_through_three_promotions_and_a_rollback(
    fleet_env: dict[str, str], mlflow_scope, tmp_path: Path
) -> None:
    ports = [_free_port() for _ in range(REPLICAS)]
    procs, logs = [], []
    for port in ports:
        log = tmp_path / f"serve-{port}.log"
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "pipeline.ops.cli", "serve", "--port", str(port)],
                env=fleet_env,
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
            )
        )
    load: Load | None = None
    clean = False  # the exit codes are checked only when the test body passed (no masked error)
    try:
        # register four versions while the replicas start (one tiny model: a publish takes ~0.5 s)
        reg = RegistryConfig(model_name=mlflow_scope.model_name, experiment=mlflow_scope.experiment_name)
        store = MlflowModelStore(reg, mlflow_scope.uri)
        learner = tiny_learner(0, n=200)
        versions = [store.publish(learner, {"block": b}, {"logloss": 0.5}) for b in range(4)]
        client = MlflowClient(tracking_uri=mlflow_scope.uri, registry_uri=mlflow_scope.uri)
        notify = redis.Redis.from_url(fleet_env["CTR_DAEMON_REDIS_URL"])
        champions: list[str] = []

        def promote(version: str) -> None:
            """What the trainer (or an operator rolling back) does: move the alias, then announce it."""
            client.set_registered_model_alias(mlflow_scope.model_name, "champion", version)
            champions.append(version)
            notify.publish(NOTIFY_CHANNEL, b"1")

        promote(versions[0])
        for port, proc in zip(ports, procs, strict=True):
            _wait(
                f"replica {port} ready",
                lambda p=port, q=proc: q.poll() is None and _get_ok(p, "/readyz"),
                180,
            )

        # over the real process: bad input is a 400 with a message, the API describes itself
        status, answer = _post(ports[0], json.dumps({"user_id": "u", "items": ["a"], "extra": 1}).encode())
        assert status == 400 and "unknown field(s) ['extra']" in str(answer["error"])
        status, answer = _post(ports[1], json.dumps({"user_id": "u", "items": ["a"] * 1_001}).encode())
        assert status == 400 and "at most 1000 entries" in str(answer["error"])
        status, answer = _post(ports[1], b"{oops")
        assert status == 400 and "not valid JSON" in str(answer["error"])
        assert _get(ports[0], "/openapi.json")[0] == 200

        load = Load(ports).start()
        for target in (*versions[1:], versions[2]):  # three promotions, then a rollback to an older one
            promote(target)
            for port in ports:
                _wait(f"replica {port} on version {target}", lambda p=port, v=target: _version_of(p) == v)
                # and the load reached it on that version (so every step is exercised under load)
                _wait(
                    f"a response of {port} from version {target}",
                    lambda p=port, v=target: any(
                        r.port == p and r.version == v for r in load.responses[-200:]
                    ),
                )
        settled = time.monotonic()
        _wait(
            "more responses after the rollback settled",
            lambda: sum(r.sent_at > settled for r in load.responses) >= 20,
        )
        load.finish()

        responses = load.responses
        failures = [r for r in responses if r.status != 200]
        assert not failures, f"{len(failures)} failed of {len(responses)}: {failures[:5]}"
        served = {r.version for r in responses}
        assert served == set(champions)  # only versions that were champion; each of them served
        assert all(r.version == versions[2] for r in responses if r.sent_at > settled)
        assert [_version_of(p) for p in ports] == [versions[2]] * REPLICAS

        for port in ports:  # the per-version counters add up to what the clients received
            _, metrics = _get(port, "/metrics")
            scored = re.findall(
                r'^ctr_serving_scored_total\{arm="champion",version="(\d+)"\} (\S+)$', metrics, re.M
            )
            counted = {v: int(float(n)) for v, n in scored}
            received = {v: sum(r.port == port and r.version == v for r in responses) for v in served}
            assert {v: n for v, n in counted.items() if n} == {v: n for v, n in received.items() if n}
            assert 'ctr_serving_requests_total{code="500"}' not in metrics

        # the champion's online offset, as the trainer publishes it: within a poll every replica
        # adds it to each logit of that version (odds x 3), and none to another version's. A user
        # and items the store does not hold: their features are the defaults whether the store
        # answers or a read slower than serving.feature_timeout_s falls back (a loaded machine),
        # so the scores before and after differ by the offset alone.
        unknown = {"user_id": "offset-check-user", "items": ["offset-check-a", "offset-check-b"]}
        body = json.dumps({**unknown, "context": {"site": "s1"}}).encode()
        model = [_post(p, body)[1]["probabilities"] for p in ports]
        key = offset_key(Config().features.project, mlflow_scope.model_name)
        notify.hset(key, versions[3], "-5.0")  # not the champion's
        notify.hset(key, versions[2], repr(math.log(3.0)))
        want = [shift_probabilities(np.array(m), math.log(3.0)) for m in model]

        def offset_served() -> bool:
            answers = [_post(p, body)[1] for p in ports]
            return all(
                a["version"] == versions[2] and np.allclose(a["probabilities"], w, rtol=1e-9, atol=0)
                for a, w in zip(answers, want, strict=True)
            )

        _wait("the replicas adding the champion's online offset", offset_served, 30)
        # and its online residual beside it, written as the trainer writes both (one MULTI): here
        # its bias alone (the coordinate after the ids), -0.5 on every logit of that version
        buckets = learner.cfg.hash_buckets
        residual = SparseResidual(np.array([buckets]), np.array([-0.5]), buckets)
        RedisOffsets(fleet_env["CTR_DAEMON_REDIS_URL"], key).put(
            LiveServing(versions[2], math.log(3.0), residual)
        )
        want = [shift_probabilities(np.array(m), math.log(3.0) - 0.5) for m in model]
        _wait("the replicas adding the champion's online residual", offset_served, 30)
        notify.delete(key, f"{key}:residual")
        clean = True
    finally:
        if load is not None:
            load.finish()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log in zip(procs, logs, strict=True):
            try:
                rc = proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = None
            assert rc == 0 or not clean, (
                f"replica exited with {rc}; its log ends:\n{log.read_text(errors='replace')[-3000:]}"
            )


def _get_ok(port: int, path: str) -> bool:
    try:
        return _get(port, path)[0] == 200
    except OSError:
        return False
