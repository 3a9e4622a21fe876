"""`ctr joiner`: impressions + clicks (+ conversions) from Kafka -> labelled examples on Kafka + features
in Feast.

One :class:`~pipeline.join.partition_task.PartitionTask` per assigned partition number, its state
kept in the joiner's changelog topic (:mod:`pipeline.daemons.joiner_state`). Every
``daemon.checkpoint_every_s``:

1. flush the producers (examples and dead letters acknowledged by Kafka),
2. push the changed features to the Feast online store (Redis),
3. in one Kafka transaction: each task's changed state records and the offsets it has processed.

A crash anywhere replays from the last committed transaction, on this machine or another; the tasks
are deterministic, so the replay re-sends byte-identical examples (the trainer drops them by example
id) and re-pushes identical features (Redis drops rows that are not newer). Nothing is lost, nothing
counts twice.
"""

from __future__ import annotations

import functools
import logging
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    KafkaError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from redis.exceptions import RedisError

from features.store import FeatureWriter, open_store
from pipeline.core import logs, systemd
from pipeline.core.config import Config
from pipeline.core.events import DeadLetter, kind_of
from pipeline.core.gc_tuning import tune_gc
from pipeline.core.metrics import serve_metrics
from pipeline.core.partitioning import partition_of
from pipeline.core.types import RawEvent, WallClock
from pipeline.core.validation import Validator
from pipeline.daemons.joiner_metrics import JoinerMetrics
from pipeline.daemons.joiner_state import TaskStates
from pipeline.join.dead_letter_alarm import DeadLetterAlarm
from pipeline.join.partition_task import PartitionTask, changed_user_rows, stream_kinds
from pipeline.kafka import example_records
from pipeline.kafka.io import KafkaSink, KafkaSinkError, caught_up, ensure_topics
from pipeline.kafka.sources import KafkaEventSource

__all__ = ["JoinerDaemon"]

log = logging.getLogger(__name__)
# what a service outage raises (broker, producer acknowledgements, Redis, disk): replay, not crash
OUTAGES = (KafkaError, KafkaSinkError, RedisError, OSError)
# a checkpoint's offsets refused because the group moved on: reopen the tasks, no back-off
REBALANCING = (CommitFailedError, IllegalGenerationError, RebalanceInProgressError, UnknownMemberIdError)
_FLUSH_TIMEOUT_S = 20.0  # unacknowledged after this: an outage (well inside the unit's WatchdogSec=60)


