"""`ctr trainer`: labelled examples from Kafka -> a fine-tuned model every N -> MLflow versions.

Exactly-once effect:

- each example's position (record offset and line, :mod:`pipeline.kafka.example_records`) is tracked per
  ``topic:partition``; a block closes on an exact position, and that position, the champion (weights *and*
  optimizer state), the ids seen so far (dedup of the joiner's replays) and the item stage
  (:mod:`pipeline.daemons.trainer_items`) are checkpointed together, then the offsets are committed;
- a block that passes the gate is checkpointed as *pending* **before** it is registered, and the
  registration is idempotent (a version whose lineage key matches is reused), so a crash between the two (or
  an MLflow server that is down) ends in exactly one version once it is back;
- on restart the trainer seeks to the checkpoint's offsets and re-reads what came after it.

Blocks are cut in :class:`~pipeline.join.example_merge.ExampleMerge` order (the joiner writes partition task
p's examples to partition p): an example is taken only when every partition has one buffered or is idle
(silent ``daemon.idle_merge_s`` and read to its end), so the blocks, like ``ctr backtest``'s of the same
stream, do not depend on how the partitions' fetches interleaved. After moving the alias, the trainer
announces it on Redis so replicas swap without waiting for a poll; while a block fills, it writes
the champion's online offset there every second (:mod:`serving_bridge.online_offset`).
"""

from __future__ import annotations

import functools
import logging
import shutil
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kafka.errors import KafkaError

from pipeline.core import gc_tuning, logs, systemd
from pipeline.core.checkpoints import read_json, replace_dir, write_json
from pipeline.core.config import Config
from pipeline.core.events import LabelledExample
from pipeline.core.metrics import Registry, export_consumer_state, serve_metrics
from pipeline.daemons.idempotent_store import IdempotentStore
from pipeline.daemons.seen_ids import SeenIds
from pipeline.daemons.trainer_items import TrainerItems
from pipeline.daemons.trainer_metrics import collect, record_block
from pipeline.daemons.trainer_metrics import declare as declare_metrics
from pipeline.daemons.trainer_ranks import Leader
from pipeline.join.example_merge import ExampleMerge
from pipeline.kafka.example_records import from_offsets, kafka_offsets, lineage
from pipeline.kafka.io import KafkaSink, caught_up, ensure_topics
from pipeline.kafka.sources import KafkaExampleSource
from serving_bridge.online_offset import OffsetPublisher, RedisOffsets, offset_key
from serving_bridge.server import announce_swap
from trainers.ab_publish import publish_quietly
from trainers.ab_readout import ABReadout
from trainers.alias_guard import move_alias_unless_moved
from trainers.incremental import IncrementalTrainer
from trainers.learner import TorchLearner
from trainers.registry import MlflowModelStore

__all__ = ["TrainerDaemon"]

log = logging.getLogger(__name__)


