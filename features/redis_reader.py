"""Serving reads straight from Feast's Redis layout: one pipelined round trip, no SDK in between.

Why: ``FeatureStore.get_online_features`` for 1 user + 100 items costs ~2.4 ms median here, most of
it Python around the Redis call (entity-key protos, per-view grouping, response protos). Reading
the same hashes directly with one round trip of HMGETs is several times cheaper here
(``benchmarks/serving.py`` measures both in the same run).

The price: this module relies on how Feast's Redis online store lays out its data
(``feast/infra/online_stores/redis.py``, ``entity_key_serialization_version: 3``):

- one Redis hash per entity and project, key = ``serialize_entity_key(entity) + project``; for one
  string join key that is ``<u32 1><u32 STRING><u32 len>join_key<u32 STRING><u32 len>value``
  (little endian), then the project name;
- in it, one field per feature, named ``mmh3_32("<view>:<feature>")`` (4 bytes, little endian),
  holding a serialized ``ValueProto``; plus ``_ts:<view>``, the row's event time.

``tests/integration/test_redis_reader.py`` proves this path returns exactly what
``get_online_features`` returns (present and missing entities, after several pushes), so a Feast
upgrade that changes the layout fails there, not silently in production. ``serving.feature_path``
chooses between this reader and :class:`features.store.OnlineFeatureReader`.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any, cast

import hiredis
import mmh3
import redis
import redis.asyncio
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from features.aggregations import StreamingFeatures, visible_sequence
from features.repo.definitions import JOIN_KEYS
from pipeline.core.config import FeatureConfig

__all__ = ["RedisFeatureReader", "entity_redis_key", "feature_field", "parse_feast_connection_string"]

_STRING = 2  # feast.ValueType.STRING, the type tag Feast writes for a string join key and value
_U32 = struct.Struct("<I")


def entity_redis_key(join_key: str, value: str, project: str) -> bytes:
    """The Redis key of one entity's hash (Feast's ``serialize_entity_key`` v3 + project)."""
    k, v = join_key.encode(), value.encode()
    return (
        b"".join(
            (_U32.pack(1), _U32.pack(_STRING), _U32.pack(len(k)), k, _U32.pack(_STRING), _U32.pack(len(v)), v)
        )
        + project.encode()
    )


def feature_field(view: str, feature: str) -> bytes:
    """The hash field of one feature: murmur3_32 of ``view:feature``, 4 bytes little endian."""
    return struct.pack("<I", mmh3.hash(f"{view}:{feature}", signed=False))


def parse_feast_connection_string(conn: str) -> dict[str, Any]:
    """Feast's ``host:port,db=N,password=..,ssl=true`` -> keyword arguments of ``redis.Redis``."""
    first, *params = [p.strip() for p in conn.split(",") if p.strip()]
    host, _, port = first.rpartition(":")
    out: dict[str, Any] = {"host": host or first, "port": int(port) if host else 6379}
    for p in params:
        key, _, value = p.partition("=")
        if key == "db":
            out["db"] = int(value)
        elif key in ("password", "username"):
            out[key] = value
        elif key == "ssl":
            out["ssl"] = value.lower() == "true"
    return out


_DECODED: dict[bytes, float | None] = {}  # serialized value -> float: counts repeat a lot
_DECODED_MAX = 200_000
_MISS = object()
_PACKED_MAX = 100_000  # items whose packed HMGET is kept (~200 bytes each)


def _decode(raw: bytes | None) -> float | None:
    """A stored ``ValueProto`` as a float; None when the field is absent or holds no value."""
    if not raw:
        return None
    out = _DECODED.get(raw, _MISS)
    if out is _MISS:
        v = ValueProto.FromString(raw)
        kind = v.WhichOneof("val")
        out = None if kind is None else float(getattr(v, kind))
        if len(_DECODED) >= _DECODED_MAX:  # bound memory (CTRs are many distinct doubles)
            _DECODED.clear()
        _DECODED[raw] = out
    return out  # type: ignore[return-value]


def _decode_sequence(reply: Sequence[bytes | None]) -> tuple[list[str], list[int]]:
    """The stored behaviour sequence (item ids, click times), empty when the user has none."""
    items_raw, times_raw = reply
    items = list(ValueProto.FromString(items_raw).string_list_val.val) if items_raw else []
    times = list(ValueProto.FromString(times_raw).int64_list_val.val) if times_raw else []
    return items, times


def _pack(*args: str | bytes) -> bytes:
    """One command in Redis' wire format (RESP), by hiredis, as redis-py itself packs it."""
    return hiredis.pack_command(cast(Any, args))


