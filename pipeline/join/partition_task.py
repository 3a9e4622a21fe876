"""The joiner's unit of work and of scale-out: one partition number of the input topics.

Impressions, clicks and conversions are keyed by user id and the topics have the same partition
count, so partition ``p`` of ``impressions``, of ``clicks`` (and of ``conversions``, when
``joiner.conversion_window_s > 0``) holds every event of the same users. A :class:`PartitionTask`
owns that partition number: its own :class:`~pipeline.join.joiner.Joiner`, its own
:class:`~features.aggregations.StreamingFeatures`, its own watermark, and a checkpoint of its own.
Two joiner processes in one consumer group therefore compute exactly what one computes: a task
moves between processes with its checkpoint, never split.

Determinism: the streams are merged on event time, taking from a stream only while every other
has a buffered head (or is idle past ``idle_s``), so the merged order depends on each partition's
order (which Kafka fixes), not on how fetches interleave; equal times go impression, click,
conversion. Without conversion joining, a conversion offered is only counted
(``ignored_conversions``). A replay from a checkpoint therefore re-emits byte-identical examples,
and downstream dedup by example id makes it harmless.

A task keeps its users' statistics, which are complete (a user lives in one partition). Item
statistics are not counted here: a task sees 1/P of an item's traffic. They are the item stage's
(:mod:`features.item_stage`), over every partition's examples in merge order.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from features.aggregations import FeatureRow, StreamingFeatures
from pipeline.core.config import Config
from pipeline.core.events import Click, Conversion, Impression, LabelledExample
from pipeline.join.joiner import Joiner

__all__ = ["NO_MORE", "PartitionTask", "UserFeatures", "changed_user_rows", "stream_kinds"]


@dataclass
class UserFeatures:
    """The joiner's feature tracker: the user's counters only (see the module docstring)."""

    inner: StreamingFeatures

    def lookup(self, user_id: str, item_id: str, ts_ms: int) -> dict[str, Any]:
        return self.inner.lookup_user(user_id, ts_ms)

    def record_impression(self, user_id: str, item_id: str, ts_ms: int) -> None:
        self.inner.record_user(user_id, ts_ms, click=False)

    def record_click(self, user_id: str, item_id: str, ts_ms: int) -> None:
        self.inner.record_user(user_id, ts_ms, click=True, item_id=item_id)  # item: the sequence

    def forget_idle(self, watermark_ms: int) -> list[str]:
        return self.inner.forget_idle(watermark_ms)

    def has_user(self, user_id: str) -> bool:
        return self.inner.has_user(user_id)


Event = Impression | Click | Conversion


@dataclass
class _Stream:
    buffer: deque[tuple[int, Event]] = field(default_factory=deque)  # (offset, event)
    next_offset: int = 0  # first offset not yet *processed* (buffered ones are re-read on restart)
    offered_upto: int = 0  # offsets below this were offered already: a replay of them is dropped
    last_arrival: float = field(default_factory=time.monotonic)


class PartitionTask:
    """Joins one partition's impressions and clicks; checkpoints as one JSON document."""

    def __init__(self, cfg: Config, partition: int, idle_s: float = 2.0) -> None:
        self.partition = partition
        self.idle_s = idle_s
        self.features = StreamingFeatures(cfg.features)
        self.joiner = Joiner(cfg.joiner, UserFeatures(self.features))
        self.streams = {kind: _Stream() for kind in stream_kinds(cfg)}

    def user_rows(self) -> list[FeatureRow]:
        """The rows of the users changed (or whose windows lost an event) since the last call, as
        of this task's newest event time (:meth:`StreamingFeatures.drain_dirty`), to push online."""
        return self.features.drain_dirty(self.joiner.max_ts)[0]

    # -- input -----------------------------------------------------------------------------------
    def offer(self, kind: str, offset: int, event: Event | None) -> None:
        """Queue a validated event (or ``None`` for a dead-lettered one, which only moves offsets).

        An offset offered before (a consumer rewound after a rebalance) is dropped, so the task
        never processes an event twice.
        """
        s = self.streams.get(kind)
        if s is None:  # a conversion, not joined (stream_kinds): the joiner only counts it
            if event is not None:
                self.joiner.process(event)
            return
        if offset < s.offered_upto:
            return
        s.offered_upto = offset + 1
        s.last_arrival = time.monotonic()
        if not s.buffer:
            s.next_offset = offset  # everything before it is processed (or never existed)
        s.buffer.append((offset, _SKIP if event is None else event))

    def run(
        self,
        now: float | None = None,
        at_end: Callable[[str], bool] | None = None,
        ahead: Callable[[str], int | None] | None = None,
    ) -> None:
        """Merge and process what can be processed deterministically; then advance the watermark.

        A stream may run ahead only while every other stream without a buffered event is *idle*:
        silent for ``idle_s`` and, if ``at_end`` is given, read up to the end of its partition (a
        backlog the consumer has not fetched yet is not idleness; waiting for it keeps replays
        identical). ``ahead`` (a replay that has read its input ahead,
        :mod:`pipeline.join.lookahead`) may say more of a stream without a buffered event: a lower
        bound on the time of every event it will still get (:data:`NO_MORE` once it gets none), so
        the others run ahead up to, not including, that time, as they would with its next event
        buffered; ``None``: not known, wait.
        """
        now = time.monotonic() if now is None else now
        streams = list(self.streams.items())

        def idle(kind: str) -> bool:
            s = self.streams[kind]
            return now - s.last_arrival >= self.idle_s and (at_end is None or at_end(kind))

        process = self.joiner.process
        while True:
            take: _Stream | None = None
            rank = 0
            coming = NO_MORE  # the earliest time an event still to come on an empty stream may have
            for i, (kind, s) in enumerate(streams):
                if s.buffer:
                    if take is None or _ts(s.buffer[0][1]) < _ts(take.buffer[0][1]):
                        take, rank = s, i  # ties: the first kind in stream order
                elif not idle(kind):
                    bound = None if ahead is None else ahead(kind)
                    if bound is None:
                        take = None
                        break  # wait for it: taking now would depend on fetch timing
                    coming = min(coming, bound)
            if take is None or _ts(take.buffer[0][1]) >= coming:
                break
            # take a run: every head the choice above would pick again, i.e. each event earlier
            # than the other streams' heads (or as early, from a stream before theirs in order);
            # the other buffers do not change meanwhile, and the idle ones stay idle at ``now``
            limit = coming
            for i, (_, s) in enumerate(streams):
                if s is not take and s.buffer:
                    limit = min(limit, _ts(s.buffer[0][1]) + (rank < i))
            buffer = take.buffer
            while buffer and buffer[0][1].ts < limit:
                offset, event = buffer.popleft()
                take.next_offset = offset + 1
                if event is not _SKIP:
                    process(event)
        self.joiner.advance()

    def drain(self) -> list[LabelledExample]:
        return self.joiner.drain()

    def oldest_open_ts(self) -> int | None:
        """A lower bound on the impression time of every example still to come from the events this
        task was offered (buffered impressions, the joiner's open ones); ``None``: none."""
        waiting = (event.ts for _, event in self.streams["impression"].buffer if event is not _SKIP)
        held = self.joiner.oldest_open_ts()
        return min(waiting if held is None else itertools.chain(waiting, (held,)), default=None)

    @property
    def buffered(self) -> int:
        return sum(len(s.buffer) for s in self.streams.values())

    # -- checkpoints -----------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """Joiner + features state and, per stream, the first offset not yet processed."""
        return {
            "partition": self.partition,
            "joiner": self.joiner.to_state(),
            "features": self.features.to_state(),
            "next_offsets": {k: s.next_offset for k, s in self.streams.items()},
        }

    def load_state(self, state: dict[str, Any], cfg: Config) -> None:
        if state["partition"] != self.partition:
            raise ValueError(
                f"checkpoint of partition {state['partition']} loaded into task {self.partition}"
            )
        self.features = StreamingFeatures.from_state(state["features"], cfg.features)
        self.joiner = Joiner(cfg.joiner, UserFeatures(self.features))
        self.joiner.load_state(state["joiner"])
        for kind, offset in state["next_offsets"].items():
            if kind in self.streams:  # a conversions offset, conversions no longer joined: unused
                self.streams[kind] = _Stream(next_offset=offset, offered_upto=offset)


def changed_user_rows(tasks: Iterable[PartitionTask]) -> list[FeatureRow]:
    """Every task's changed user rows (:meth:`PartitionTask.user_rows`), for one push to the
    online store: a user lives in one partition; item rows are the item stage's."""
    return [row for task in tasks for row in task.user_rows()]


def stream_kinds(cfg: Config) -> tuple[str, ...]:
    """The input streams a task merges: conversions only when they are joined."""
    kinds = ("impression", "click")
    return (*kinds, "conversion") if cfg.joiner.conversion_window_s > 0 else kinds


class _Skip:
    ts = -1


_SKIP: Any = _Skip()
NO_MORE = 2**63  # after any event time (validation bounds them to the year 9999)


def _ts(event: Any) -> int:
    return int(event.ts)
