"""The replay loop (``ctr demo``, ``ctr backtest``): source -> the daemon's partition tasks -> trainer.

Validation, the join and the streaming features are :class:`~pipeline.join.partitioned_join.PartitionedJoin`,
i.e. the joiner daemon's partition tasks fed as Kafka would feed them; the examples reach the
trainer in :class:`~pipeline.join.example_merge.ExampleMerge` order, through the item stage
(:mod:`features.item_stage`) as in ``ctr trainer``. The source, the dead-letter sink,
the feature writer, the model store and the fleet are injected adapters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from features.item_stage import ItemStage
from pipeline.core.config import Config
from pipeline.core.events import DeadLetter, LabelledExample
from pipeline.core.gc_tuning import tuned_gc
from pipeline.core.types import RawEvent, Source
from pipeline.join.partitioned_join import PartitionedJoin
from serving_bridge.online_offset import OffsetPublisher
from trainers.incremental import BlockReport, IncrementalTrainer

__all__ = ["LoopResult", "OnlineLoop"]


class DeadLetterSink(Protocol):
    def write(self, letter: DeadLetter) -> None: ...

    def flush(self) -> None: ...


class FeaturePusher(Protocol):
    def push(self, user_rows: Any, item_rows: Any) -> None: ...


class Notifier(Protocol):
    def notify(self) -> None: ...


@dataclass
class BlockTiming:
    """When a block's last example reached the trainer, and the version that block produced."""

    report: BlockReport
    completed_at: float  # wall time the block's last example was handed to the trainer


@dataclass
class LoopResult:
    events: int = 0
    dead_letters: int = 0
    examples: int = 0
    blocks: list[BlockTiming] = field(default_factory=list)
    join_stats: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


@dataclass
class OnlineLoop:
    """Runs a source to its end (or until stopped), training every ``train_every`` examples."""

    cfg: Config
    source: Source
    trainer: IncrementalTrainer
    dead_letters: DeadLetterSink
    feature_writer: FeaturePusher | None = None
    notifier: Notifier | None = None
    on_block: Callable[[BlockTiming], None] | None = None
    on_progress: Callable[[int], None] | None = None
    on_examples: Callable[[list[LabelledExample]], None] | None = None  # each batch of examples, in order
    offsets: OffsetPublisher | None = None  # the champion's online offset, to the replicas

    def __post_init__(self) -> None:
        # a file or seeded source can be read again from its start: the join's read-ahead
        read_again = getattr(self.source, "read_again", None)
        self.join = PartitionedJoin(self.cfg, self.source.clock, self.dead_letters, read_again)
        self.items = ItemStage.of(self.cfg)
        self.result = LoopResult()
        self._since_push = 0

    def run(self, flush_at_end: bool = True) -> LoopResult:
        start = time.perf_counter()
        with tuned_gc(self.cfg.daemon.gc_gen0_threshold):  # full collections cost a third of a replay
            for batch in self.source.batches():
                self.step(batch)
            self._hand_over(self.join.finish(flush=flush_at_end))
        self._push_features()
        self.result.dead_letters = self.join.dead_letters
        self.dead_letters.flush()
        self.result.join_stats = self.join.stats
        self.result.wall_s = time.perf_counter() - start
        return self.result

    def step(self, batch: list[RawEvent]) -> None:
        """One batch through every stage."""
        examples = self.join.step(batch)
        self.result.events += len(batch)
        self.result.dead_letters = self.join.dead_letters
        self._since_push += len(batch)
        if self._since_push >= self.cfg.features.push_every_events:
            self._push_features()
        self._hand_over(examples)
        if self.offsets is not None:
            self.offsets.maybe_publish(self.trainer)
        if self.on_progress is not None:
            self.on_progress(len(batch))

    def _push_features(self) -> None:
        self._since_push = 0
        if self.feature_writer is not None:  # users from the tasks, items from the item stage
            self.feature_writer.push(self.join.drain_features(), self.items.drain_rows())

    def _hand_over(self, examples: list[LabelledExample]) -> None:
        if not examples:
            return
        if self.on_examples is not None:
            self.on_examples(examples)  # as the joiner writes them to Kafka
        self.items.attach(examples)
        self.result.examples += len(examples)
        if any(ex.correction for ex in examples):  # corrections a click-only model does not learn
            examples = [ex for ex in examples if not self.trainer.skips(ex)]
        position = self.source.snapshot()
        while examples:
            # hand over at most one block per call, so each block's clock starts when *it* is full
            cut = self.trainer.cut(examples)
            chunk, examples = examples[:cut], examples[cut:]
            handed_at = time.time()
            for report in self.trainer.add(chunk, position=position):
                timing = BlockTiming(report, handed_at)
                self.result.blocks.append(timing)
                if report.version is not None and self.notifier is not None:
                    self.notifier.notify()
                if self.on_block is not None:
                    self.on_block(timing)