async def _read_replies(conn: Any, n: int) -> list[Any]:
    """``n`` replies of an asyncio connection, parsed by its hiredis reader as they arrive.

    redis-py's ``read_response`` per reply costs ~1.5 us of Python each (a coroutine, its checks):
    0.15 ms of the 0.3 ms of CPU a 101-reply read took here. This loop asks the connection's
    hiredis reader for each reply and reads the socket only when it has none buffered; it relies
    on redis-py's ``_AsyncHiredisParser`` (``_reader``, ``read_from_socket``; redis-py 7), and
    takes the per-reply path with any other parser. A reply that is an error is raised, as
    ``read_response`` raises it; ``tests/integration/test_redis_reader.py`` checks the replies
    against Feast's SDK.
    """
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if not isinstance(parser, _AsyncHiredisParser) or reader is None:
        return [await conn.read_response() for _ in range(n)]
    out: list[Any] = []
    while len(out) < n:
        reply = reader.gets()
        if reply is NOT_ENOUGH_DATA:
            await parser.read_from_socket()
            continue
        if isinstance(reply, Exception):  # hiredis returns error replies, redis-py raises them
            raise reply
        out.append(reply)
    return out


class RedisFeatureReader:
    """Reads one user's and its candidate items' features: one ``HMGET`` per entity, all sent at once.

    Same interface as :class:`features.store.OnlineFeatureReader`: :meth:`get` returns one dict per
    candidate, user and item features merged, missing values replaced by
    :meth:`StreamingFeatures.defaults`; :meth:`aget` is the same read on the caller's event loop
    (``redis.asyncio``), which the serving app awaits under its deadline with no thread in between.
    :meth:`read_raw` returns the stored values (None = missing), which is what the equivalence test
    compares with the SDK.

    Why not a redis-py pipeline: it spends ~10 us of Python per command (packing, a response
    callback, a result slot), ~1 ms for the 101 commands of one request, more than Redis takes to
    answer them. Here each item's packed ``HMGET`` is built once and kept (:data:`_PACKED_MAX`
    items), the request is one ``sendall`` on a connection of redis-py's pool, and the replies are
    read back with that connection's parser (hiredis). Connecting, authentication, the database,
    timeouts and TLS stay redis-py's.
    """

    def __init__(
        self, client: redis.Redis, project: str, cfg: FeatureConfig | None = None, aclient: Any = None
    ) -> None:
        self.client = client
        self.aclient = aclient  # a redis.asyncio.Redis for aget (None: aget is not available)
        self.project = project
        self.cfg = cfg or FeatureConfig()
        sf = StreamingFeatures(self.cfg)
        self.feature_names = sf.feature_names
        self.user_names, self.item_names = sf.user_names, sf.item_names
        self._defaults = sf.defaults()
        # the behaviour sequence (if kept) is in the user's hash too: the same HMGET reads it
        self.sequence_names = sf.sequence_names
        self._user_fields = [feature_field("user_stats", n) for n in (*sf.user_names, *sf.sequence_names)]
        self._item_fields = [feature_field("item_stats", n) for n in sf.item_names]
        self._packed: dict[str, bytes] = {}  # item id -> its packed HMGET

    @classmethod
    def for_store(
        cls, store: Any, cfg: FeatureConfig | None = None, **redis_kwargs: Any
    ) -> RedisFeatureReader:
        """The reader of a Feast store whose online store is Redis (its project and connection);
        ``redis_kwargs`` go to ``redis.Redis`` and ``redis.asyncio.Redis`` (e.g. ``socket_timeout``).

        No retries unless ``redis_kwargs`` asks for them: redis-py 7's default (3 retries with
        jittered exponential back-off, up to 2 + 4 + 8 s) made one read of a stopped Redis take
        3.6-9.5 s here whatever the socket timeouts, and a serving read that fails should fail at
        once (the caller scores with default features and retries later).
        """
        online = store.config.online_store
        if getattr(online, "type", "") != "redis" or getattr(online, "redis_type", "redis") != "redis":
            raise ValueError(f"features: the direct reader needs a single Redis online store, not {online!r}")
        kwargs = parse_feast_connection_string(online.connection_string) | redis_kwargs
        client = redis.Redis(**({"retry": Retry(NoBackoff(), 0)} | kwargs))
        # no per-read socket timeout on the asyncio client: redis.asyncio arms one timer per reply
        # (101 a request: 0.4 -> 1.5 ms here); aget's caller bounds the whole read instead
        akwargs = {k: v for k, v in kwargs.items() if k != "socket_timeout"}
        aclient = redis.asyncio.Redis(**({"retry": AsyncRetry(NoBackoff(), 0)} | akwargs))
        return cls(client, store.config.project, cfg, aclient)

    def read_raw(
        self, user_id: str, item_ids: Sequence[str]
    ) -> tuple[dict[str, Any], list[dict[str, float | None]]]:
        """Stored values of the user and of each item (None where the store holds none); the
        user's stored behaviour sequence whole (no ttl applied), if it is kept."""
        payload, unique = self._request(user_id, item_ids)
        replies = self._fetch(payload, len(unique) + 1)
        n = len(self.user_names)
        user: dict[str, Any] = {nm: _decode(r) for nm, r in zip(self.user_names, replies[0][:n], strict=True)}
        if self.sequence_names:
            user.update(zip(self.sequence_names, _decode_sequence(replies[0][n:]), strict=True))
        by_item = {
            item: {n: _decode(r) for n, r in zip(self.item_names, reply, strict=True)}
            for item, reply in zip(unique, replies[1:], strict=True)
        }
        return user, [by_item[i] for i in item_ids]

    def get(self, user_id: str, item_ids: list[str], at_ms: int | None = None) -> list[dict[str, Any]]:
        """One dict per candidate, keys in ``feature_names`` order, defaults where missing; then
        the user's behaviour sequence as seen at ``at_ms`` (default: now), if it is kept."""
        if not item_ids:
            return []
        payload, unique = self._request(user_id, item_ids)
        return self._rows(unique, item_ids, self._fetch(payload, len(unique) + 1), at_ms)

    async def aget(self, user_id: str, item_ids: list[str], at_ms: int | None = None) -> list[dict[str, Any]]:
        """:meth:`get` on the running event loop, bounded by the caller (``asyncio.timeout``, as
        :class:`serving_bridge.feature_fallback.FallbackFeatures` does): ``socket_timeout`` applies
        to :meth:`get` only. A read cancelled midway closes its connection, so no reply of it is
        left for the next request to read."""
        if not item_ids:
            return []
        if self.aclient is None:
            raise RuntimeError("features: this reader has no asyncio client; build it with for_store")
        payload, unique = self._request(user_id, item_ids)
        pool = self.aclient.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command([payload], check_health=False)
            replies = await _read_replies(conn, len(unique) + 1)
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        finally:
            await pool.release(conn)
        return self._rows(unique, item_ids, replies, at_ms)

    async def awarm(self, connections: int) -> None:
        """Open ``connections`` asyncio connections on the running loop and leave them in the pool,
        so that the first requests after start-up do not each connect on their own time."""
        if self.aclient is None:
            return
        pool = self.aclient.connection_pool
        opened = []
        try:
            for _ in range(connections):
                conn = await pool.get_connection()  # connects it
                opened.append(conn)
        finally:
            for conn in opened:
                await pool.release(conn)

    def _request(self, user_id: str, item_ids: Sequence[str]) -> tuple[bytes, list[str]]:
        """The packed commands (the user's HMGET, then one per distinct item) and those items."""
        unique = list(dict.fromkeys(item_ids))
        user_key = entity_redis_key(JOIN_KEYS["user"], user_id, self.project)
        parts = [_pack("HMGET", user_key, *self._user_fields)]
        packed = self._packed
        for item in unique:
            command = packed.get(item)
            if command is None:
                if len(packed) >= _PACKED_MAX:
                    packed.clear()
                key = entity_redis_key(JOIN_KEYS["item"], item, self.project)
                command = packed[item] = _pack("HMGET", key, *self._item_fields)
            parts.append(command)
        return b"".join(parts), unique

    def _fetch(self, payload: bytes, n: int) -> list[list[bytes | None]]:
        """Send ``payload`` on a pooled connection and read its ``n`` replies (an error midway
        closes the connection: its unread replies must not answer the next request)."""
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([payload], check_health=False)
            return [conn.read_response() for _ in range(n)]
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def _rows(
        self, unique: list[str], item_ids: Sequence[str], replies: list[list[bytes | None]], at_ms: int | None
    ) -> list[dict[str, Any]]:
        n = len(self.user_names)
        user = self._decoded(self.user_names, replies[0][:n], {})
        by_item = {
            item: self._decoded(self.item_names, reply, user.copy())
            for item, reply in zip(unique, replies[1:], strict=True)
        }
        if self.sequence_names:  # after the item features: the readers' documented key order
            items, times = _decode_sequence(replies[0][n:])
            at = int(time.time() * 1000) if at_ms is None else at_ms
            visible = visible_sequence(items, times, at, self.cfg.sequence_ttl_s)
            seq = dict(zip(self.sequence_names, visible, strict=True))
            for row in by_item.values():
                row.update(seq)
        if len(unique) == len(item_ids):
            return list(by_item.values())
        return [dict(by_item[i]) for i in item_ids]  # a repeated candidate gets its own dict

    def _decoded(
        self, names: Sequence[str], reply: list[bytes | None], row: dict[str, Any]
    ) -> dict[str, Any]:
        d = self._defaults
        for n, r in zip(names, reply, strict=True):
            v = _decode(r)
            row[n] = d[n] if v is None else v
        return row
