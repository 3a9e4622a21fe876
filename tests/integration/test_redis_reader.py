"""The direct Redis feature path against Feast's SDK on the real Redis, and a replica with Redis away."""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis._parsers.hiredis import _AsyncHiredisParser

from features.aggregations import StreamingFeatures
from features.redis_reader import RedisFeatureReader, entity_redis_key
from features.repo.definitions import JOIN_KEYS
from features.store import FeatureWriter, OnlineFeatureReader, open_store
from pipeline.core.config import FeatureConfig, ServingConfig
from tests.test_serving_api import GOOD, ConstantModel, DictStore, serve

START_MS = 1_767_225_600_000


def _test_db_url(services: dict[str, str]) -> str:
    return services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15"  # never the production db 0


@pytest.fixture
def feast_store(services: dict[str, str], tmp_path: Path) -> Iterator[tuple[object, str]]:
    """A production-profile Feast store on the test Redis db, its own project; keys removed after."""
    project = f"it_{uuid.uuid4().hex[:12]}"
    url = _test_db_url(services)
    store = open_store(tmp_path / "feast", "production", url, project)
    yield store, url
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"*{project}".encode(), count=1000))
    if keys:
        client.delete(*keys)


def sdk_raw(store: object, user: str, items: list[str]) -> list[dict[str, float | None]]:
    """What get_online_features returns, value by value (None where it holds no value)."""
    sf = StreamingFeatures(FeatureConfig())
    refs = [f"user_stats:{n}" for n in sf.user_names] + [f"item_stats:{n}" for n in sf.item_names]
    proto = store.get_online_features(  # type: ignore[attr-defined]
        features=refs, entity_rows={"user_id": [user] * len(items), "item_id": items}
    ).proto
    rows: list[dict[str, float | None]] = [{} for _ in items]
    for name, vec in zip(proto.metadata.feature_names.val, proto.results, strict=True):
        if name in ("user_id", "item_id"):
            continue
        for row, value in zip(rows, vec.values, strict=True):
            kind = value.WhichOneof("val")
            row[name] = None if kind is None else float(getattr(value, kind))
    return rows


