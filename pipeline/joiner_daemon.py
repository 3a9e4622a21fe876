"""`ctr joiner`: impressions + clicks from Kafka -> labelled examples on Kafka + features in Feast.

One :class:`~pipeline.partition_task.PartitionTask` per assigned partition number. Every
``daemon.checkpoint_every_s``:

1. flush the producers (examples and dead letters acknowledged by Kafka),
2. push the changed features to the Feast online store (Redis),
3. write each task's checkpoint (joiner + features state and the offsets it has processed),
4. commit exactly those offsets to the consumer group.

A crash anywhere replays from the last checkpoint; the tasks are deterministic, so the replay
re-sends byte-identical examples (the trainer drops them by example id) and re-pushes identical
features (Redis drops rows that are not newer). Nothing is lost, nothing counts twice.
"""

from __future__ import annotations

import functools
import logging
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kafka.errors import CommitFailedError

from features.aggregations import FeatureRow
from features.store import FeatureWriter, open_store
from pipeline import logs, systemd
from pipeline.checkpoints import read_json, write_json
from pipeline.config import Config
from pipeline.events import DeadLetter, Validator
from pipeline.kafka_io import KafkaEventSource, KafkaSink, caught_up, ensure_topics
from pipeline.metrics import Registry, export_consumer_state, serve_metrics
from pipeline.partition_task import PartitionTask
from pipeline.types import RawEvent, WallClock

__all__ = ["JoinerDaemon"]

log = logging.getLogger(__name__)