class TrainerDaemon:
    def __init__(self, cfg: Config, *, ranked: bool = False) -> None:
        """``ranked``: rank 0 of several (torchrun): the others follow it (trainer_ranks.py)."""
        if not cfg.registry.tracking_uri:
            raise ValueError(
                "ctr trainer needs an MLflow server: set CTR_REGISTRY_TRACKING_URI "
                "(e.g. http://127.0.0.1:15000; `make services-up` starts one)"
            )
        self.cfg = cfg
        self.stopping = False
        self.registry_failures: Counter[str] = Counter()  # MLflow calls retried, by what they were
        k = cfg.kafka
        ensure_topics(k, [k.examples_topic], k.partitions)
        ensure_topics(k, [k.dead_letter_topic], 1)
        self.dir = Path(cfg.daemon.state_dir).expanduser() / "trainer"
        self.store = IdempotentStore(MlflowModelStore(cfg.registry, cfg.registry.tracking_uri), self)
        self.leader = Leader(self.dir / ".ranks") if ranked else None
        meta = read_json(self.dir / "meta.json") or {}
        champion = None
        if meta.get("champion_version") is not None or meta.get("pending"):
            champion = TorchLearner.load(self.dir / "learner")
            champion.version = meta.get("champion_version")
        store = self.store if self.leader is None else self.leader.store(self.store)
        self.trainer = IncrementalTrainer(
            cfg.trainer, store, alias=cfg.registry.champion_alias, champion=champion, resume=False,
            label_delay_ms=cfg.joiner.label_delay_ms, serves_offset=True,
        )  # fmt: skip
        self.trainer.blocks = meta.get("blocks", 0)
        self.pos: dict[str, int] = meta.get("positions") or from_offsets(meta.get("offsets", {}))
        self._closing_pos: dict[str, int] = {}
        self.block_closed_at = 0.0  # wall time the last block's last example was read
        self.seen = SeenIds(cfg.joiner, meta.get("seen"))
        self.items = TrainerItems(cfg, self.dir / "feast", meta.get("items"))  # global item features
        self.ab = ABReadout.from_dict(meta.get("ab", {}))  # per served version, checkpointed with the offsets
        board = RedisOffsets(cfg.daemon.redis_url, offset_key(cfg.features.project, cfg.registry.model_name))
        self.online_offset = OffsetPublisher(board)  # the champion's, to the replicas, while a block fills
        self.counters = {"examples": 0, "duplicates": 0, "dead_letters": 0, "blocks": self.trainer.blocks}
        self.source = KafkaExampleSource(
            k, group_id=f"{k.group_id_prefix}-trainer", on_revoke=self._on_revoke
        )
        self.source.seek(kafka_offsets(self.pos))
        self.merge = ExampleMerge(self.source.partition_count(self.source.topic))
        self._offered: dict[str, int] = {}  # per partition, positions below this are in the merge already
        self._arrived: dict[int, float] = {}  # per partition, when an example last arrived
        self.dead = KafkaSink(k, k.dead_letter_topic)
        self.metrics = declare_metrics(Registry())
        self.metrics.on_scrape(self._collect_metrics)
        self._metric_lag: dict[str, int] = {}  # per partition, measured after each block
        self.dead_reasons: Counter[str] = Counter()
        if meta.get("pending"):
            self._finish_pending(meta["pending"])
        if self.leader is not None:
            self.leader.start(self.dir / "learner" if champion is not None else None, self.trainer)

    # -- checkpoints -----------------------------------------------------------------------------
    def _meta(self, **extra: Any) -> dict[str, Any]:
        return {
            "positions": self.pos,
            "seen": self.seen.ids,
            "blocks": self.trainer.blocks,
            "champion_version": self.trainer.champion_version,
            "ab": self.ab.to_dict(),
            "items": self.items.to_state(),
            **extra,
        }

    def save_pending(
        self, model: TorchLearner, lineage: dict[str, Any], metrics: dict[str, float], key: str
    ) -> None:
        """Before registering: the accepted candidate and where its block ended, durably."""
        self._save_learner(model)
        pending = {"lineage": {**lineage, "lineage_key": key}, "metrics": metrics}
        meta = self._meta(pending=pending)
        meta["positions"] = dict(self._closing_pos)  # the block's end, not what was read after it
        meta["champion_version"] = None
        write_json(self.dir / "meta.json", meta)

    def _save_learner(self, model: TorchLearner) -> None:
        tmp = self.dir / ".learner.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        model.save(tmp, optimizer=True)
        replace_dir(tmp, self.dir / "learner")

    def _finish_pending(self, pending: dict[str, Any]) -> None:
        champion = self.trainer.champion
        assert champion is not None
        # ranked: the checkpoint is the whole model, registered as it is
        whole = champion if self.leader is None else TorchLearner.load(self.dir / "learner", shard=False)
        version = self.store.register(whole, pending["lineage"], pending["metrics"])
        parent = pending["lineage"].get("parent_version")
        parent = None if parent in (None, "none") else str(parent)
        # gated against its parent: a rollback since then keeps the alias (the next block adopts it)
        move_alias_unless_moved(self.store, self.cfg.registry.champion_alias, version, parent)
        champion.version = version
        self.trainer.has_champion = True
        write_json(self.dir / "meta.json", self._meta())
        announce_swap(self.cfg.daemon.redis_url, "trainer")
        log.info("trainer: finished the pending registration: version %s", version)

    # -- main loop -------------------------------------------------------------------------------
    def run(self, max_idle_s: float | None = None) -> dict[str, int]:
        def stop(*_: Any) -> None:
            systemd.stopping("trainer: stopping after the current batch")
            self.stopping = True
            self.source.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        last_input = time.monotonic()
        block_from = dict(self.pos)
        gc_tuning.tune_gc(self.cfg.daemon.gc_gen0_threshold)  # start-up objects frozen, as the joiner
        # MLflow reached, checkpoint loaded, a pending registration finished, consumer created
        if self.cfg.daemon.trainer_metrics_port:
            serve_metrics(self.metrics, self.cfg.daemon.metrics_host, self.cfg.daemon.trainer_metrics_port)
        systemd.ready(f"trainer: consuming; champion {self.trainer.champion_version}")
        try:
            for batch in self.source.batches():
                systemd.watchdog()  # training a block happens inside one iteration: WatchdogSec covers it
                now = time.monotonic()
                last_input = now if batch.examples or batch.dead else last_input
                for letter in batch.dead:
                    self.dead.write(letter)
                    self.counters["dead_letters"] += 1
                    self.dead_reasons[letter.reason] += 1
                self._offer(batch.examples, batch.where, now)
                fresh: list[LabelledExample] = []  # handed to the trainer a block boundary at a time
                clicks = 0
                for ex, p, after in self.merge.pop_tagged(functools.partial(self._idle, now=now)):
                    self.pos[f"{self.source.topic}:{p}"] = after
                    if not self.seen.take(ex):
                        self.counters["duplicates"] += 1  # the joiner replayed it after a restart
                        continue
                    self.counters["examples"] += 1
                    if not ex.correction:  # the click readout: a correction repeats a click
                        self.ab.add(ex.impression.model_version, ex.label, ex.impression.score)
                    self.items.attach(ex)  # global item features, in merge order
                    if self.trainer.skips(ex):  # a correction, the model no conversion learner
                        continue
                    fresh.append(ex)
                    clicks += not ex.correction  # what a block counts (trainer.needed)
                    if not ex.correction and clicks == self.trainer.needed:  # ex closes a block: exactly here
                        self._closing_pos = dict(self.pos)
                        self.block_closed_at = time.time()  # lineage tag: freshness starts here
                        for report in self._add(fresh, lineage(block_from, self.pos)):
                            self._block_done(report)
                        block_from, fresh, clicks = dict(self.pos), [], 0
                self._add(fresh)  # fewer than a block: buffered (and encoded) now
                if batch.dead:
                    self.dead.flush()
                self.items.push(now)
                self.online_offset.maybe_publish(self.trainer)
                idle = max_idle_s is not None and now - last_input >= max_idle_s and not self.merge.buffered
                if idle and caught_up(self.source):
                    break
        finally:
            self.items.push(time.monotonic(), force=True)  # a failed push is logged, never raised
            self.online_offset.maybe_publish(self.trainer, force=True)  # the same
            self.source.close()
            self.dead.close()
            if self.leader is not None:
                self.leader.stop()
        return self.counters

    def _add(self, examples: list[LabelledExample], position: Any = None) -> list[Any]:
        if self.leader is not None and (examples or position is not None):
            self.leader.add(examples, position)  # the other ranks learn the same, in step
        return self.trainer.add(examples, position=position)

    def _offer(self, examples: list[LabelledExample], where: list[tuple[str, int, int]], now: float) -> None:
        """Queue a poll's examples in the merge, each partition's in its order, each position once."""
        by_partition: dict[int, tuple[list[LabelledExample], list[int]]] = {}
        for ex, (tp, at, after) in zip(examples, where, strict=True):
            if at < max(self.pos.get(tp, 0), self._offered.get(tp, 0)):
                continue  # before our checkpoint, or queued already: a rewind re-delivered it
            self._offered[tp] = after
            p = int(tp.rsplit(":", 1)[1])
            exs, afters = by_partition.setdefault(p, ([], []))
            exs.append(ex)
            afters.append(after)
            self._arrived[p] = now
        for p, (exs, afters) in by_partition.items():
            self.merge.offer(p, exs, afters)

    def _idle(self, partition: int, now: float) -> bool:
        """Nothing more from ``partition`` for now: silent ``idle_merge_s`` and read to its end."""
        if now - self._arrived.get(partition, 0.0) < self.cfg.daemon.idle_merge_s:
            return False
        return self.source.read_to_end(f"{self.source.topic}:{partition}", now)

    def _on_revoke(self) -> None:
        """A rebalance rewound the source to the commits: what the merge holds is read again."""
        self.merge.clear()
        self._offered.clear()

    def _block_done(self, report: Any) -> None:
        if report.alias_moved:
            announce_swap(self.cfg.daemon.redis_url, "trainer")  # first: replicas load it while we checkpoint
        self.counters["blocks"] += 1
        if report.adopted_version is not None and report.version is None:
            # the rolled-back champion is now the one we fine-tune: checkpoint its weights with its
            # version (an accepted block's candidate was checkpointed by save_pending already)
            assert self.trainer.champion is not None
            self._save_learner(self.trainer.champion)
        self.seen.prune(report.event_time_max)
        write_json(self.dir / "meta.json", self._meta())
        try:
            self.source.commit(kafka_offsets(self.pos))
        except KafkaError as exc:  # broker away: harmless, meta.json holds the offsets a restart seeks to
            log.warning("trainer: offset commit failed (%s); the checkpoint holds, next commit retries", exc)
        log.log(  # a refusal is an operator's business: WARNING, with the gate's reason
            logging.INFO if report.decision.accepted else logging.WARNING,
            "trainer: block %d %s (version %s): %s",
            report.index,
            "accepted" if report.decision.accepted else "refused",
            report.version,
            report.decision.reason,
        )
        self._block_metrics(report)
        publish_quietly(self.store.inner, self.ab, report.index)  # on each served version's run
        logs.set_context(version=self.trainer.champion_version, offsets=kafka_offsets(self.pos))
        systemd.status(
            f"trainer: block {report.index} {'accepted' if report.decision.accepted else 'refused'}; "
            f"champion {self.trainer.champion_version}; {self.counters['examples']} examples"
        )

    # -- metrics ---------------------------------------------------------------------------------
    def _block_metrics(self, report: Any) -> None:
        record_block(self.metrics, report)
        try:  # measured here, on the main thread: the metrics thread must not touch the consumer
            self._metric_lag = self.source.lag()
        except Exception:
            log.debug("trainer: lag unavailable for metrics", exc_info=True)

    def _collect_metrics(self) -> None:
        collect(self.metrics, self.counters, self.trainer.champion_version, self.registry_failures)
        export_consumer_state(self.metrics, "trainer", self._metric_lag, self.dead_reasons)
