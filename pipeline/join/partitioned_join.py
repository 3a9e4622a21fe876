"""A replay's joiner: the daemon's partition tasks, fed the way Kafka would feed them.

A replay (``ctr backtest``, ``ctr demo``) runs the production join, not a copy of it: every event
goes to partition ``partition_of(key, cfg.kafka.partitions)`` (the key is the raw user id, as the
producers key records) with that partition's next offset, is validated by the same
:class:`~pipeline.core.events.Validator` (entry time from :class:`~pipeline.core.entered_time.EnteredTime`,
the partition check), and is offered to that partition's
:class:`~pipeline.join.partition_task.PartitionTask`: the same event-time merge of impressions and
clicks, per-partition watermark, user statistics and dedup as the joiner daemon. The
tasks' examples leave in :class:`~pipeline.join.example_merge.ExampleMerge` order, which does not depend
on batch sizes. Refused events become dead letters with the daemon's reasons.

In a replay no stream is ever idle before the input ends (the daemon's idleness needs a caught-up
partition, which a backlog is not), so :meth:`PartitionedJoin.step` only merges what both streams
have buffered, and :meth:`PartitionedJoin.finish` lets every task run to its end. Where a task
holds more than :data:`~pipeline.join.lookahead.STALLED` events (a stream that is sparse or has
ended: a partition without clicks, conversions joined on a log without them), a replay given
``read_ahead`` (a fresh read of its input) reads it ahead once (:mod:`pipeline.join.lookahead`) and
from then on tells each task how soon its empty streams get an event again, so the task runs the
others as far as the daemon, which sees every stream's head, would.

Nor is a partition idle for the example merge, so a partition without examples would hold back
every other's until the input ends (a Criteo log has one user, "anon": one partition gets every
event, and a 1M-row backtest held all its examples, 5.4 GB). Instead, every
:data:`PROMISE_EVERY` events of the input, each task promises the merge a bound
(:meth:`ExampleMerge.promise`): its examples still to come have impressions no older than the
oldest one it holds open, nor than the attribution window plus the watermark lag behind the newest
event time any task has seen (every example given so far is older than that). Only an impression
later than that breaks a promise; it is counted (``examples_past_merge_promise``) and its example
goes out where it is, in the same place whatever the batch sizes, since promises are made at
fixed places of the input.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from features.aggregations import FeatureRow
from pipeline.core.config import Config
from pipeline.core.entered_time import EnteredTime
from pipeline.core.events import DeadLetter, LabelledExample, kind_of
from pipeline.core.partitioning import KeyHashes
from pipeline.core.types import Clock, RawEvent
from pipeline.core.validation import Validator
from pipeline.join.example_merge import ExampleMerge
from pipeline.join.lookahead import STALLED, Lookahead
from pipeline.join.partition_task import PartitionTask, changed_user_rows
from pipeline.join.stats import JoinStats

__all__ = ["PROMISE_EVERY", "PartitionedJoin"]

PROMISE_EVERY = 1_024  # input events between the tasks' promises to the example merge
log = logging.getLogger(__name__)


class DeadLetterSink(Protocol):
    def write(self, letter: DeadLetter) -> None: ...


class PartitionedJoin:
    """``cfg.kafka.partitions`` partition tasks behind one validator; see the module docstring."""

    def __init__(
        self,
        cfg: Config,
        clock: Clock,
        dead_letters: DeadLetterSink,
        read_ahead: Callable[[], Iterable[list[RawEvent]]] | None = None,
    ) -> None:
        self.partitions = n = cfg.kafka.partitions
        if n < 1:
            raise ValueError(f"kafka.partitions must be >= 1, got {n}")
        hashes = KeyHashes()
        self._route: Callable[[bytes], int] = lambda key: hashes(key) % n
        self._read_ahead = read_ahead
        self.lookahead: Lookahead | None = None  # the input read ahead, once a task stalled
        self.validator = Validator(
            cfg.validation, clock, lambda user: hashes(user.encode("utf-8", "surrogatepass")) % n
        )
        self.entered = EnteredTime(cfg.validation.max_future_skew_s, cfg.validation.max_past_age_s)
        self.tasks = [PartitionTask(cfg, p, idle_s=cfg.daemon.idle_merge_s) for p in range(n)]
        self.merge = ExampleMerge(n)
        self.sink = dead_letters
        self.dead_letters = 0
        self._next = {(kind, p): 0 for kind in ("impression", "click", "conversion") for p in range(n)}
        self._horizon_ms = cfg.joiner.label_delay_ms
        self._events = 0  # input events so far: promises are made at fixed places of the input

    def step(self, batch: Sequence[RawEvent]) -> list[LabelledExample]:
        """Route, validate and join one batch; the examples whose merged place is final."""
        self.entered.assign(batch)
        tasks, validate = self.tasks, self.validator.validate
        out: list[LabelledExample] = []
        for raw in batch:
            p = self._route(raw.key) if raw.key is not None else 0
            offset = self._next[raw.kind, p]
            self._next[raw.kind, p] = offset + 1
            raw.partition, raw.offset = p, offset
            event = validate(raw)
            if isinstance(event, DeadLetter):
                self._dead(event)
                tasks[p].offer(raw.kind, offset, None)
            else:
                tasks[p].offer(raw.kind, offset, event)
            self._events += 1
            if not self._events % PROMISE_EVERY:
                out += self._promise()
        self._run_tasks()
        return out + self.merge.pop()

    def _run_tasks(self) -> None:
        """Each task processes what it can; its examples and rejections go to the merge and sink."""
        ahead = self.lookahead
        for task in self.tasks:
            bound = (
                None
                if ahead is None
                else functools.partial(ahead.bound, partition=task.partition, offered=self._events)
            )
            task.run(at_end=_never, ahead=bound)
            self._drain(task)

    def _promise(self) -> list[LabelledExample]:
        """Every task promises the merge its bound (see the module docstring); what that frees."""
        self._run_tasks()
        if self._read_ahead is not None and self.lookahead is None and self._stalled():
            self._read_input_ahead()
        horizon = max(task.joiner.max_ts for task in self.tasks) - self._horizon_ms
        for task in self.tasks:
            held = task.oldest_open_ts()
            self.merge.promise(task.partition, horizon if held is None else min(held, horizon))
        return self.merge.pop()

    def _stalled(self) -> bool:
        return max(task.buffered for task in self.tasks) > STALLED

    def _read_input_ahead(self) -> None:
        """A task stalled on a stream without events (module docstring): read the input ahead."""
        assert self._read_ahead is not None
        stalled = max(self.tasks, key=lambda t: t.buffered)
        empty = [kind for kind, s in stalled.streams.items() if not s.buffer]
        log.warning(  # once a replay; says what the log lacks (a partition's clicks, all conversions?)
            "partition %d holds %s events waiting for its %s, which have not come for that long: "
            "reading the input ahead once to see when they do (the examples stay the same)",
            stalled.partition,
            f"{stalled.buffered:,}",
            " and ".join(f"{kind}s" for kind in empty) or "other streams",
        )
        self.lookahead = Lookahead(self._read_ahead(), self._route, stalled.streams)  # the kinds merged
        self._run_tasks()

    def finish(self, flush: bool = True) -> list[LabelledExample]:
        """The input ended: run every task to its end (``flush``: close every open window too)."""
        for task in self.tasks:
            task.run(now=math.inf, at_end=_always)
            if flush:
                task.joiner.flush()
            self._drain(task)
        return self.merge.pop(done=lambda p: True)

    def drain_features(self) -> list[FeatureRow]:
        """Every task's changed user rows (a user lives in one task; items are the item stage's)."""
        return changed_user_rows(self.tasks)

    @property
    def stats(self) -> dict[str, int]:
        """The joiners' counters, summed over partitions."""
        total = JoinStats().as_dict()
        for task in self.tasks:
            for name, n in task.joiner.stats.as_dict().items():
                total[name] += n
        total["examples_past_merge_promise"] = self.merge.broken_promises
        # the input read again to see ahead (pipeline.join.lookahead): 0 unless a task stalled
        total["events_read_ahead"] = 0 if self.lookahead is None else self.lookahead.events
        # idle users forgotten (features.forget_idle_s), and lookups that may have missed one
        total["users_forgotten"] = sum(task.features.forgotten for task in self.tasks)
        total["lookups_past_forget"] = sum(task.features.past_forget for task in self.tasks)
        return total

    def _drain(self, task: PartitionTask) -> None:
        self.merge.offer(task.partition, task.drain())
        for rej in task.joiner.drain_rejected():
            raw = RawEvent(kind_of(rej.event), rej.event.to_dict(), "joiner", task.partition)
            self._dead(self.validator.dead_letter(raw, rej.reason, rej.detail))

    def _dead(self, letter: DeadLetter) -> None:
        self.sink.write(letter)
        self.dead_letters += 1


def _never(kind: str) -> bool:
    return False


def _always(kind: str) -> bool:
    return True