class JoinerDaemon:
    def __init__(self, cfg: Config, feature_dir: Path | None = None) -> None:
        self.cfg = cfg
        k = cfg.kafka
        ensure_topics(cfg.kafka, [k.impressions_topic, k.clicks_topic, k.examples_topic], k.partitions)
        ensure_topics(cfg.kafka, [k.dead_letter_topic], 1)
        self.state_dir = Path(cfg.daemon.state_dir).expanduser() / "joiner"
        self.topic_of = {"impression": k.impressions_topic, "click": k.clicks_topic}
        self.source = KafkaEventSource(
            k,
            {k.impressions_topic: "impression", k.clicks_topic: "click"},
            group_id=f"{k.group_id_prefix}-joiner",
            on_revoke=self._on_revoke,
        )
        self.examples = KafkaSink(k, k.examples_topic)
        self.dead = KafkaSink(k, k.dead_letter_topic)
        self.validator = Validator(cfg.validation, WallClock())
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
        self._lag: dict[str, int] = {}
        self._lag_at = 0.0
        self._metric_lag: dict[str, int] = {}  # per partition, refreshed at each checkpoint
        self.dead_reasons: Counter[str] = Counter()
        self.metrics = Registry()
        self.metrics.on_scrape(self._collect_metrics)

    # -- tasks -----------------------------------------------------------------------------------
    def _task(self, partition: int) -> PartitionTask:
        task = self.tasks.get(partition)
        if task is None:
            task = PartitionTask(self.cfg, partition, idle_s=self.cfg.daemon.idle_merge_s)
            state = read_json(self.state_dir / f"p{partition}.json")
            if state is not None:
                task.load_state(state, self.cfg)
                # start exactly where the checkpoint stopped (the group's commit may lag it)
                self.source.seek(
                    {f"{self.topic_of[kind]}:{partition}": off for kind, off in state["next_offsets"].items()}
                )
            self.tasks[partition] = task
            log.info("joiner: task for partition %d %s", partition, "resumed" if state else "started")
        return task

    def _on_revoke(self) -> None:
        """A rebalance rewound the source: drop every task; they reload from their checkpoints."""
        log.info("joiner: partitions moved; tasks reload from their checkpoints")
        self.tasks.clear()

    def _at_end(self, kind: str, partition: int, now: float) -> bool:
        """Has this process read all of ``kind``'s partition? (lag cached for half a second)"""
        if now - self._lag_at > 0.5:
            try:
                self._lag = self.source.lag()
            except Exception:  # no answer from the broker: assume a backlog, i.e. keep waiting
                self._lag = {}
            self._lag_at = now
        return self._lag.get(f"{self.topic_of[kind]}:{partition}", 1) == 0

    # -- main loop -------------------------------------------------------------------------------
    def run(self, max_idle_s: float | None = None) -> dict[str, int]:
        """Run until SIGTERM/SIGINT, or (tests, backfills) until caught up and ``max_idle_s`` idle."""

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
        # consumer created, topics ensured, Feast store open: ready (systemd's Type=notify)
        if self.cfg.daemon.joiner_metrics_port:
            serve_metrics(self.metrics, self.cfg.daemon.metrics_host, self.cfg.daemon.joiner_metrics_port)
        systemd.ready("joiner: consuming")
        try:
            for batch in self.source.batches():
                systemd.watchdog()  # a poll returns every poll_timeout_ms even without input
                now = time.monotonic()
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
                    # A checkpoint writes the whole state (all pending impressions and counters), so
                    # its cost grows with the state, not with the input since the last one: space
                    # them out so that they take at most checkpoint_max_share of the time.
                    every_s = max(self.cfg.daemon.checkpoint_every_s, (now - started) / max_share)
                if max_idle_s is not None and now - last_input >= max_idle_s and caught_up(self.source):
                    break
        finally:
            self.checkpoint()  # a clean stop leaves nothing to replay
            self.source.close()
            self.examples.close()
            self.dead.close()
        return self.counters

    def _process(self, batch: list[RawEvent]) -> None:
        self.counters["events"] += len(batch)
        for raw in batch:
            event = self.validator.validate(raw)
            task = self._task(raw.partition)
            if isinstance(event, DeadLetter):
                self.dead.write(event)
                self.counters["dead_letters"] += 1
                self.dead_reasons[event.reason] += 1
                task.offer(raw.kind, raw.offset, None)
            else:
                task.offer(raw.kind, raw.offset, event)

    def _emit(self, task: PartitionTask) -> None:
        for ex in task.drain():
            self.examples.send(ex.impression.user_id.encode(), ex.to_json())
            self.counters["examples"] += 1
        for rej in task.joiner.drain_rejected():
            raw = RawEvent("click", rej.click.to_dict(), "joiner", task.partition)
            self.dead.write(self.validator.dead_letter(raw, rej.reason, rej.detail))
            self.counters["dead_letters"] += 1
            self.dead_reasons[rej.reason] += 1

    def checkpoint(self) -> None:
        """Make everything durable, in the order that makes a crash at any point harmless."""
        started = time.monotonic()
        try:  # fresh lag for /metrics (the metrics thread must not touch the consumer itself)
            self._metric_lag = self.source.lag()  # its own field: _at_end's cache stays as it was
        except Exception:
            log.debug("joiner: lag unavailable for metrics", exc_info=True)
        self.examples.flush()
        self.dead.flush()
        commit: dict[str, Any] = {}
        users: list[FeatureRow] = []
        items: list[FeatureRow] = []
        for task in self.tasks.values():  # one push for all partitions: Feast's cost is mostly per call
            u, i = task.features.drain_dirty()  # (keys never collide: a user lives in one partition,
            users += u  # and item keys carry their shard)
            items += i
        self.features.push(users, items)
        for p, task in sorted(self.tasks.items()):
            state = task.to_state()
            write_json(self.state_dir / f"p{p}.json", state)
            for kind, off in state["next_offsets"].items():
                commit[f"{self.topic_of[kind]}:{p}"] = off
        logs.set_context(offsets=commit)
        if commit:
            try:
                self.source.commit(commit)
            except CommitFailedError:  # a rebalance is under way: the checkpoint files still hold
                log.warning("joiner: offset commit refused during a rebalance; checkpoints kept")
        self.counters["checkpoints"] += 1
        self.metrics.histogram(
            "ctr_joiner_checkpoint_seconds",
            "flush + feature push + checkpoint + commit",
            (0.1, 0.5, 1, 2, 5, 10, 30),
        ).observe(time.monotonic() - started)
        c = self.counters
        systemd.status(
            f"joiner: {c['events']} events, {c['examples']} examples, {c['dead_letters']} dead letters, "
            f"{len(self.tasks)} partitions"
        )

    def _collect_metrics(self) -> None:
        """Scrape time (metrics thread): read the counters and the lag the last checkpoint measured."""
        m, c = self.metrics, self.counters
        m.counter("ctr_joiner_events_total", "raw impressions and clicks read").set(c["events"])
        m.counter("ctr_joiner_examples_total", "labelled examples produced").set(c["examples"])
        m.counter("ctr_joiner_checkpoints_total", "checkpoints (durable output + commit)").set(
            c["checkpoints"]
        )
        export_consumer_state(m, "joiner", self._metric_lag, self.dead_reasons)
        m.gauge("ctr_joiner_partitions", "partition tasks held").set(len(self.tasks))