class JoinerDaemon:
    def __init__(self, cfg: Config, feature_dir: Path | None = None) -> None:
        self.cfg = cfg
        k = cfg.kafka
        topics = {"impression": k.impressions_topic, "click": k.clicks_topic}
        topics["conversion"] = k.conversions_topic
        # the input topics: conversions only when they are joined
        self.topic_of = {kind: topics[kind] for kind in stream_kinds(cfg)}
        ensure_topics(cfg.kafka, [*self.topic_of.values(), k.examples_topic], k.partitions)
        ensure_topics(cfg.kafka, [k.dead_letter_topic], 1)
        self.state_dir = Path(cfg.daemon.state_dir).expanduser() / "joiner"
        self.source = KafkaEventSource(
            k,
            {topic: kind for kind, topic in self.topic_of.items()},  # type: ignore[misc]  # EventKinds
            group_id=f"{k.group_id_prefix}-joiner",
            on_revoke=self._on_revoke,
            read_committed=True,  # a newly assigned partition waits for its last checkpoint to end
        )
        self.examples = KafkaSink(k, k.examples_topic)
        self.dead = KafkaSink(k, k.dead_letter_topic)
        partitions = self._partitions()
        self.validator = Validator(
            cfg.validation, WallClock(), lambda user_id: partition_of(user_id, partitions)
        )
        self.states = TaskStates(cfg, self.source, self.topic_of, partitions, self.state_dir)
        self.alarm = DeadLetterAlarm(cfg.daemon.dead_letter_warn_share)
        store = open_store(
            feature_dir or self.state_dir / "feast",
            "production",
            redis_url=cfg.daemon.redis_url,
            project=cfg.features.project,
            cfg=cfg.features,
        )
        self.features = FeatureWriter(store, cfg.features)
        self.tasks: dict[int, PartitionTask] = {}
        self.counters = {"events": 0, "examples": 0, "dead_letters": 0, "checkpoints": 0}
        self.dead_reasons: Counter[str] = Counter()
        self.outages: Counter[str] = Counter()  # failures that forced a replay, by exception type
        self._failures = 0  # in a row; sets the back-off
        self.checkpoint_seconds = 0.0  # spent in checkpoint(), in total
        self.observed = JoinerMetrics(self)
        self.metrics = self.observed.registry

    def _partitions(self) -> int:
        """The input topics' (equal) partition count, read from the broker."""
        k = self.cfg.kafka
        counts = {t: self.source.partition_count(t) for t in self.topic_of.values()}
        if len(set(counts.values())) != 1:
            raise ValueError(
                f"joiner: the input topics have different partition counts {counts}; a user's events "
                "must share a partition number: give the input topics the same count"
            )
        n = next(iter(counts.values()))
        examples = self.source.partition_count(k.examples_topic)
        if examples != n:
            raise ValueError(
                f"joiner: the examples topic {k.examples_topic!r} has {examples} partitions, the input "
                f"topics {n}: partition p's examples go to partition p; give it {n} partitions"
            )
        return n

    # -- tasks -----------------------------------------------------------------------------------
    def _task(self, partition: int) -> PartitionTask:
        task = self.tasks.get(partition)
        if task is None:
            task, offsets = self.states.open(partition)
            if offsets is not None:  # start exactly where its state stopped
                self.source.seek({f"{self.topic_of[kind]}:{partition}": off for kind, off in offsets.items()})
            self.tasks[partition] = task
        return task

    def _on_revoke(self) -> None:
        """A rebalance rewound the source: drop every task; they reopen from the changelog."""
        log.info("joiner: partitions moved; tasks reopen from the changelog")
        self.tasks.clear()

    def _at_end(self, kind: str, partition: int, now: float) -> bool:
        """Has this process read all of ``kind``'s partition?"""
        return self.source.read_to_end(f"{self.topic_of[kind]}:{partition}", now)

    # -- main loop -------------------------------------------------------------------------------
    def run(self, max_idle_s: float | None = None) -> dict[str, int]:
        """Run until SIGTERM/SIGINT, or (tests, backfills) until caught up, ``max_idle_s`` idle and no
        event held in a task's merge (it waits ``daemon.idle_merge_s`` for the other streams)."""

        def stop(*_: Any) -> None:
            systemd.stopping("joiner: stopping: flush, checkpoint, commit")
            self.source.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        last_ckpt = last_input = time.monotonic()
        every_s, max_share = (
            self.cfg.daemon.checkpoint_every_s,
            max(self.cfg.daemon.checkpoint_max_share, 1e-3),
        )
        tune_gc(self.cfg.daemon.gc_gen0_threshold)  # this process is the daemon's (as the signals)
        # consumer created, topics ensured, Feast store open: ready (systemd's Type=notify)
        if self.cfg.daemon.joiner_metrics_port:
            serve_metrics(self.metrics, self.cfg.daemon.metrics_host, self.cfg.daemon.joiner_metrics_port)
        systemd.ready("joiner: consuming")
        try:
            for batch in self.source.batches():
                systemd.watchdog()  # a poll returns every poll_timeout_ms even without input
                now = time.monotonic()
                try:
                    if batch:
                        last_input = now
                        self._process(batch)
                    for task in self.tasks.values():
                        task.run(now, functools.partial(self._at_end, partition=task.partition, now=now))
                        self._emit(task)
                    if now - last_ckpt >= every_s:
                        started = time.monotonic()
                        self.checkpoint()
                        last_ckpt = now = time.monotonic()
                        self._failures = 0
                        # A checkpoint writes one record per user and item touched since the last
                        # one (tens of microseconds each in kafka-python): when they take long, space
                        # them out (fewer, merged changes) to at most checkpoint_max_share of the time.
                        every_s = max(self.cfg.daemon.checkpoint_every_s, (now - started) / max_share)
                except OUTAGES as exc:  # Kafka or Redis away: replay from the checkpoint once back
                    self._outage(exc)
                    last_ckpt = last_input = time.monotonic()
                    continue
                idle = max_idle_s is not None and now - last_input >= max_idle_s
                if idle and not any(t.buffered for t in self.tasks.values()) and caught_up(self.source):
                    break
        finally:
            try:
                if not self.source.fenced:  # a fenced joiner's partitions are another process's now
                    self.checkpoint()  # a clean stop leaves nothing to replay
            except OUTAGES as exc:
                log.warning(
                    "joiner: the last checkpoint failed (%s); a restart replays from the one before", exc
                )
            self.source.close()
            self.examples.close()
            self.dead.close()
            self.states.close()
        return self.counters

    def _outage(self, exc: BaseException) -> None:
        """A write failed: drop what is not durable, rewind to the checkpoints, wait, then replay.

        The tasks are deterministic and every output idempotent (examples byte-identical, features
        not newer are ignored), so the replay loses and duplicates nothing; back-off 1, 2, 4 ... 30 s.
        """
        self._failures += 1
        delay = min(30.0, 2.0 ** (self._failures - 1))
        what = type(exc).__name__
        self.outages[what] += 1
        log.warning(
            "joiner: %s: %s; replaying from the last checkpoint in %.0f s (failure %d in a row)",
            *(what, str(exc)[:200], delay, self._failures),
        )
        self.examples.discard()
        self.dead.discard()
        self.states.changelog.reset()
        self.tasks.clear()  # they reopen from the changelog, seeking to their committed offsets
        try:
            self.source.rewind({})  # every owned partition back to its last commit
        except Exception:  # the consumer itself is unusable: let systemd restart us from the files
            log.exception("joiner: cannot rewind the consumer")
            raise
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:  # keep feeding the watchdog while waiting
            systemd.watchdog()
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def _process(self, batch: list[RawEvent]) -> None:
        self.counters["events"] += len(batch)
        for raw in batch:
            event = self.validator.validate(raw)
            task = self._task(raw.partition)
            if isinstance(event, DeadLetter):
                self._dead_letter(event)
                task.offer(raw.kind, raw.offset, None)
            else:
                task.offer(raw.kind, raw.offset, event)
        self.alarm.observe(len(batch))

    def _dead_letter(self, letter: DeadLetter) -> None:
        self.dead.write(letter)
        self.counters["dead_letters"] += 1
        self.dead_reasons[letter.reason] += 1
        self.alarm.letter(letter)

    def _emit(self, task: PartitionTask) -> None:
        drained = [ex.to_json() for ex in task.drain()]  # task p's, in its order (see example_merge)
        for value in example_records.records(drained, self.cfg.kafka.examples_per_record):
            self.examples.send(None, value, partition=task.partition)  # on partition p
        self.counters["examples"] += len(drained)
        for rej in task.joiner.drain_rejected():
            raw = RawEvent(kind_of(rej.event), rej.event.to_dict(), "joiner", task.partition)
            self._dead_letter(self.validator.dead_letter(raw, rej.reason, rej.detail))

    def checkpoint(self) -> None:
        """Make everything durable, in the order that makes a crash at any point harmless."""
        started = time.monotonic()
        try:  # fresh lag for /metrics (the metrics thread must not touch the consumer itself)
            self.observed.lag = self.source.lag()  # its own field: _at_end's cache stays as it was
        except Exception:
            log.debug("joiner: lag unavailable for metrics", exc_info=True)
        with self.observed.phase("flush"):
            self.examples.flush(timeout_s=_FLUSH_TIMEOUT_S)
            self.dead.flush(timeout_s=_FLUSH_TIMEOUT_S)
        users = changed_user_rows(self.tasks.values())  # one push: Feast's cost is mostly per call
        with self.observed.phase("features"):
            self.features.push(users, [])  # items: the ctr trainer's
        try:
            with self.observed.phase("state"):  # the changed state records and the offsets
                committed = self.states.checkpoint(self.tasks)
        except REBALANCING as exc:  # the transaction aborted: nothing of it is visible
            log.warning("joiner: the checkpoint was refused during a rebalance (%r); tasks reopen", exc)
            committed = None
        if committed is None:  # partitions moved under us: nothing written; reopen what we keep
            self.tasks.clear()
            self.source.rewind({})
        else:
            logs.set_context(offsets=committed)
            if self.tasks:
                log.info("joiner: checkpoint committed for partitions %s", sorted(self.tasks))
        self.counters["checkpoints"] += 1
        self.observed.update_rates()
        seconds = time.monotonic() - started
        self.checkpoint_seconds += seconds
        self.metrics.histogram("ctr_joiner_checkpoint_seconds", "", ()).observe(seconds)
        c = self.counters
        systemd.status(
            f"joiner: {c['events']} events, {c['examples']} examples, {c['dead_letters']} dead letters, "
            f"{len(self.tasks)} partitions"
        )
