"""``ctr produce``: the simulator or a log onto the event topics, at a fixed rate or as fast as possible.

Impressions go to ``impressions_topic``, clicks to ``clicks_topic`` and conversions to
``conversions_topic`` as JSON, keyed by ``user_id`` (the same key and partition count put a user's
events on the same partition number, which the joiner relies on), through one
:class:`~pipeline.kafka.client.KafkaSink`.

Each record's timestamp (CreateTime) is the event's entry time as a replay judges it
(:class:`~pipeline.core.entered_time.EnteredTime`: its event time unless it is an outlier among its
neighbours), so the joiner daemon, which judges clock skew and age against record timestamps,
accepts and refuses exactly what ``ctr backtest`` of the same log does. A reference later than
the wall clock is sent as now (brokers refuse timestamps far in the future), and such an event is
then refused as ``ts_in_future``, which it is. Topic retention is measured on these timestamps:
a replayed log older than the topic's ``retention.ms`` is deleted by the broker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipeline.core.config import KafkaConfig, ValidationConfig
from pipeline.core.entered_time import EnteredTime
from pipeline.core.types import EventKind, RawEvent, Source
from pipeline.kafka.client import KafkaSink

__all__ = ["RateLimiter", "publish_source", "publish_stream"]


class RateLimiter:
    """A token bucket: ``acquire()`` sleeps so that calls average ``rate`` per second.

    The bucket holds at most ``burst`` tokens (default: 50 ms worth), so an idle spell does not
    allow an unbounded burst after it. Debts below ``min_sleep_s`` are carried rather than slept:
    ``time.sleep`` cannot sleep 20 µs, and the carried debt keeps the long-run rate exact.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        min_sleep_s: float = 0.001,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"RateLimiter: rate must be > 0 events/s, got {rate!r}")
        self.rate, self.burst = float(rate), max(1.0, rate * 0.05 if burst is None else burst)
        self.min_sleep_s, self._clock, self._sleep = min_sleep_s, clock, sleep
        self._tokens, self._last = self.burst, clock()

    def acquire(self, n: float = 1.0) -> float:
        """Take ``n`` tokens, sleeping while the bucket is in debt; returns the seconds slept."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate) - n
        self._last = now
        if self._tokens >= 0:
            return 0.0
        delay = -self._tokens / self.rate
        if delay < self.min_sleep_s:
            return 0.0
        self._sleep(delay)
        return delay


Record = tuple[str, bytes | None, bytes, int | None]  # kind, key, value, timestamp (ms or None)
_CHUNK = 5_000  # events stamped at a time (the look-ahead of EnteredTime ends with a chunk)


def _publish(
    cfg: KafkaConfig,
    records: Iterable[Record],
    rate: float | None,
    flush_every: int,
    progress: bool = False,
) -> dict[str, int]:
    topics = {"impression": cfg.impressions_topic, "click": cfg.clicks_topic}
    topics["conversion"] = cfg.conversions_topic
    counts = dict.fromkeys(topics, 0)
    limiter = RateLimiter(rate) if rate else None
    if progress:  # a bar on stderr (events sent, rate): long replays show they are moving
        from tqdm import tqdm

        records = tqdm(records, desc="published", unit=" events", mininterval=1.0, unit_scale=True)
    with KafkaSink(cfg, cfg.impressions_topic) as sink:
        for kind, key, value, ts in records:
            if kind not in topics:
                raise ValueError(f"publish: event kind {kind!r} is not one of {sorted(topics)}")
            if limiter is not None:
                limiter.acquire()
            sink.send(key, value, topics[kind], ts)
            counts[kind] += 1
            if sink.sent >= flush_every:  # bounds producer memory and surfaces failures early
                sink.flush()
        sink.flush()
    if not counts["conversion"]:  # a stream of impressions and clicks: counted as before
        del counts["conversion"]
    return counts


def _json(event: Mapping[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def _user_key(event: Mapping[str, Any]) -> bytes | None:
    user = event.get("user_id")
    return user.encode() if isinstance(user, str) else None


def _stamped(batches: Iterable[list[RawEvent]], validation: ValidationConfig | None) -> Iterable[Record]:
    """Each event as a record whose timestamp is its entry time (see the module docstring)."""
    v = validation or ValidationConfig()
    entered = EnteredTime(v.max_future_skew_s, v.max_past_age_s)
    for batch in batches:
        entered.assign(batch)
        now = int(time.time() * 1000)
        for ev in batch:
            value = ev.value
            ts = None if ev.entered_ms is None else min(ev.entered_ms, now)
            yield ev.kind, ev.key, value if isinstance(value, bytes) else _json(value), ts


def _chunks(events: Iterable[tuple[EventKind, Mapping[str, Any]]]) -> Iterable[list[RawEvent]]:
    chunk: list[RawEvent] = []
    for kind, e in events:
        chunk.append(RawEvent(kind, e, "publish", key=_user_key(e)))
        if len(chunk) >= _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def publish_stream(
    cfg: KafkaConfig,
    events: Iterable[tuple[EventKind, Mapping[str, Any]]],
    rate: float | None = None,
    flush_every: int = 50_000,
    progress: bool = False,
    validation: ValidationConfig | None = None,
) -> dict[str, int]:
    """``ctr produce``: JSON-encode ``(kind, event)`` pairs to the impressions/clicks topics.

    Keyed by ``user_id`` (so a user's impressions and clicks land on the same partition number),
    stamped with their entry times (``validation``'s skew and age bound the outliers; default
    config), at ``rate`` events/s or as fast as possible; returns ``{"impression": n, "click": m}``
    (and ``"conversion"`` when there were any) once everything is acknowledged (raises
    :class:`KafkaSinkError` otherwise). ``progress``: a bar on stderr.
    """
    return _publish(cfg, _stamped(_chunks(events), validation), rate, flush_every, progress)


def publish_source(
    cfg: KafkaConfig,
    source: Source,
    rate: float | None = None,
    flush_every: int = 50_000,
    progress: bool = False,
    validation: ValidationConfig | None = None,
) -> dict[str, int]:
    """``ctr produce --source``: publish any :class:`Source` (a log from
    :func:`pipeline.sources.open.open_source`) to the event topics, stamped like :func:`publish_stream`.

    Lines the file source could not parse are published as their raw bytes, so the ingesting daemon
    dead-letters them with a reason, exactly as a replay without Kafka would.
    """
    return _publish(cfg, _stamped(source.batches(), validation), rate, flush_every, progress)