def test_direct_reads_equal_the_feast_sdk_for_present_and_missing_entities(feast_store) -> None:
    store, url = feast_store
    loop = asyncio.new_event_loop()  # aget's connections belong to one loop
    sf = StreamingFeatures(FeatureConfig())
    writer = FeatureWriter(store, offline=False)
    direct = RedisFeatureReader.for_store(store)
    sdk = OnlineFeatureReader(store)
    rng = random.Random(5)
    users, items = [f"u_{i}" for i in range(20)], [f"item{i}@p{i % 3}" for i in range(40)]
    ts = START_MS
    for push in range(4):  # several pushes: values overwritten, entities added
        for _ in range(500):
            ts += rng.randrange(1, 2_000)
            u, i = rng.choice(users[: 10 + 3 * push]), rng.choice(items[: 20 + 5 * push])
            sf.record_impression(u, i, ts)
            if rng.random() < 0.2:
                sf.record_click(u, i, ts + 1)
        writer.push(*sf.drain_dirty())
        candidates = [*items[:30], "never-seen-item", items[0]]  # missing and repeated candidates
        for user in ("u_0", users[12], "never-seen-user"):
            user_raw, items_raw = direct.read_raw(user, candidates)
            assert [user_raw | it for it in items_raw] == sdk_raw(store, user, candidates)
            assert direct.get(user, candidates) == sdk.get(user, candidates)
            assert loop.run_until_complete(direct.aget(user, candidates)) == sdk.get(user, candidates)
    # the asyncio reads went through the connection's hiredis reader (not the per-reply path)
    pooled = direct.aclient.connection_pool._available_connections
    assert pooled and all(isinstance(c._parser, _AsyncHiredisParser) for c in pooled)
    # an error reply midway (a user key that is not a hash) is raised, and its connection closed:
    # the next read gets its own replies, not the rest of that one's
    key = entity_redis_key(JOIN_KEYS["user"], "not-a-hash", store.config.project)
    redis.Redis.from_url(url).set(key, b"x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        loop.run_until_complete(direct.aget("not-a-hash", candidates))
    assert loop.run_until_complete(direct.aget("u_0", candidates)) == sdk.get("u_0", candidates)
    loop.run_until_complete(direct.aclient.aclose())
    loop.close()
    user_raw, items_raw = direct.read_raw("never-seen-user", ["never-seen-item", items[0]])
    assert set(user_raw.values()) == {None} and set(items_raw[0].values()) == {None}
    assert None not in items_raw[1].values()  # present entities come back whole
    defaults = sf.defaults()
    row = direct.get("never-seen-user", ["never-seen-item"])[0]
    assert row == defaults and defaults["user_ctr_1h"] > 0  # missing = documented defaults (prior CTR)


def test_a_row_expires_when_the_joiner_would_forget_its_entity(feast_store, tmp_path: Path) -> None:
    """``features.forget_idle_s`` is Feast's ``key_ttl_seconds``: every write sets the user's and
    the item's hash to expire that long after it; 0 leaves them for ever."""
    store, url = feast_store
    client = redis.Redis.from_url(url)
    forever = open_store(
        tmp_path / "forever",
        "production",
        url,
        f"{store.config.project}_0",
        cfg=FeatureConfig(forget_idle_s=0),
    )
    ttl = {}
    for name, feast in (("default", store), ("forever", forever)):
        sf = StreamingFeatures(FeatureConfig())
        sf.record_impression("u_ttl", "item_ttl", START_MS)
        FeatureWriter(feast, offline=False).push(*sf.drain_dirty())
        for entity, ident in (("user", "u_ttl"), ("item", "item_ttl")):
            key = entity_redis_key(JOIN_KEYS[entity], ident, feast.config.project)
            ttl[name, entity] = client.ttl(key)
            client.delete(key)
    days15 = FeatureConfig().forget_idle_s
    assert days15 == 15 * 86_400
    assert all(days15 - 60 < ttl["default", entity] <= days15 for entity in ("user", "item"))
    assert ttl["forever", "user"] == ttl["forever", "item"] == -1  # no expiry


def test_rows_refreshed_as_time_passes_reach_serving_through_redis(feast_store) -> None:
    """A user idle for 2 hours: the joiner's push as of its newest event time refreshes the row
    (1 h window empty, 24 h not), Feast's Redis store takes it, and the reader reads what the
    joiner's lookup gives at that time; before the refresh, the row said otherwise."""
    store, _ = feast_store
    sf = StreamingFeatures(FeatureConfig())
    writer, reader = FeatureWriter(store, offline=False), RedisFeatureReader.for_store(store)
    for k in range(3):
        sf.record_impression("u_idle", "item_idle", START_MS + k * 60_000)
    sf.record_click("u_idle", "item_idle", START_MS + 90_000)
    writer.push(*sf.drain_dirty(START_MS + 180_000))
    later = START_MS + 2 * 3_600_000
    before = reader.get("u_idle", ["item_idle"], at_ms=later)[0]
    assert (
        before["user_impressions_1h"] == 3 != sf.lookup("u_idle", "item_idle", later)["user_impressions_1h"]
    )
    sf.record_impression("u_busy", "item_busy", later)  # another user's event moves the clock
    users, items = sf.drain_dirty(later)
    assert {r["user_id"] for r in users} == {"u_idle", "u_busy"} and {r["item_id"] for r in items} == {
        "item_idle",
        "item_busy",
    }
    writer.push(users, items)
    served = reader.get("u_idle", ["item_idle"], at_ms=later)[0]
    assert served == sf.lookup("u_idle", "item_idle", later)
    assert served["user_impressions_1h"] == 0 and served["user_impressions_24h"] == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_redis(port: int, folder: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)


def test_replica_keeps_serving_with_default_features_while_redis_is_away(tmp_path: Path) -> None:
    """Our own redis-server (the shared one is never stopped): stop it mid-traffic, then restart it."""
    port = _free_port()
    proc = _start_redis(port, tmp_path)
    try:
        store = open_store(tmp_path / "feast", "production", f"redis://127.0.0.1:{port}/0", "away")
        sf = StreamingFeatures(FeatureConfig())
        for k in range(5):
            sf.record_impression("u_x", "a", START_MS + k)
        FeatureWriter(store, offline=False).push(*sf.drain_dirty())
        model = ConstantModel(0.4)
        reader = RedisFeatureReader.for_store(store, socket_timeout=0.2, socket_connect_timeout=0.2)
        with serve(DictStore({"1": model}, {"champion": "1"}), ServingConfig(), reader=reader) as (
            client,
            server,
        ):
            features = server.features
            assert features is not None
            features.retry_s = 0.2
            # the server pseudonymizes "alice"; map it to the pushed user by pushing under its pseudonym
            pseudo = server.router.champion.pseudonymize("alice")
            sf.record_impression(pseudo, "a", START_MS + 10)
            FeatureWriter(store, offline=False).push(*sf.drain_dirty())
            assert client.score({**GOOD, "items": ["a"]})[0] == 200
            assert model.seen_features[0]["user_impressions_1h"] == 1.0  # read from Redis
            proc.terminate()
            proc.wait(30)
            statuses = [client.score({**GOOD, "items": ["a"]})[0] for _ in range(20)]
            assert statuses == [200] * 20  # no 5xx while Redis is away
            assert model.seen_features[0]["user_impressions_1h"] == 0.0  # defaults
            assert features.fallbacks >= 20 and features.failures >= 1
            metrics = client.request("GET", "/metrics")[2]
            assert "ctr_serving_feature_fallbacks_total" in metrics
            assert "ctr_serving_feature_store_up 0" in metrics
            proc = _start_redis(port, tmp_path)  # back (empty: no persistence): reads resume
            deadline = time.monotonic() + 30
            while features.healthy is False and time.monotonic() < deadline:
                assert client.score({**GOOD, "items": ["a"]})[0] == 200
                time.sleep(0.1)
            assert features.healthy
    finally:
        proc.kill()
        proc.wait(30)


def test_a_replica_opens_its_feature_connections_before_any_request(tmp_path: Path) -> None:
    """``serving.max_in_flight`` asyncio connections are opened by the server's loop at start
    (ReplicaServer._warm_features), so that the first requests do not each connect; the reader's
    ``awarm`` on its own opens as many as it is asked for. Connections are counted by client name
    on our own redis-server."""
    port = _free_port()
    proc = _start_redis(port, tmp_path)
    try:
        store = open_store(tmp_path / "feast", "production", f"redis://127.0.0.1:{port}/0", "warm")
        counter = redis.Redis(port=port)

        def clients(name: str) -> int:
            return sum(1 for c in counter.client_list() if c.get("name") == name)

        alone = RedisFeatureReader.for_store(store, client_name="alone")  # kept: its pool holds them
        asyncio.run(alone.awarm(3))
        assert clients("alone") == 3
        reader = RedisFeatureReader.for_store(store, client_name="served")
        model, cfg = ConstantModel(0.4), ServingConfig(max_in_flight=6)
        with serve(DictStore({"1": model}, {"champion": "1"}), cfg, reader=reader, timeout_s=1.0) as (
            client,
            _,
        ):
            deadline = time.monotonic() + 30
            while clients("served") < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert clients("served") == 6  # before the first request
            assert client.score({**GOOD, "items": ["a"]})[0] == 200
            assert clients("served") == 6  # the request took a warm connection
    finally:
        proc.kill()
        proc.wait(30)
